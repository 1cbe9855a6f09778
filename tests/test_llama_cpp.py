"""llama.cpp on the course model's GGUF export: its float32 logits and greedy tokens against ours.

Needs llama-cpp-python (requirements-ci.txt: it builds llama.cpp from source); skipped without it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.bench.llama_cpp import llama_greedy, open_llama
from helpers.data import validation_documents
from helpers.export_gguf import quantize_gguf, write_gguf
from helpers.generate import generate

llama_cpp = pytest.importorskip(
    "llama_cpp",
    reason="llama-cpp-python is not installed: pip install -r "
    "requirements-ci.txt (it compiles llama.cpp, several minutes)",
)


# top-1 agreement with our fp32 logits over the test's 200 positions, measured on an AVX-512 machine: q8_0 99.5%,
# q4_0 89.5%; the bounds leave room for other CPUs' kernels (llama.cpp's quantized dot products differ per ISA)
Q8_AGREEMENT, Q4_AGREEMENT = 0.97, 0.80
Q8_GREEDY = 16  # q8_0's first greedy tokens that must equal ours


@pytest.fixture(scope="module")
def exported(shipped, tmp_path_factory):
    target, _, tok = shipped
    path = write_gguf(target, tok, tmp_path_factory.mktemp("gguf") / "target-f32.gguf", "f32", name="target")
    # llama.cpp keeps its KV cache in float16 unless told otherwise; ours is float32
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=512,
        n_batch=512,
        n_threads=1,
        n_threads_batch=1,
        logits_all=True,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        verbose=False,
    )
    return target, tok, llm


def test_f32_logits_match_ours(exported):
    target, tok, llm = exported
    ids = tok.encode(validation_documents()[3][:1500], bos=True)[:200]
    llm.reset()
    llm.eval(ids)
    theirs = np.asarray(llm.scores[: len(ids)], dtype=np.float32)  # (T, V)
    with torch.no_grad():
        ours = target(torch.tensor([ids]))[0].numpy()  # (T, V)
    # both are float32 end to end; the kernels sum in different orders, so agreement is to rounding
    err = np.abs(theirs - ours).max() / np.abs(ours).max()
    print(f"largest logit difference / largest logit: {err:.1e}")
    assert err < 1e-5
    assert (theirs.argmax(-1) == ours.argmax(-1)).all()


def test_greedy_tokens_match_ours(exported):
    target, tok, llm = exported
    prompt = tok.encode("def main():\n", bos=True)
    theirs = []
    for t in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        theirs.append(int(t))
        if len(theirs) == 200:
            break
    assert theirs == generate(target, prompt, 200)[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def quantized(shipped, tmp_path_factory):
    """The f32 export, and q8_0 / q4_0 files built from it by llama.cpp's own quantizer."""
    target, _, tok = shipped
    folder = tmp_path_factory.mktemp("gguf-quantized")
    f32 = write_gguf(target, tok, folder / "target-f32.gguf", "f32", name="target")
    paths = {"f32": f32, **{t: quantize_gguf(f32, folder / f"target-{t}.gguf", t, threads=1) for t in ("q8_0", "q4_0")}}
    return target, tok, paths


def test_llama_cpp_quantizer_builds_smaller_files(quantized):
    _, _, paths = quantized
    size = {t: p.stat().st_size for t, p in paths.items()}
    # q8_0 stores 8.5 bits per weight (a 16-bit scale per 32), q4_0 4.5; llama.cpp may keep the tied embedding
    # wider, and the vocabulary and norms are the same in every file, so the ratios are bounds, not equalities
    assert size["q8_0"] < 0.4 * size["f32"]
    assert size["q4_0"] < 0.75 * size["q8_0"]
    with pytest.raises(ValueError, match="file_type"):
        quantize_gguf(paths["f32"], paths["f32"].with_name("x.gguf"), "q5_k")


@pytest.mark.parametrize("file_type, agreement", [("q8_0", Q8_AGREEMENT), ("q4_0", Q4_AGREEMENT)])
def test_quantized_files_agree_with_our_fp32(quantized, file_type, agreement):
    """Top-1 agreement of llama.cpp's quantized logits with our float32 ones on held-out text, and (q8_0) its
    first greedy tokens equal ours."""
    target, tok, paths = quantized
    ids = tok.encode(validation_documents()[3][:1500], bos=True)[:200]
    llm = open_llama(paths[file_type], 256, logits_all=True)
    llm.reset()
    llm.eval(ids)
    theirs = np.asarray(llm.scores[: len(ids)], dtype=np.float32).argmax(-1)  # (T,)
    with torch.no_grad():
        ours = target(torch.tensor([ids]))[0].argmax(-1).numpy()  # (T,)
    measured = float((theirs == ours).mean())
    print(f"{file_type}: top-1 agreement with our fp32 {measured:.1%}")
    assert measured >= agreement
    if file_type == "q8_0":
        prompt = tok.encode("def main():\n", bos=True)
        assert llama_greedy(llm, prompt, Q8_GREEDY) == generate(target, prompt, Q8_GREEDY)[0, len(prompt) :].tolist()
