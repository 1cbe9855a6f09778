"""Timing, the one way the course does it: synchronise, read the clock, repeat, take the median.

    seconds = time_call(fn, device, repeats=9)                     # one list of seconds per call of fn()
    t_a, t_b = time_interleaved([a, b], device, repeats=9)          # a, b, a, b, ...: the ratio is fair
    seconds, out = timed(lambda: generate(model, prompt, 64), device)   # one call: its seconds and its result
    median(seconds), spread(seconds)                                # the number to quote, and (min, max)
    decode_step_seconds(model)                                      # median seconds of one batch-1 decode step
    compiled_step_seconds(fast)                                     # the same for a FastGenerator's compiled step

Every timer synchronises the device before it reads the clock: GPU work is asynchronous, and a clock read
without a synchronisation measures how fast Python queued the work, not how fast it ran (on a CPU the
synchronisation does nothing). Every timer can run warm-up calls first, untimed: the first call of anything
pays for allocation, lazy initialisation and, for a compiled step, compilation.

Why interleave: on a shared machine (a VM, a laptop changing its clock) speed drifts over seconds. Timing A
ten times and then B ten times lets a drift land on one of them; alternating A and B lets it hit both alike,
so the ratio of their medians stays fair. Why medians: one call delayed by another process is an outlier,
and a median ignores it where a mean does not.

`step_seconds` times each of several successive decode steps (the state they advance is the cache):
`decode_step_seconds` and `compiled_step_seconds` build a random prompt, prefill it, and time the steps
after it. Left out: the profiler (profiling.py, a different question: where the time goes inside one step),
wall-clock metrics of a running server (time to first token, inter-token gaps: serving/), and measured
ceilings (roofline.py, calibration.py), which use these timers.
"""

from __future__ import annotations

import statistics
import time
from functools import partial
from typing import Any, Callable

import torch

from ..device import synchronize
from ..kv_cache import KVCache

__all__ = [
    "median",
    "spread",
    "timed",
    "time_call",
    "time_interleaved",
    "step_seconds",
    "decode_step_seconds",
    "compiled_step_seconds",
]


def median(xs) -> float:
    """The median of a list of timings (the number the course quotes)."""
    return statistics.median(xs)


def spread(xs) -> tuple[float, float]:
    """(min, max) of a list of timings or ratios: how far the repeats disagreed."""
    return min(xs), max(xs)


def _check_counts(repeats: int, warmup: int) -> None:
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1; got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0; got {warmup!r}")


def timed(fn: Callable[[], Any], device) -> tuple[float, Any]:
    """Call fn() once between two synchronisations: (seconds, what fn returned). For a call too long to
    repeat (a whole generation); its result comes back too, so the caller can check what was timed."""
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return time.perf_counter() - t0, out


def time_call(fn: Callable[[], Any], device, repeats: int = 5, warmup: int = 1) -> list[float]:
    """Seconds of each of `repeats` calls of fn(), after `warmup` untimed calls."""
    _check_counts(repeats, warmup)
    for _ in range(warmup):
        fn()
    return [timed(fn, device)[0] for _ in range(repeats)]


def time_interleaved(fns, device, repeats: int = 5, warmup: int = 1, block: int = 1) -> list[list[float]]:
    """Seconds per call of each function in fns, called in turn (fns[0], fns[1], ..., fns[0], ...), so that
    a change in the machine's speed hits all of them alike: a ratio of their medians is then fair where
    back-to-back timings of each are not. One list per function, `repeats` long.

    block > 1: each turn calls the function once untimed and then `block` times, recording the mean of
    those. Use it when the functions read different data (two models, two copies of the weights): called
    one after another, each finds the CPU's caches full of the other's data, and runs slower than it does
    in its own loop."""
    _check_counts(repeats, warmup)
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an int >= 1; got {block!r}")
    for _ in range(warmup):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            if block > 1:
                fn()  # brings its data back into the caches
            out.append(timed(lambda fn=fn: _call(fn, block), device)[0] / block)
    return times


def _call(fn, n: int) -> None:
    for _ in range(n):
        fn()


def greedy_next(x, logits: torch.Tensor) -> torch.Tensor:
    """step_seconds' default `advance`: the next input is the argmax token of the last position, (B, 1)."""
    return logits[:, -1].argmax(-1, keepdim=True) if logits.dim() == 3 else logits.argmax(-1, keepdim=True)


def step_seconds(
    step: Callable[[Any], Any], x, n_steps: int, device, advance=greedy_next, warmup: int = 0
) -> list[float]:
    """Seconds of each of `n_steps` successive steps: out = step(x) is timed between two synchronisations,
    x = advance(x, out) is not (by default the greedy next token, so `step` is "decode one token" and `x`
    the token it reads). The first `warmup` steps run but are not recorded. A step usually advances state of
    its own too (a KV cache): n_steps + warmup steps must fit it."""
    _check_counts(n_steps, warmup)
    times = []
    for i in range(warmup + n_steps):
        seconds, out = timed(partial(step, x), device)
        if i >= warmup:
            times.append(seconds)
        x = advance(x, out)
    return times


def _prefilled(model, cache, context: int, seed: int) -> torch.Tensor:
    """Reset `cache`, run a seeded random `context`-token prompt through `model` into it (as generate.prefill
    does, without its argument checks: these are the timers' own tensors); the greedy next token, (1, 1)."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.cfg.vocab_size, (1, context), generator=g).to(model.device)  # (1, context)
    cache.reset()
    return greedy_next(prompt, model(prompt, cache=cache, start_pos=0, last_only=True, check=False))


@torch.no_grad()
def decode_step_seconds(model, n_steps: int = 16, context: int = 16, seed: int = 0, warmup: int = 0) -> float:
    """Median seconds of one batch-1 greedy decode step (the model's forward over one token on a KVCache, what
    generate.decode_one_token runs) after a `context`-token random prompt (seeded: the same tokens every
    call). Any model with the Transformer's forward works (a quantized one too)."""
    cache = KVCache.for_model(model, max_seq_len=context + warmup + n_steps + 1)
    token = _prefilled(model, cache, context, seed)  # (1, 1)
    return median(
        step_seconds(lambda t: model(t, cache=cache, check=False), token, n_steps, model.device, warmup=warmup)
    )


def decode_steps_interleaved(models, repeats: int) -> list[list[float]]:
    """decode_step_seconds of each model in turn, `repeats` times (so that a change in the machine's speed
    hits all of them alike, as in time_interleaved): one list per model."""
    times = [[] for _ in models]
    for _ in range(repeats):
        for model, out in zip(models, times):
            out.append(decode_step_seconds(model))
    return times


@torch.no_grad()
def compiled_step_seconds(fast, n_steps: int = 16, context: int = 16, seed: int = 0, warmup: int = 0) -> float:
    """decode_step_seconds for a FastGenerator (fast_decode.py): median seconds of one compiled batch-1 step
    after a `context`-token random prompt, prefilled eagerly as FastGenerator.generate does. Compile it first
    (fast.warmup()): the first call of a cold generator compiles."""
    device = fast.model.device
    token = _prefilled(fast.decode_model, fast.cache, context, seed)  # (1, 1)
    # one position tensor per step, made before the clock starts: (1,) each, context, context + 1, ...
    positions = iter([torch.tensor([p], device=device) for p in range(context, context + warmup + n_steps)])
    return median(step_seconds(lambda t: fast.step(t, next(positions)), token, n_steps, device, warmup=warmup))
