"""One benchmark command: every speed claim of the course, as ratios measured side by side in one run.

    python -m helpers.bench            # full run (several minutes on a 2-core CPU)
    python -m helpers.bench --quick    # about a minute: shorter generations, fewer repeats

Each row times a candidate against its baseline in the same process, interleaved (A B A B ...), and
reports the median ratio with its min-max over the repeats, the absolute medians, the device, and the
target the course set for it. Tokens are compared too: a speedup that changes the output is a bug.
It is a benchmark, not a test: nothing here fails on a slow machine. It prints this machine's calibration
first (CPU, read-only bandwidth with one thread and with all, copy bandwidth): decode bandwidth fractions are
against the read-only roof. `--rows` runs some groups only (GROUPS below).

Writes bench_summary.png (ratios against their targets), bench_cache_latency.png (per-token time
against position, with and without the KV cache) and bench_results.json into .cache/figures/
(LLM_COURSE_FIGURES=figures to refresh the committed ones). BENCHMARKS.md holds the last full run.

Speculative decoding is timed twice: the eager loop against plain eager decoding, and the loop on
compiled draft and verify steps (FastGenerators) against plain compiled decoding; and batched (B = 1, 8, 32,
rows accepting in lockstep) against plain batched decoding of the same B prompts.

Rows for chapter 07: what each lever of the compiled step buys (inductor's C++ wrapper, the buffer sized
to the generation, prefill's share of the time), the compiled step against its roofline ceiling, bf16
against fp32 (all-bf16 eager, and bf16 / fp16 weights with fp32 arithmetic in the compiled step).
Rows against llama.cpp on the same weights, every format (fp32 / f32, fp16 weights / f16, int8 / q8_0,
int4 / q4_0; decode, 512-token prefill, quality) when llama-cpp-python is installed (`pip install -r
requirements-ci.txt`: it builds llama.cpp from source, about 10-12 minutes on 2 cores; CI installs it).
Rows for chapter 13 come from helpers/serving/bench.py (continuous vs sequential and
static batching, KV utilisation, prefix caching, chunked prefill).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict

import torch

from ..device import default_device, default_dtype
from ..paths import figures_dir
from .compiled import row_compiled_vs_limit, rows_compile_levers, rows_precision, rows_precision_compiled
from .decode import row_cache_vs_recompute, row_vs_transformers
from .llama_cpp import rows_same_weights
from .quantized import quantized_quality, rows_decode_bandwidth, rows_quantized, rows_quantized_compiled
from .report import plot
from .rows import Row, device_description, random_model
from .speculative import rows_speculative, rows_speculative_compiled

# the groups of rows, in the order they run (`--rows` picks some)
GROUPS = (
    "cache",
    "transformers",
    "compiled",
    "llama-cpp",
    "precision",
    "speculative",
    "quantized",
    "bandwidth",
    "serving",
)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="about a minute: shorter runs, fewer repeats")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    ap.add_argument("--big-preset", default="bench-150m", help="random-weight config for the memory-bound rows")
    ap.add_argument(
        "--rows",
        default=",".join(GROUPS),
        help=f"comma-separated groups of rows to run (default: all): {', '.join(GROUPS)}",
    )
    args = ap.parse_args(argv)
    args.groups = [g.strip() for g in args.rows.split(",") if g.strip()]
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        ap.error(f"--rows: unknown group(s) {', '.join(unknown)}; choose from {', '.join(GROUPS)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    from ..checkpoint import load_model
    from ..fast_decode import FastGenerator
    from ..measure.calibration import calibrate
    from ..progress import progress_bar

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device) if args.device else default_device()
    dtype = default_dtype(device)
    name = device_description(device)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    cal = calibrate(device)  # first: every later row reads its ceilings
    quick, groups = args.quick, set(args.groups)
    repeats = 3 if quick else 5
    n_cache = 256 if quick else 1024
    cache_repeats = 1 if quick else 3
    n_spec = 64 if quick else 128
    n_hf = 128 if quick else 256
    model, tok = load_model("target", device=device, dtype=dtype)
    draft, _ = load_model("draft", device=device, dtype=dtype)
    big = random_model(args.big_preset, device, dtype)

    bar = progress_bar(total=len(groups) + (0 if args.no_compile else 1), desc="bench", unit="group")
    tick = lambda: None  # noqa: E731 (the groups report progress per group, below)
    fast = None
    compile_note = "compile skipped"
    if not args.no_compile:
        # the static step attends over its whole cache buffer every step, so size the buffer to the
        # generation (prompt + new tokens), as a server sizes it to the request: 1024 would cost ~2x
        fast = FastGenerator(model, max_seq_len=n_hf + 64)
        secs = fast.warmup()
        compile_note = f"compile {secs:.0f} s" if fast.compiled else "compile unavailable: eager fallback"
        bar.update(1)
    # the opt-in step: frozen weights prepacked, inductor's own GEMM timed against the library's per product
    tuned = None
    if fast is not None and fast.freeze and not fast.gemm_autotune and groups & {"compiled", "speculative"}:
        tuned = FastGenerator(model, max_seq_len=n_hf + 64, gemm_autotune=True)
    rows, curves, notes, quality = [], None, [], ""

    def done(group):
        bar.set_postfix_str(group)
        bar.update(1)

    if "cache" in groups:
        row, curves = row_cache_vs_recompute(model, tok, n_cache, cache_repeats, tick)
        rows.append(row)
        done("cache")
    if "transformers" in groups:
        rows += row_vs_transformers(model, tok, n_hf, repeats, fast, tick)
        done("transformers")
    if "compiled" in groups and fast is not None:
        rows += rows_compile_levers(model, tok, n_hf, repeats, fast, tick, tuned=tuned)
        rows.append(row_compiled_vs_limit(model, tok, n_hf, repeats, fast, tick))
        if tuned is not None:
            rows.append(
                row_compiled_vs_limit(model, tok, n_hf, repeats, tuned, tick, label="compiled step, autotuned GEMM")
            )
    if "compiled" in groups:
        done("compiled")
    if "llama-cpp" in groups:  # every format against llama.cpp's on the same weights
        n_llama = 64 if quick else 128
        for label, m, windows in (("course model", model, 2 if quick else 4), (f"{args.big_preset} random", big, 0)):
            more_rows, lines = rows_same_weights(
                m,
                tok,
                label,
                n_llama if m is model else n_llama // 4,
                repeats if m is model else 3,
                tick,
                quality_windows=windows,
                compile=not args.no_compile,
            )
            rows += more_rows
            notes += [line for line in lines if line not in notes]
        done("llama-cpp")
    if "precision" in groups:
        rows += rows_precision(model, big, 3 if quick else 5, tick)
        if fast is not None:
            rows += rows_precision_compiled(model, big, 3 if quick else 5, tick)
        done("precision")
    if "speculative" in groups:
        rows += rows_speculative(model, draft, tok, n_spec, 2 if quick else 3, tick)
        # the gain from batch 1 to 32: batched speculation (rows in lockstep) vs plain batched decoding
        from .speculative_batched import rows_speculative_batched  # also a command of its own: not imported above

        rows += rows_speculative_batched(model, draft, tok, n_spec, 2 if quick else 3, tick)
        if fast is not None:  # the same prompts, compiled draft and verify steps against the compiled plain loop
            rows += rows_speculative_compiled(model, draft, tok, n_spec, 2 if quick else 3, fast, tick)
            if tuned is not None:  # the same rounds on autotuned generators, against the autotuned plain step
                rows += rows_speculative_compiled(
                    model,
                    draft,
                    tok,
                    n_spec,
                    2 if quick else 3,
                    tuned,
                    tick,
                    label=" (autotuned GEMM)",
                    fused_only=True,
                )
        done("speculative")
    if "quantized" in groups:
        rows += rows_quantized(big, 3 if quick else 5, tick)
        if fast is not None:
            rows += rows_quantized_compiled(big, 3 if quick else 5, tick)
        quality = quantized_quality(model, tok, n_windows=4 if quick else 12)
        done("quantized")
    if "bandwidth" in groups:
        big_fast = FastGenerator(big, max_seq_len=40) if fast is not None else None
        # the default's generated row sums against torch's matrix-vector kernel, each against the read roof
        big_library = (
            FastGenerator(big, max_seq_len=40, gemv="library")
            if big_fast is not None and big_fast.gemv == "sums"
            else None
        )
        rows += rows_decode_bandwidth(big, repeats, tick, fast=big_fast, library=big_library)
        done("bandwidth")
    if "serving" in groups:
        from ..serving.bench import serving_rows  # chapter 13's targets: many requests at once

        rows += [Row(**d) for d in serving_rows(model, tok, quick)]
        done("serving")
    bar.close()

    print(
        f"\nhelpers.bench on {name}, {started}, torch {torch.__version__}, dtype {dtype}, {compile_note}"
        f"{' (quick)' if quick else ''}"
    )
    print(f"calibration: {cal.summary()}")
    print(f"{'row':46s} {'ratio':>7s} {'[min-max]':11s} {'baseline':>16s} -> {'candidate':<16s} target")
    for r in rows:
        print(r.line())
    if quality:
        print(f"quantization quality, {quality}")
    for line in notes:
        print(line)
    figures = figures_dir()
    figures.mkdir(parents=True, exist_ok=True)
    plot(rows, curves, name)
    results = {
        "device": name,
        "cpu": cal.cpu,
        "date": started,
        "calibration": cal.summary(),
        "torch": torch.__version__,
        "dtype": str(dtype),
        "quick": quick,
        "groups": sorted(groups),
        "compile": compile_note,
        "quantization_quality": quality,
        "notes": notes,
        "rows": [asdict(r) | {"median": r.median} for r in rows],
    }
    (figures / "bench_results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {figures / 'bench_summary.png'}, bench_cache_latency.png, bench_results.json")
