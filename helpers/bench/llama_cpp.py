"""Rows against llama.cpp on the same weights, in every format: decode, 512-token prefill, and quality.

The course model (and the bench's random-weight config) is exported to GGUF f32 and f16; llama.cpp's own
quantizer builds q8_0 and q4_0 from the f32 file (export_gguf.quantize_gguf), as a llama.cpp user would.
Each of our formats is paired with the llama.cpp format of the same bits per weight:

    ours                                        llama.cpp
    fp32, compiled step (FastGenerator)         f32
    fp16 weights, fp32 arithmetic, compiled     f16    (the same 16-bit values: the checkpoint is f16-exact)
    int8 weight-only, one scale per row         q8_0   (8 bits + a 16-bit scale per 32 weights)
    int4 weight-only, group 64, scale + zero    q4_0   (4 bits + a 16-bit scale per 32 weights)
    int4 as above, activations rounded to int8  q4_0   (which rounds its activations to q8_0 likewise): the
      per group of 64 (kernel "dynamic")              bench's fifth format, where the C++ kernel builds

Both engines run with the same number of threads, greedy, same prompt and token count, a float32 KV cache
on both sides, interleaved (theirs, ours, theirs, ...). Ratio = llama.cpp's time / ours (above 1: ours is
faster). Prefill: one 512-token pass (ours: the eager forward that fills the KV cache; theirs: one batch of
512), beside the roofline's compute ceiling for it (matmul FLOPs / the calibrated peak). Quality, on the
same held-out windows of text: bits per byte and top-1 agreement with our fp32 logits, for both engines.

Left out: llama.cpp's other quantization types (k-quants, i-quants), batch > 1, GPU offload, and llama.cpp's
own threading options beyond the thread count.
"""

from __future__ import annotations

import copy
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..measure.evaluate import token_byte_lengths
from ..measure.timing import median, time_interleaved
from .rows import Row, ratios

# our format -> (quantize_model method or None, kernel, llama.cpp file type)
FORMATS = {
    "fp32": (None, None, "f32"),
    "fp16 weights": ("fp16", "fused_dequant", "f16"),
    "int8": ("int8", "fused_dequant", "q8_0"),
    "int4": ("int4", "int4pack", "q4_0"),
}
# the bench adds the int4 kernel that rounds activations as q4_0 x q8_0 does, where its vector loop runs (the
# chapter's quality table keeps the four weight-only formats and their portable kernels)
INT4_DYNAMIC = "int4, int8 activations"
TARGETS = {"fp32": 1.0, "fp16 weights": 1.0, "int8": 1.0, "int4": 1.0, INT4_DYNAMIC: 1.0}  # at least llama.cpp's speed
PREFILL_TARGET = 0.8


def bench_formats() -> dict:
    """FORMATS with the course's C++ kernels where their vector loops run (quantize/native.py; elsewhere only
    their scalar loops would): fp16 and int8 through "cpu_rows" where the CPU has AVX-512 (weight-only, as FORMATS'
    "fused_dequant", read faster), and the int4 "dynamic" format added where it has AVX512-VNNI."""
    from ..quantize import available_kernels, native

    if "cpu_rows" not in available_kernels("int8", "cpu") or not native.avx512():
        return dict(FORMATS)
    formats = {**FORMATS, "fp16 weights": ("fp16", "cpu_rows", "f16"), "int8": ("int8", "cpu_rows", "q8_0")}
    if native.vnni():
        formats[INT4_DYNAMIC] = ("int4", "dynamic", "q4_0")
    return formats


def llama_cpp_missing() -> str:
    """'' when llama-cpp-python and gguf import, else one line saying why the llama.cpp rows are skipped."""
    import importlib

    for module in ("llama_cpp", "gguf"):  # llama-cpp-python runs llama.cpp; the exporter writes with gguf
        try:
            importlib.import_module(module)
        except ImportError:
            return f"llama.cpp rows skipped: {module} is not installed (pip install -r requirements-ci.txt)"
    return ""


