"""Rows for chapter 11 and the memory roof: weight-only int8 / int4 against fp32 (eager and compiled), their
quality on held-out text, and the decode bandwidth of the 149M random-weight model."""

from __future__ import annotations

import torch

from ..measure.timing import compiled_step_seconds, decode_step_seconds, decode_steps_interleaved, median
from .rows import Row, ratios


def rows_decode_bandwidth(model, repeats: int, progress, fast=None, library=None) -> list[Row]:
    """Batch-1 decode on a random-weight model too big for any cache: bytes it must read per token (all matmul
    weights + the KV cache so far) / time per token, against the read-only bandwidth measured between the
    steps (a streaming sum over a buffer far larger than the last-level cache, as calibration measures it: a
    decode step only reads its weights). The eager step, and the compiled one when `fast` (a FastGenerator
    of `model`) is given, and `library` (one with gemv="library": torch's matrix-vector kernel) if given."""
    from ..measure.flops import matmul_parameters
    from .rows import ReadRoof

    cfg = model.cfg
    elem = model.embed.weight.element_size()
    n_steps, context = 16, 16
    avg_pos = context + n_steps / 2
    kv_read = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * avg_pos * elem
    bytes_per_token = matmul_parameters(cfg) * elem + kv_read
    roof = ReadRoof(bytes_per_token, model.device)
    steps = [("eager step", lambda: decode_step_seconds(model, n_steps, context))]
    if fast is not None:
        fast.warmup()
        steps.append(("compiled step", lambda: compiled_step_seconds(fast, n_steps, context)))
    if library is not None:
        library.warmup()
        steps.append(("compiled step, torch's GEMV", lambda: compiled_step_seconds(library, n_steps, context)))
    rows = []
    for label, seconds in steps:
        bw_runs, step_runs = [], []
        for _ in range(repeats):
            bw_runs.append(roof.measure())
            step_runs.append(seconds())
        progress()
        achieved = [bytes_per_token / s for s in step_runs]
        rows.append(
            Row(
                f"decode bandwidth, {label}, {matmul_parameters(cfg) / 1e6:.0f}M random weights",
                f"read-only {roof.where}",
                "decode",
                [a / b for a, b in zip(achieved, bw_runs)],
                f"{median(bw_runs) / 1e9:.1f} GB/s read",
                f"{median(achieved) / 1e9:.1f} GB/s decode",
                target=0.85 if label == "compiled step" else None,
                note=f"{bytes_per_token / 1e6:.0f} MB read per token, {median(step_runs) * 1e3:.1f} "
                f"ms/token (fraction of the read roof, not speedup)",
            )
        )
    return rows


def rows_quantized(model, repeats: int, progress) -> list[Row]:
    """Weight-only int8 / int4 with torch's real kernels against the same model unquantized."""
    from ..quantize import quantize_model

    variants = [("int8 weight-only", "int8", "auto", 2.0), ("int4 weight-only, group 64", "int4", "auto", 3.0)]
    if model.device.type == "cpu":
        variants.insert(1, ("int8 dynamic (activations too)", "int8", "dynamic", None))
    base_name = "fp32" if model.dtype == torch.float32 else str(model.dtype).replace("torch.", "")
    rows = []
    for label, method, kernel, target in variants:
        qmodel = quantize_model(model, method, group_size=64, kernel=kernel)
        tb, tc = decode_steps_interleaved([model, qmodel], repeats)
        progress()
        shown = [f"{1 / median(t):.1f} tok/s" for t in (tb, tc)]  # each side's median rate, one format
        note = f"{model.num_parameters() / 1e6:.0f}M random weights"
        rows.append(
            Row(f"{label} vs {base_name}, batch-1 decode", base_name, label, ratios(tb, tc), *shown, target, note)
        )
        del qmodel
    return rows


def decode_byte_ratio(model, qmodel, n_past: int) -> float:
    """Bytes a batch-1 step must read, unquantized / quantized: every matmul weight (codes, scales and
    zeros for the quantized layers; the full-precision head) plus the KV cache so far. Norms are ignored."""
    from ..measure.flops import forward_bytes
    from ..quantize import weight_bytes_breakdown

    elem = model.embed.weight.element_size()
    kv = forward_bytes(model.cfg, 1, n_past, bytes_per_weight=0, bytes_per_kv=elem)
    q = weight_bytes_breakdown(qmodel)
    head = qmodel.head.weight.numel() * qmodel.head.weight.element_size() if hasattr(qmodel.head, "weight") else 0
    quantized = q["weights"] + q["scales"] + q["zeros"] + head + kv
    return forward_bytes(model.cfg, 1, n_past, bytes_per_weight=elem, bytes_per_kv=elem) / quantized


