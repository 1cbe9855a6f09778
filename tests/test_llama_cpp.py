"""llama.cpp on the course model's GGUF export: its float32 logits and greedy tokens against ours.

Needs llama-cpp-python (requirements-ci.txt: it builds llama.cpp from source); skipped without it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.data import validation_documents
from helpers.export_gguf import write_gguf
from helpers.generate import generate

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: pip install -r "
                                "requirements-ci.txt (it compiles llama.cpp, several minutes)")


@pytest.fixture(scope="module")
def exported(shipped, tmp_path_factory):
    target, _, tok = shipped
    path = write_gguf(target, tok, tmp_path_factory.mktemp("gguf") / "target-f32.gguf", "f32", name="target")
    # llama.cpp keeps its KV cache in float16 unless told otherwise; ours is float32
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=1, n_threads_batch=1,
                          logits_all=True, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
                          verbose=False)
    return target, tok, llm


def test_f32_logits_match_ours(exported):
    target, tok, llm = exported
    ids = tok.encode(validation_documents()[3][:1500], bos=True)[:200]
    llm.reset()
    llm.eval(ids)
    theirs = np.asarray(llm.scores[:len(ids)], dtype=np.float32)  # (T, V)
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
    assert theirs == generate(target, prompt, 200)[0, len(prompt):].tolist()
