"""Rows for chapter 07: what each lever of the compiled step buys, the step against its roofline ceiling, and
16-bit weights or activations against fp32."""

from __future__ import annotations

import torch

from ..measure.timing import decode_steps_interleaved, median, time_interleaved, timed
from .quantized import decode_byte_ratio, time_against_compiled
from .rows import Row, ratios


def rows_compile_levers(model, tok, n_new: int, repeats: int, fast, progress, tuned=None) -> list[Row]:
    """What each lever of the compiled step buys, each against the plain compiled step (buffer sized to
    the generation) in the same run: a buffer of the whole context window, the default CPU choices undone
    one at a time (generated Python driving the kernels in place of C++, the weights passed in as inputs
    in place of frozen constants, torch's matrix-vector kernel in place of the generated row sums, over
    its (in, out) copy and over nn.Linear's layout, torch's SDPA in place of fused attention),
    `tuned` (the opt-in gemm_autotune step, if given), and the share of a generation that the (eager)
    prefill takes: compiling prefill can save at most that."""
    from ..fast_decode import FastGenerator
    from ..generate import prefill
    from ..kv_cache import KVCache

    prompt = torch.tensor([tok.encode("def main():\n", bos=True)], device=model.device)
    S = fast.cache.max_seq_len

    def plain():
        return fast.generate(prompt, n_new)

    ref = plain()
    rows = []
    window = model.cfg.max_seq_len
    levers = [(f"buffer {window} (whole window)", FastGenerator(model, max_seq_len=window))]
    if fast.cpp_wrapper:  # what the C++ wrapper buys: the same step driven by inductor's generated Python
        levers.append(("Python wrapper in place of C++", FastGenerator(model, max_seq_len=S, cpp_wrapper=False)))
    if fast.freeze:  # what freezing buys: the same step taking its weights as inputs every call
        levers.append(("weights as inputs, not frozen", FastGenerator(model, max_seq_len=S, freeze=False)))
    if fast.gemv == "sums":  # what the generated row sums buy: torch's matrix-vector kernel, in both layouts
        levers.append(("torch's GEMV, (in, out) copy", FastGenerator(model, max_seq_len=S, gemv="library")))
        levers.append(("torch's GEMV, (out, in) weights", FastGenerator(model, max_seq_len=S, input_major=False)))
    if fast.input_major:  # what the (in, out) copy buys: the same step with nn.Linear's (out, in) weights
        levers.append(("(out, in) weights, nn.Linear's layout", FastGenerator(model, max_seq_len=S, input_major=False)))
    if fast.static_attention == "sums":  # what the fused attention buys: the same step calling torch's SDPA
        levers.append(
            ("SDPA in place of fused attention", FastGenerator(model, max_seq_len=S, static_attention="sdpa"))
        )
    if tuned is not None:  # the opt-in lever: inductor's own GEMM on prepacked weights, autotuned per product
        levers.append(("inductor's autotuned GEMM (gemm_autotune)", tuned))
    for label, cand in levers:
        secs = cand.warmup()
        same = torch.equal(cand.generate(prompt, n_new), ref)
        tb, tc = time_interleaved([plain, lambda cand=cand: cand.generate(prompt, n_new)], model.device, repeats)
        progress()
        rows.append(
            Row(
                f"compiled: {label} vs buffer {S}",
                f"buffer {S}",
                label,
                ratios(tb, tc),
                f"{median(tb) / n_new * 1e3:.2f} ms/token",
                f"{median(tc) / n_new * 1e3:.2f} ms/token",
                same_output=same,
                note=f"{cand.compile_source} in {secs:.0f} s",
            )
        )
    cache = KVCache.for_model(model, max_seq_len=S)
    tp, tg = time_interleaved([lambda: prefill(model, prompt, cache), plain], model.device, repeats)
    rows.append(
        Row(
            f"eager prefill ({prompt.shape[1]} tokens) / compiled generation",
            "generation",
            "prefill",
            [p / g for p, g in zip(tp, tg)],
            f"{median(tg) * 1e3:.0f} ms",
            f"{median(tp) * 1e3:.2f} ms",
            note="fraction, not speedup: the most that compiling prefill could save",
        )
    )
    return rows


