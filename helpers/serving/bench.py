"""python -m helpers.serving.bench: the serving targets of chapter 13, measured side by side in one run.

    python -m helpers.serving.bench            # the issue's sizes (several minutes on a 2-core CPU)
    python -m helpers.serving.bench --quick    # smaller workloads, about a minute
    python -m helpers.serving.bench --only batch_invariance   # one group of rows
    python -m helpers.serving.bench --only goodput

Rows (each a ratio measured in this run, next to the course's target):
  paged decode step, batch 32, 512 cached tokens each, blocks scattered at random: blocks read in place
      vs gathered into a dense copy first (target: in place <= 0.7x, i.e. speedup >= 1.43), and vs the
      dense KVCache batched step of the same shape (target <= 1.1x, speedup >= 0.91); gather calls 0; and
      the same in-place step compiled (compiled_step.py) vs eager;
  continuous batching with the engine's compiled step vs the same with its eager step (runs interleaved),
      then, each row naming the step it ran, continuous batching vs sequential generate (target 10x), vs
      the compiled single-stream FastGenerator run sequentially (target 3x), vs transformers'
      generate_batch where the installed transformers has it (target 10x, tokens compared), and vs static
      batching (the same step): 64 requests, 32 running at once,
      prompts 16-128 tokens, outputs 16-256 tokens (uniform), all arriving at time 0;
  KV memory: share of allocated block slots holding live tokens; requests running at once vs how many
      contiguous max-length (max_seq_len) reservations fit in the same bytes;
  prefix caching: 32 requests sharing a 512-token prefix, Poisson arrivals: TTFT p50 without / with;
  chunked prefill: long prompts arriving while short requests decode: p99 / p50 inter-token latency;
  batch invariance: the same 64 requests alone and all at once (32 running), outputs that differ, outside
      and inside Engine(batch_invariant=True) (target 0 in the mode), and the mode's tokens/s against the
      default's on the busy run, runs interleaved (target >= 0.85x, i.e. at most 15% slower);
  goodput (requests/s meeting a TTFT and a TPOT target) of static batching, continuous batching and
      continuous batching + chunked prefill (each with the compiled step, as the server runs them) against
      sequential generate, best over rising Poisson rates
      (target 4x for the last), with each design's knee (goodput.py).

`serving_rows(model, tok, quick)` returns the rows as dicts with helpers.bench.Row's fields, so the
course bench can add them: `rows += [Row(**d) for d in serving_rows(model, tok, quick)]`.

Out of scope: a real network front end (chapter 14) and GPU runs (the same code runs there, untuned).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from .baselines import run_fast_sequential, run_hf_generate_batch
from .engine import Engine
from .goodput import LOAD_FACTORS, TPOT_TARGET_TPOTS, TTFT_TARGET_SERVICES, goodput_sweep, sequential_service
from .step_profile import paged_step_seconds
from .workload import RunResult, make_workload, run_engine, run_sequential

# helpers.bench.Row's fields in its order (the course bench rebuilds its rows with Row(**d)); named here, not
# imported, because the bench imports this module (nothing below it imports the bench)
ROW_FIELDS = "name baseline candidate ratios baseline_abs candidate_abs target note same_output extra".split()


def _row(name, baseline, candidate, ratio, baseline_abs, candidate_abs, target=None, note="", same=None, **extra):
    """A row as a dict with helpers.bench.Row's fields (what serving_rows returns), with one ratio."""
    values = (name, baseline, candidate, [float(ratio)], baseline_abs, candidate_abs, target, note, same, extra)
    return dict(zip(ROW_FIELDS, values))


def rows_paged_step(model, quick: bool) -> list[dict]:
    t = paged_step_seconds(model, batch=32, context=512, repeats=5 if quick else 11, compiled="autotune")
    ms = {k: f"{1e3 * t[k]:.1f} ms" for k in ("in_place", "gather", "dense", "compiled")}
    calls = f"; gather calls in the in-place step: {t['gather_calls']}"

    def in_place_vs(other, label, limit, more=""):  # target: the in-place step at most `limit` x the other
        note = f"step {t['in_place'] / t[other]:.2f}x the {other} step (target <= {limit:g}x){more}"
        name = f"paged decode step B=32, 512 cached: in place vs {label}"
        return _row(name, other, "in place", t[other] / t["in_place"], ms[other], ms["in_place"], 1 / limit, note)

    compiled = _row(
        "paged decode step B=32, 512 cached: compiled vs eager (both in place)",
        "eager",
        "compiled",
        t["in_place"] / t["compiled"],
        ms["in_place"],
        ms["compiled"],
        note="compiled_step.py, autotuned matmuls; its compile not timed",
    )
    return [in_place_vs("gather", "gather", 0.7, calls), in_place_vs("dense", "dense KVCache", 1.1), compiled]


