"""Baselines the serving bench sets the engine beside, each run over the same workload (workload.py).

    fast = run_fast_sequential(model, wl)          # the course's compiled single-stream decode, one by one
    hf = run_hf_generate_batch(model, wl, 32)      # transformers' continuous batching (None if absent)

Both return a RunResult (outputs and finish times) so bench.py compares them with `run_engine` and
`run_sequential` (workload.py: the engine, and eager `generate` one request at a time). All requests arrive
at time 0: these baselines give throughput, not latency under load.

Left out: arrival times (neither baseline is an online server here) and per-token timestamps.
"""

from __future__ import annotations

import time

from .workload import RunResult


def run_fast_sequential(model, workload) -> RunResult:
    """Each request alone through one FastGenerator (compiled once, before the clock starts), in order."""
    from ..fast_decode import FastGenerator

    longest = max(len(w.prompt) + w.max_tokens for w in workload)
    fast = FastGenerator(model, max_seq_len=longest)
    fast.warmup()
    clock, outputs, times = 0.0, [], []
    for w in workload:  # all arrive at time 0: arrival order is submission order
        t0 = time.perf_counter()
        out = fast.generate(w.prompt, w.max_tokens)
        clock += time.perf_counter() - t0
        outputs.append(out[0, len(w.prompt) :].tolist())
        times.append([clock])  # only the finish time is kept: throughput needs no more
    return RunResult("sequential FastGenerator", outputs, [w.arrival for w in workload], times)


def run_hf_generate_batch(model, workload, max_running: int) -> RunResult | None:
    """transformers' own continuous batching (the manager behind `generate_batch`) on the same model and
    requests, greedy, each request with its own max_new_tokens; the clock starts once the manager is up
    (its warm-up excluded). None where the installed transformers lacks it."""
    from transformers import GenerationConfig

    from ..hf import to_hf_llama

    hf = to_hf_llama(model)
    if not hasattr(hf, "continuous_batching_context_manager"):
        return None
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(
        max_new_tokens=max(w.max_tokens for w in workload), do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    results = {}
    with hf.continuous_batching_context_manager(
        generation_config=config,
        block=True,
        timeout=5,
        continuous_batching_config=ContinuousBatchingConfig(max_requests_per_batch=max_running),
    ) as manager:
        t0 = time.perf_counter()
        for i, w in enumerate(workload):
            manager.add_request(w.prompt, request_id=f"r{i}", max_new_tokens=w.max_tokens, eos_token_id=-1)
        while len(results) < len(workload):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                results[result.request_id] = result
            elif result is None and not manager.is_running():
                raise RuntimeError("transformers' continuous batching stopped before finishing")
        seconds = time.perf_counter() - t0
    outputs = [list(results[f"r{i}"].generated_tokens) for i in range(len(workload))]
    return RunResult(
        "transformers generate_batch", outputs, [w.arrival for w in workload], [[seconds] for _ in workload]
    )