def row_compiled_vs_limit(model, tok, n_new: int, repeats: int, fast, progress, label: str = "compiled step") -> Row:
    """The compiled step against the roofline ceiling for this model on this machine: max(bytes per token /
    read-only bandwidth, FLOPs per token / measured peak), the read roof measured between the generations
    (in-cache where the step's bytes fit the last-level cache: ReadRoof). Ratio = ceiling / measured (1 = at
    the limit)."""
    from ..measure.calibration import calibrate
    from ..measure.flops import forward_bytes, forward_flops
    from ..measure.roofline import roofline_time
    from .rows import ReadRoof

    cfg, device = model.cfg, model.device
    elem = model.embed.weight.element_size()
    prompt = torch.tensor([tok.encode("def main():\n", bos=True)], device=device)
    n_past = prompt.shape[1] + n_new // 2  # the average position of a generated token
    step_bytes = forward_bytes(cfg, 1, n_past, bytes_per_weight=elem, bytes_per_kv=elem)
    step_flops = forward_flops(cfg, 1, n_past)
    peak = calibrate(device).peak_flops
    roof = ReadRoof(step_bytes, device)
    ratios_, measured, limits = [], [], []
    for _ in range(repeats):
        bw = roof.measure()
        per_token = timed(lambda: fast.generate(prompt, n_new), device)[0] / n_new
        limit = roofline_time(step_flops, step_bytes, peak, bw)
        ratios_.append(limit / per_token)
        measured.append(per_token)
        limits.append(limit)
    progress()
    note = f"{step_bytes / 1e6:.1f} MB/token; fraction of the limit reached, read roof {roof.where}"
    return Row(
        f"{label} vs its roofline ceiling",
        "ceiling",
        "compiled",
        ratios_,
        f"{median(limits) * 1e3:.2f} ms ceiling",
        f"{median(measured) * 1e3:.2f} ms/token",
        target=round(1 / 1.5, 2),
        note=note,
    )


def rows_precision(model, big, repeats: int, progress) -> list[Row]:
    """bf16 weights and activations against fp32, batch-1 eager decode step, on the course model and on the
    memory-bound random-weight model (the quality change is measured in chapter 07)."""
    import copy

    rows = []
    if model.dtype != torch.float32:
        return rows
    for label, m in [("course model", model), (f"{big.num_parameters() / 1e6:.0f}M random weights", big)]:
        low = copy.deepcopy(m).to(torch.bfloat16)
        tb, tc = decode_steps_interleaved([m, low], repeats)
        progress()
        rows.append(
            Row(
                f"bf16 vs fp32 decode step, {label}",
                "fp32",
                "bf16",
                ratios(tb, tc),
                f"{median(tb) * 1e3:.2f} ms",
                f"{median(tc) * 1e3:.2f} ms",
                note=f"CPU capability {torch.backends.cpu.get_cpu_capability()}: the kernels decide",
            )
        )
        del low
    return rows


def rows_precision_compiled(model, big, repeats: int, progress) -> list[Row]:
    """16-bit weights with float32 arithmetic (helpers.quantize's "bf16" / "fp16", the fused_dequant loop) in the
    compiled batch-1 step, against the float32 compiled step, on the course model and the memory-bound
    random-weight model. Target: faster than float32 (the bytes read per step halve)."""
    from ..fast_decode import FastGenerator
    from ..quantize import quantize_model

    rows = []
    if model.dtype != torch.float32:
        return rows
    n_steps, context = 16, 16
    S = context + n_steps + 1
    for label, m in [("course model", model), (f"{big.num_parameters() / 1e6:.0f}M random weights", big)]:
        base = FastGenerator(m, max_seq_len=S)
        base.warmup()
        for method in ("bf16", "fp16"):
            qm = quantize_model(m, method)
            tb, tc, secs, source = time_against_compiled(base, qm, repeats, n_steps, context)
            bound = decode_byte_ratio(m, qm, context + n_steps // 2)
            rows.append(
                Row(
                    f"{method} weights, fp32 arithmetic, compiled vs fp32 compiled, {label}",
                    "fp32 compiled",
                    f"{method} weights",
                    ratios(tb, tc),
                    f"{median(tb) * 1e3:.2f} ms",
                    f"{median(tc) * 1e3:.2f} ms",
                    target=1.0,
                    note=f"byte ratio {bound:.2f}x; {source} in {secs:.0f} s",
                )
            )
            del qm
        progress()
    return rows