def export_formats(model, tok, folder, name: str = "model") -> dict[str, Path]:
    """GGUF files of `model` in f32 and f16 (our exporter) and q8_0 and q4_0 (llama.cpp's quantizer reading
    the f32 file), in `folder`: {file type: path}."""
    from ..export_gguf import quantize_gguf, write_gguf

    cpu_model = model if model.device.type == "cpu" else copy.deepcopy(model).to("cpu", torch.float32)
    folder = Path(folder)
    paths = {t: write_gguf(cpu_model, tok, folder / f"{name}-{t}.gguf", t, name=name) for t in ("f32", "f16")}
    for t in ("q8_0", "q4_0"):
        paths[t] = quantize_gguf(paths["f32"], folder / f"{name}-{t}.gguf", t)
    return paths


def open_llama(path, n_ctx: int, logits_all: bool = False):
    """llama.cpp on `path` with torch's thread count, a float32 KV cache (ours is float32; llama.cpp's default
    is float16) and batches of up to 512 tokens."""
    import llama_cpp

    threads = torch.get_num_threads()
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_batch=512,
        n_ubatch=512,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=logits_all,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        verbose=False,
    )


def llama_greedy(llm, prompt_ids: list[int], n_new: int) -> list[int]:
    """llama.cpp's greedy continuation of prompt_ids, n_new tokens (its sampler at top_k=1)."""
    out = []
    for t in llm.generate(prompt_ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(t))
        if len(out) == n_new:
            break
    return out


def our_variant(model, fmt: str):
    """Our model in format `fmt` (a key of bench_formats()): the model itself for fp32, else a quantized copy.
    The head follows llama.cpp's files where our C++ kernels run: "fp16 weights" stores it in fp16, as the f16
    file does (the same values where the weights are f16-exact, as the course model's are), and the int4
    "dynamic" format in int8 ("cpu_rows"), where the q4_0 file keeps it at Q6_K (6.6 bits a weight). The other
    formats keep a float32 head (the q8_0 file's is Q8_0; ours stays unrounded, for quality)."""
    method, kernel, _ = bench_formats()[fmt]
    if method is None:
        return model
    from ..quantize import quantize_model

    heads = {("fp16", "cpu_rows"): "fp16", ("int4", "dynamic"): "int8"}
    head = dict(head_method=heads[method, kernel], head_kernel="cpu_rows") if (method, kernel) in heads else {}
    return quantize_model(model, method, group_size=64, kernel=kernel, **head)


@dataclass
class Quality:
    """Bits per byte on the held-out windows, and top-1 agreement with our fp32 logits."""

    bits_per_byte: float
    top1_agreement: float


def held_out_windows(tok, n_windows: int, length: int = 512) -> list[list[int]]:
    """n_windows windows of length + 1 ids from the validation files, spread evenly over the stream."""
    from ..data import encode_documents, validation_documents
    from ..measure.evaluate import windows

    ids = encode_documents(tok, validation_documents())
    full = [w for w in windows(np.asarray(ids), length) if len(w) == length + 1]  # not the short last one
    picks = np.linspace(0, len(full) - 1, min(n_windows, len(full))).round().astype(int)
    return [full[i].astype(np.int64).tolist() for i in picks]


def quality_of(logits_fn, ws: list[list[int]], byte_lengths: np.ndarray, reference: list[torch.Tensor] | None):
    """Quality of a logits function (ids -> (T, V) float logits) on windows ws; reference: the fp32 argmaxes
    per window (None: these are the reference). Returns (Quality, the argmaxes)."""
    nll, n_bytes, agree, total, argmaxes = 0.0, 0, 0, 0, []
    for i, w in enumerate(ws):
        logits = logits_fn(w[:-1]).float()  # (T, V)
        y = torch.tensor(w[1:])  # (T,)
        nll += torch.nn.functional.cross_entropy(logits, y, reduction="sum").item()
        n_bytes += int(byte_lengths[w[1:]].sum())
        top = logits.argmax(-1)  # (T,)
        argmaxes.append(top)
        ref = top if reference is None else reference[i]
        agree += int((top == ref).sum())
        total += top.numel()
    return Quality(nll / math.log(2) / n_bytes, agree / total), argmaxes