def time_against_compiled(base, model, repeats: int, n_steps: int = 16, context: int = 16):
    """Compile `model`'s batch-1 step with base's buffer size, then time base's step and it, interleaved.
    Returns (base seconds, candidate seconds, warm-up seconds, where the candidate's code came from)."""
    from ..fast_decode import FastGenerator

    fast = FastGenerator(model, max_seq_len=base.cache.max_seq_len)
    secs = fast.warmup()
    tb, tc = [], []
    for _ in range(repeats):
        tb.append(compiled_step_seconds(base, n_steps, context))
        tc.append(compiled_step_seconds(fast, n_steps, context))
    return tb, tc, secs, fast.compile_source


def rows_quantized_compiled(model, repeats: int, progress) -> list[Row]:
    """Weight-only int8 / int4 in the compiled batch-1 step (FastGenerator) against the unquantized compiled step:
    torch's library kernels ("int8pack", "int4pack", called from the compiled graph) and the "fused_dequant"
    formulation that inductor generates as one dequantize-multiply-sum loop. Target: half the speedup the
    bytes read per step allow. Each quantized model compiles its own step (about 30-60 s each on 2 cores)."""
    from ..fast_decode import FastGenerator
    from ..quantize import quantize_model

    n_steps, context = 16, 16
    S = context + n_steps + 1
    base_name = "fp32" if model.dtype == torch.float32 else str(model.dtype).replace("torch.", "")
    base = FastGenerator(model, max_seq_len=S)
    base.warmup()
    variants = [("int8", "int8pack"), ("int8", "fused_dequant"), ("int4", "int4pack"), ("int4", "fused_dequant")]
    rows = []
    for method, kernel in variants:
        qmodel = quantize_model(model, method, group_size=64, kernel=kernel)
        tb, tc, secs, source = time_against_compiled(base, qmodel, repeats, n_steps, context)
        bound = decode_byte_ratio(model, qmodel, context + n_steps // 2)
        progress()
        label = f"{method} weight-only" + (", group 64" if method == "int4" else "")
        rows.append(
            Row(
                f"{label} compiled ({kernel}) vs {base_name} compiled, batch-1 decode",
                f"{base_name} compiled",
                f"{method} {kernel}",
                ratios(tb, tc),
                f"{median(tb) * 1e3:.1f} ms",
                f"{median(tc) * 1e3:.1f} ms",
                target=round(bound / 2, 2),
                note=f"byte ratio {bound:.2f}x; {source} in {secs:.0f} s; "
                f"{model.num_parameters() / 1e6:.0f}M random weights",
            )
        )
        del qmodel
    return rows


def quantized_quality(model, tok, n_windows: int = 8) -> str:
    """Validation bits/byte and top-1 agreement of the course model's int8 / int4 / bf16 / fp16 copies."""
    from ..data import encode_documents, validation_documents
    from ..measure.evaluate import bits_per_byte
    from ..quantize import quantize_model

    ids = encode_documents(tok, validation_documents())
    ref = bits_per_byte(model, tok, ids, max_windows=n_windows)["bits_per_byte"]
    x = torch.tensor(ids[:513].astype("int64"), device=model.device).unsqueeze(0)
    with torch.no_grad():
        top_ref = model(x[:, :-1]).argmax(-1)
    parts = [f"course model: {ref:.4f} bits/byte"]
    for method in ("int8", "int4", "bf16", "fp16"):
        q = quantize_model(model, method, group_size=64)
        bpb = bits_per_byte(q, tok, ids, max_windows=n_windows)["bits_per_byte"]
        with torch.no_grad():
            agree = (q(x[:, :-1]).argmax(-1) == top_ref).float().mean().item()
        parts.append(f"{method} {bpb - ref:+.4f} bits/byte, top-1 agreement {agree:.1%}")
    return "; ".join(parts)