def rows_batching(model, tok, quick: bool) -> list[dict]:
    n, out_len = (24, (16, 96)) if quick else (64, (16, 256))
    wl = make_workload(tok, n, rate=None, prompt_len=(16, 128), output_len=out_len, seed=0)
    num_blocks = 512  # 8192 token slots: 8 contiguous max_seq_len reservations
    seq = run_sequential(model, wl)
    fast = run_fast_sequential(model, wl)
    # the engine's step eager and compiled (compiled_step.py; compiled once, before any clock), interleaved
    runs: dict[bool, list[RunResult]] = {False: [], True: []}
    for _ in range(2 if quick else 3):
        for compiled in (False, True):
            engine = Engine(model, num_blocks=num_blocks, max_num_seqs=32, compile_step=compiled and "autotune")
            runs[compiled].append(run_engine(engine, wl, f"continuous, compiled step: {compiled}"))
    by_speed = {c: sorted(rs, key=lambda r: r.throughput) for c, rs in runs.items()}
    eager, cont = (by_speed[c][len(by_speed[c]) // 2] for c in (False, True))  # the median run of each
    step = "compiled" if engine.compiled_steps else "eager"  # which step the candidate's runs used
    static = run_engine(
        Engine(model, num_blocks=num_blocks, max_num_seqs=32, policy="static", compile_step="autotune"), wl, "static"
    )
    cont_engine = Engine(model, num_blocks=num_blocks, max_num_seqs=32)
    m = cont.engine_metrics
    contiguous_fit = num_blocks * cont_engine.block_size // model.cfg.max_seq_len

    def versus(name, baseline, base: RunResult, target, note="", same=None):  # continuous batching vs `base`
        shown = [f"{r.throughput:.0f} tok/s" for r in (base, cont)]
        return _row(name, baseline, "continuous", cont.throughput / base.throughput, *shown, target, note, same)

    def differ_note(run, what, reference="generate"):  # how many of `run`'s outputs differ from sequential generate's
        differ = sum(a != b for a, b in zip(run.outputs, seq.outputs))
        return dict(note=f"{differ} of {n} {what} differ from {reference}", same=differ == 0)

    rows = [
        versus(
            f"continuous batching, {step} step vs eager step ({n} req, 32 running)",
            "eager step",
            eager,
            None,
            note=f"median of {len(runs[True])} interleaved runs each; {engine.compiled_steps} of "
            f"{engine.num_steps} steps compiled",
            same=eager.outputs == cont.outputs,
        ),
        versus(
            f"continuous batching ({step} step) vs sequential generate ({n} req, 32 running)",
            "sequential",
            seq,
            10.0,
            **differ_note(cont, "outputs", "sequential generate"),
        ),
        versus(
            f"continuous batching ({step} step) vs sequential FastGenerator (compiled)",
            "FastGenerator",
            fast,
            3.0,
            **differ_note(fast, "FastGenerator outputs"),
        ),
        versus(
            f"continuous vs static batching (same batch size 32, both {step} step)",
            "static",
            static,
            1.7,
            same=cont.outputs == static.outputs,
        ),
        _row(
            "KV slots holding live tokens (paged, block 16)",
            "allocated",
            "live",
            m["kv_utilisation"],
            "",
            f"{m['kv_utilisation']:.1%}",
            0.9,
            note=f"{m['preemptions']} preemptions",
        ),
        _row(
            "requests running at once vs contiguous max-length reservation",
            "contiguous",
            "paged",
            m["peak_running"] / contiguous_fit,
            f"{contiguous_fit} req",
            f"{m['peak_running']} req",
            3.0,
        ),
    ]
    hf = run_hf_generate_batch(model, wl, 32)
    if hf is not None:
        rows.append(
            versus(
                f"continuous batching ({step} step) vs transformers generate_batch",
                "transformers",
                hf,
                10.0,
                **differ_note(hf, "transformers outputs"),
            )
        )
    return rows


def run_alone(model, workload, **engine_args) -> list[list[int]]:
    """Each request alone in its own engine (so nothing else is ever in its steps): the outputs."""
    outputs = []
    for w in workload:
        engine = Engine(model, **engine_args)
        rid = engine.submit(w.prompt, w.max_tokens)
        engine.run()
        outputs.append(engine.get(rid).output)
    return outputs


def rows_batch_invariance(model, tok, quick: bool) -> list[dict]:
    n, out_len = (24, (16, 96)) if quick else (64, (16, 256))
    wl = make_workload(tok, n, rate=None, prompt_len=(16, 128), output_len=out_len, seed=0)
    args = dict(num_blocks=1024, max_num_seqs=32)  # 32 * 24 blocks: nobody is preempted
    runs: dict[bool, list[RunResult]] = {False: [], True: []}
    for _ in range(2 if quick else 3):  # interleaved, so a slow spell of the machine hits both
        for inv in (False, True):
            runs[inv].append(run_engine(Engine(model, batch_invariant=inv, **args), wl, f"invariant={inv}"))
    tps = {inv: float(np.median([r.throughput for r in rs])) for inv, rs in runs.items()}
    differ = {
        inv: sum(a != b for a, b in zip(run_alone(model, wl, batch_invariant=inv, **args), runs[inv][0].outputs))
        for inv in (False, True)
    }
    return [
        _row(
            f"batch-invariant mode vs default, tokens/s ({n} req, 32 running)",
            "default",
            "invariant",
            tps[True] / tps[False],
            f"{tps[False]:.0f} tok/s",
            f"{tps[True]:.0f} tok/s",
            0.85,
            note=f"alone vs busy: {differ[True]} of {n} outputs differ in the mode (target 0), "
            f"{differ[False]} of {n} outside it; median of {len(runs[True])} interleaved runs",
            same=differ[True] == 0,
        )
    ]


def rows_prefix_caching(model, tok, quick: bool) -> list[dict]:
    n = 12 if quick else 32
    wl = make_workload(tok, n, rate=4.0, prompt_len=(16, 64), output_len=(16, 64), seed=1, shared_prefix_len=512)
    plain = run_engine(Engine(model, num_blocks=1024, max_num_seqs=32), wl, "no prefix caching")
    cached = run_engine(
        Engine(model, num_blocks=1024, max_num_seqs=32, enable_prefix_caching=True), wl, "prefix caching"
    )
    return [
        _row(
            f"prefix caching: TTFT p50, {n} req sharing 512 tokens",
            "no caching",
            "caching",
            plain.ttft_p50 / cached.ttft_p50,
            f"{1e3 * plain.ttft_p50:.0f} ms",
            f"{1e3 * cached.ttft_p50:.0f} ms",
            5.0,
            note=f"hit rate {cached.engine_metrics['prefix_cache_hit_rate']:.0%}",
            same=plain.outputs == cached.outputs,
        )
    ]


def chunked_workload(tok, quick: bool):
    short = make_workload(
        tok, 8 if quick else 16, rate=None, prompt_len=(16, 32), output_len=(96, 128) if quick else (160, 256), seed=2
    )
    long = make_workload(tok, 4 if quick else 8, rate=4.0, prompt_len=(600, 760), output_len=(8, 16), seed=3)
    long = [type(w)(w.prompt, w.max_tokens, w.arrival + 0.5) for w in long]  # they arrive once decoding runs
    return short + long, len(short)


def rows_chunked_prefill(model, tok, quick: bool) -> list[dict]:
    wl, n_short = chunked_workload(tok, quick)
    rows = []
    for label, kw in (
        ("without chunking", dict(chunked_prefill=False)),
        ("chunked, 64-token budget", dict(max_num_batched_tokens=64)),
        ("chunked, 32-token budget", dict(max_num_batched_tokens=32)),
    ):
        r = run_engine(Engine(model, num_blocks=1024, max_num_seqs=32, **kw), wl, label)
        itl = [b - a for t in r.token_times[:n_short] for a, b in zip(t, t[1:])]  # the running requests
        itl.sort()
        p50, p99 = itl[len(itl) // 2], itl[int(0.99 * (len(itl) - 1))]
        rows.append(
            _row(
                f"running requests' ITL p99 / p50, {label}",
                "p50",
                "p99",
                p99 / p50,
                f"{1e3 * p50:.1f} ms",
                f"{1e3 * p99:.1f} ms",
                None,
                note="target: chunked <= 2x" if "chunked" in label else "",
            )
        )
    return rows


def rows_goodput(model, tok, quick: bool) -> list[dict]:
    """Goodput at rising Poisson load (goodput.py): static batching, continuous batching, and continuous
    batching with chunked prefill, each against sequential generate, same workload, rates and targets
    (in units of sequential generate's measured seconds per request and TPOT, so they ask the same of
    any CPU). The batched designs run the engine's compiled step, as the server does; sequential is eager
    `generate`, the baseline the targets are counted in. Each row reports the best goodput each design reaches
    over the rates, and its knee."""
    n = 16 if quick else 48
    wl = make_workload(tok, n, rate=1.0, prompt_len=(16, 128), output_len=(16, 64), seed=5)
    service, tpot = sequential_service(model, wl)
    unit = 1 / service
    # steps of sqrt(2) from 0.5 to 16: a design's knee, and so its best goodput, is only as fine as the grid
    # (with steps of 2, sequential's best goodput came out as 0.5x or 1x of its rate from one run to the next)
    factors = LOAD_FACTORS if quick else tuple(2 ** (k / 2) for k in range(-2, 9))
    # the engines as the server runs them: the step compiled (once per process, before any clock)
    engines = dict(num_blocks=1024, max_num_seqs=16, compile_step="autotune")
    sweep = goodput_sweep(
        model,
        wl,
        [f * unit for f in factors],
        TTFT_TARGET_SERVICES * service,
        TPOT_TARGET_TPOTS * tpot,
        engine_args=engines,
    )

    def knee(design):
        k = sweep.knee(design)
        return "none" if k is None else f"{k / unit:.2g}x"

    base = sweep.best("sequential")
    stated = (
        f"TTFT <= {1e3 * sweep.ttft_target:.0f} ms, TPOT <= {1e3 * sweep.tpot_target:.1f} ms "
        f"({TTFT_TARGET_SERVICES} sequential services, {TPOT_TARGET_TPOTS} sequential TPOTs); best over load "
        f"{', '.join(f'{f:.2g}' for f in factors)} x {unit:.1f} req/s; knee (>= 90% meet both) "
        f"sequential {knee('sequential')}"
    )
    return [
        _row(
            f"goodput, {design} (compiled step) vs sequential ({n} req, Poisson)",
            "sequential",
            design,
            sweep.best(design) / max(base, 1e-9),
            f"{base:.2f} req/s",
            f"{sweep.best(design):.2f} req/s",
            4.0 if design == "continuous + chunked prefill" else None,
            note=f"{stated}, {design} {knee(design)}",
        )
        for design in list(sweep.runs)[1:]
    ]


ONLY = {"batch_invariance": rows_batch_invariance, "goodput": rows_goodput}  # --only's groups of rows


def serving_rows(model, tok, quick: bool = False) -> list[dict]:
    return (
        rows_paged_step(model, quick)
        + rows_batching(model, tok, quick)
        + rows_batch_invariance(model, tok, quick)
        + rows_prefix_caching(model, tok, quick)
        + rows_chunked_prefill(model, tok, quick)
        + rows_goodput(model, tok, quick)
    )


def main(argv=None):
    from ..checkpoint import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--only", choices=sorted(ONLY), help="run only these rows")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, tok = load_model("target")
    rows = ONLY[args.only](model, tok, args.quick) if args.only else serving_rows(model, tok, args.quick)
    for r in rows:
        goal = "" if r["target"] is None else f"target {r['target']:g}"
        same = "" if r["same_output"] is None else ("same tokens" if r["same_output"] else "tokens differ")
        print(
            f"{r['name']:64s} {r['ratios'][0]:6.2f}  {r['baseline_abs']:>10s} -> {r['candidate_abs']:<10s} "
            f"{goal:10s} {same} {r['note']}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