def llama_logits_fn(llm):
    def logits(ids):  # (T,) -> (T, V): every position's logits (the Llama was opened with logits_all)
        llm.reset()
        llm.eval(ids)
        return torch.from_numpy(np.asarray(llm.scores[: len(ids)], dtype=np.float32))

    return logits


def our_logits_fn(model):
    """ids -> (T, V) logits of one forward pass. Layers that round their activations only for few rows (the int4
    "dynamic" kernel) round every row here, so the quality is that of the decode's arithmetic."""
    from ..quantize import QuantizedLinear

    for m in model.modules():
        if isinstance(m, QuantizedLinear) and hasattr(m, "rounded_rows"):
            m.rounded_rows = model.cfg.max_seq_len

    @torch.no_grad()
    def logits(ids):
        return model(torch.tensor([ids], device=model.device))[0].cpu()  # (T, V)

    return logits


def rows_same_weights(
    model,
    tok,
    label: str,
    n_new: int,
    repeats: int,
    progress,
    prefill_tokens: int = 512,
    quality_windows: int = 0,
    compile: bool = True,
) -> tuple[list[Row], list[str]]:
    """Every format of ours against llama.cpp's on the same weights: a decode row and a prefill row per format,
    and (quality_windows > 0) a quality line per format for both engines. Our decode is FastGenerator's
    default step (compile=False: the same static step, eager). Returns (rows, lines); without
    llama-cpp-python, no rows and one line saying why. A chapter cell can call it as it is."""
    missing = llama_cpp_missing()
    if missing:
        return [], [missing]
    import llama_cpp

    from ..fast_decode import FastGenerator
    from ..generate import prefill
    from ..kv_cache import KVCache
    from ..measure.calibration import calibrate
    from ..measure.flops import forward_flops

    device = model.device
    prompt_ids = tok.encode("def main():\n", bos=True)
    prompt = torch.tensor([prompt_ids], device=device)
    long_ids = held_out_windows(tok, 1, prefill_tokens)[0][:prefill_tokens] if prefill_tokens else []
    long = torch.tensor([long_ids], device=device)
    ceiling = forward_flops(model.cfg, prefill_tokens, all_logits=False) / calibrate(device.type).peak_flops
    ws = held_out_windows(tok, quality_windows) if quality_windows else []
    byte_lengths = token_byte_lengths(tok)
    ref_top = None
    rows, lines = [], []
    n_ctx = max(len(prompt_ids) + n_new, prefill_tokens) + 8
    with tempfile.TemporaryDirectory() as tmp:
        paths = export_formats(model, tok, tmp, name=label.replace(" ", "-"))
        for fmt, (_, kernel, file_type) in bench_formats().items():
            ours = our_variant(model, fmt)
            S = max(40, len(prompt_ids) + n_new + 1)  # 40: the bandwidth rows' buffer, one compile for both
            fast = FastGenerator(ours, max_seq_len=S, compile=compile)
            secs = fast.warmup()
            llm = open_llama(paths[file_type], n_ctx)
            mine = fast.generate(prompt, n_new)[0, len(prompt_ids) :].tolist()
            same = llama_greedy(llm, prompt_ids, n_new) == mine
            tb, tc = time_interleaved(
                [lambda llm=llm: llama_greedy(llm, prompt_ids, n_new), lambda fast=fast: fast.generate(prompt, n_new)],
                device,
                repeats,
            )
            size = paths[file_type].stat().st_size / 1e6
            kind = f"{fmt}" + (f" ({kernel})" if kernel else "")
            rows.append(
                Row(
                    f"{label}: ours {kind} decode vs llama.cpp {file_type}",
                    f"llama.cpp {file_type}",
                    f"ours {fmt}",
                    ratios(tb, tc),
                    f"{n_new / median(tb):.0f} tok/s",
                    f"{n_new / median(tc):.0f} tok/s",
                    target=TARGETS[fmt],
                    same_output=same,
                    note=f"{n_new} greedy tokens; GGUF {size:.0f} MB; ours {fast.compile_source} "
                    f"in {secs:.0f} s; llama-cpp-python {llama_cpp.__version__}",
                )
            )
            del fast
            progress()
            if prefill_tokens:
                cache = KVCache.for_model(ours, max_seq_len=prefill_tokens)

                def ours_prefill(ours=ours, cache=cache):
                    return prefill(ours, long, cache)  # resets the cache first

                def theirs_prefill(llm=llm):
                    llm.reset()
                    llm.eval(long_ids)

                with torch.no_grad():
                    tb, tc = time_interleaved([theirs_prefill, ours_prefill], device, max(2, repeats // 2))
                rows.append(
                    Row(
                        f"{label}: ours {fmt} prefill {prefill_tokens} vs llama.cpp {file_type}",
                        f"llama.cpp {file_type}",
                        f"ours {fmt}",
                        ratios(tb, tc),
                        f"{median(tb) * 1e3:.0f} ms",
                        f"{median(tc) * 1e3:.0f} ms",
                        target=PREFILL_TARGET,
                        note=f"compute ceiling {ceiling * 1e3:.0f} ms (matmul FLOPs / calibrated peak): "
                        f"ours at {ceiling / median(tc):.2f}, llama.cpp at {ceiling / median(tb):.2f}",
                    )
                )
                progress()
            del llm
            if ws:
                q_ours, top = quality_of(our_logits_fn(ours), ws, byte_lengths, ref_top)
                ref_top = ref_top or top
                scorer = open_llama(paths[file_type], len(ws[0]) + 8, logits_all=True)
                q_theirs, _ = quality_of(llama_logits_fn(scorer), ws, byte_lengths, ref_top)
                del scorer
                lines.append(
                    f"{label}, {len(ws)} held-out windows of {len(ws[0]) - 1} tokens: ours {fmt} "
                    f"{q_ours.bits_per_byte:.4f} bits/byte, top-1 agreement with our fp32 "
                    f"{q_ours.top1_agreement:.1%}; llama.cpp {file_type} {q_theirs.bits_per_byte:.4f} "
                    f"bits/byte, {q_theirs.top1_agreement:.1%}"
                )
                progress()
            del ours
    return rows, lines


def quality_same_weights(model, tok, n_windows: int = 2, length: int = 512) -> tuple[list[tuple], str]:
    """Quality of every format of ours beside llama.cpp's, on the same weights and the same held-out windows,
    without timing anything (a chapter cell can afford it: a few seconds for the course model).
    Returns ([(format, ours Quality, llama.cpp file type, llama.cpp Quality)], '') or ([], why skipped).
    Agreement is top-1 against our fp32 logits. Left out: speed (rows_same_weights times it)."""
    missing = llama_cpp_missing()
    if missing:
        return [], missing
    ws = held_out_windows(tok, n_windows, length)
    byte_lengths = token_byte_lengths(tok)
    out, reference = [], None
    with tempfile.TemporaryDirectory() as tmp:
        paths = export_formats(model, tok, tmp, name="course")
        for fmt, (_, _, file_type) in FORMATS.items():
            ours = our_variant(model, fmt)
            q_ours, top = quality_of(our_logits_fn(ours), ws, byte_lengths, reference)
            reference = reference or top
            scorer = open_llama(paths[file_type], length + 8, logits_all=True)
            q_theirs, _ = quality_of(llama_logits_fn(scorer), ws, byte_lengths, reference)
            del scorer, ours
            out.append((fmt, q_ours, file_type, q_theirs))
    return out, ""
