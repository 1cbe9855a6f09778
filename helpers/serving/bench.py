"""python -m helpers.serving.bench: the serving targets of chapter 13, measured side by side in one run.

    python -m helpers.serving.bench            # the issue's sizes (several minutes on a 2-core CPU)
    python -m helpers.serving.bench --quick    # smaller workloads, about a minute

Rows (each a ratio measured in this run, next to the course's target):
  continuous batching vs sequential generate, and vs static batching: 64 requests, 32 running at once,
      prompts 16-128 tokens, outputs 16-256 tokens (uniform), all arriving at time 0;
  KV memory: share of allocated block slots holding live tokens; requests running at once vs how many
      contiguous max-length (max_seq_len) reservations fit in the same bytes;
  prefix caching: 32 requests sharing a 512-token prefix, Poisson arrivals: TTFT p50 without / with;
  chunked prefill: long prompts arriving while short requests decode: p99 / p50 inter-token latency.

`serving_rows(model, tok, quick)` returns the rows as dicts with helpers.bench.Row's fields, so the
course bench can add them: `rows += [Row(**d) for d in serving_rows(model, tok, quick)]`.

Out of scope: a real network front end (chapter 14) and GPU runs (the same code runs there, untuned).
"""
from __future__ import annotations

import argparse
import json

import torch

from .engine import Engine
from .workload import make_workload, run_engine, run_sequential


def _row(name, baseline, candidate, ratio, baseline_abs, candidate_abs, target=None, note="", same=None, **extra):
    return dict(name=name, baseline=baseline, candidate=candidate, ratios=[float(ratio)], baseline_abs=baseline_abs,
                candidate_abs=candidate_abs, target=target, note=note, same_output=same, extra=extra)


def rows_batching(model, tok, quick: bool) -> list[dict]:
    n, out_len = (24, (16, 96)) if quick else (64, (16, 256))
    wl = make_workload(tok, n, rate=None, prompt_len=(16, 128), output_len=out_len, seed=0)
    num_blocks = 512  # 8192 token slots: 8 contiguous max_seq_len reservations
    seq = run_sequential(model, wl)
    static = run_engine(Engine(model, num_blocks=num_blocks, max_num_seqs=32, policy="static"), wl, "static")
    cont_engine = Engine(model, num_blocks=num_blocks, max_num_seqs=32)
    cont = run_engine(cont_engine, wl, "continuous")
    differ = sum(a != b for a, b in zip(cont.outputs, seq.outputs))
    m = cont.engine_metrics
    contiguous_fit = num_blocks * cont_engine.block_size // model.cfg.max_seq_len
    rows = [
        _row(f"continuous batching vs sequential generate ({n} req, 32 running)", "sequential", "continuous",
             cont.throughput / seq.throughput, f"{seq.throughput:.0f} tok/s", f"{cont.throughput:.0f} tok/s", 6.0,
             note=f"{differ} of {n} outputs differ (batch invariance)", same=differ == 0),
        _row("continuous vs static batching (same batch size 32)", "static", "continuous",
             cont.throughput / static.throughput, f"{static.throughput:.0f} tok/s", f"{cont.throughput:.0f} tok/s", 1.7,
             same=cont.outputs == static.outputs),
        _row("KV slots holding live tokens (paged, block 16)", "allocated", "live", m["kv_utilisation"],
             "", f"{m['kv_utilisation']:.1%}", 0.9, note=f"{m['preemptions']} preemptions"),
        _row("requests running at once vs contiguous max-length reservation", "contiguous", "paged",
             m["peak_running"] / contiguous_fit, f"{contiguous_fit} req", f"{m['peak_running']} req", 3.0),
    ]
    return rows


def rows_prefix_caching(model, tok, quick: bool) -> list[dict]:
    n = 12 if quick else 32
    wl = make_workload(tok, n, rate=4.0, prompt_len=(16, 64), output_len=(16, 64), seed=1, shared_prefix_len=512)
    plain = run_engine(Engine(model, num_blocks=1024, max_num_seqs=32), wl, "no prefix caching")
    cached = run_engine(Engine(model, num_blocks=1024, max_num_seqs=32, enable_prefix_caching=True), wl,
                        "prefix caching")
    return [_row(f"prefix caching: TTFT p50, {n} req sharing 512 tokens", "no caching", "caching",
                 plain.ttft_p50 / cached.ttft_p50, f"{1e3 * plain.ttft_p50:.0f} ms", f"{1e3 * cached.ttft_p50:.0f} ms",
                 5.0, note=f"hit rate {cached.engine_metrics['prefix_cache_hit_rate']:.0%}",
                 same=plain.outputs == cached.outputs)]


def chunked_workload(tok, quick: bool):
    short = make_workload(tok, 8 if quick else 16, rate=None, prompt_len=(16, 32),
                          output_len=(96, 128) if quick else (160, 256), seed=2)
    long = make_workload(tok, 4 if quick else 8, rate=4.0, prompt_len=(600, 760), output_len=(8, 16), seed=3)
    long = [type(w)(w.prompt, w.max_tokens, w.arrival + 0.5) for w in long]  # they arrive once decoding runs
    return short + long, len(short)


def rows_chunked_prefill(model, tok, quick: bool) -> list[dict]:
    wl, n_short = chunked_workload(tok, quick)
    rows = []
    for label, kw in (("without chunking", dict(chunked_prefill=False)),
                      ("chunked, 64-token budget", dict(max_num_batched_tokens=64)),
                      ("chunked, 32-token budget", dict(max_num_batched_tokens=32))):
        r = run_engine(Engine(model, num_blocks=1024, max_num_seqs=32, **kw), wl, label)
        itl = [b - a for t in r.token_times[:n_short] for a, b in zip(t, t[1:])]  # the running requests
        itl.sort()
        p50, p99 = itl[len(itl) // 2], itl[int(0.99 * (len(itl) - 1))]
        rows.append(_row(f"running requests' ITL p99 / p50, {label}", "p50", "p99", p99 / p50,
                         f"{1e3 * p50:.1f} ms", f"{1e3 * p99:.1f} ms", None,
                         note="target: chunked <= 2x" if "chunked" in label else ""))
    return rows


def serving_rows(model, tok, quick: bool = False) -> list[dict]:
    return (rows_batching(model, tok, quick) + rows_prefix_caching(model, tok, quick)
            + rows_chunked_prefill(model, tok, quick))


def main(argv=None):
    from ..checkpoint import load_model
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, tok = load_model("target")
    rows = serving_rows(model, tok, args.quick)
    for r in rows:
        goal = "" if r["target"] is None else f"target {r['target']:g}"
        same = "" if r["same_output"] is None else ("same tokens" if r["same_output"] else "tokens differ")
        print(f"{r['name']:64s} {r['ratios'][0]:6.2f}  {r['baseline_abs']:>10s} -> {r['candidate_abs']:<10s} "
              f"{goal:10s} {same} {r['note']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
