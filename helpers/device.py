"""Choosing a device once, and timing on it honestly.

`default_device()` picks cuda -> mps -> cpu, once. Everything else derives the device from its
inputs (`tensor.device`, `model.device`) rather than asking again. GPU work is asynchronous: a clock
read without `synchronize` measures how fast Python queued the work, not how fast it ran.

Out of scope: multi-GPU placement.
"""
from __future__ import annotations

import os
import statistics
import time
from functools import lru_cache

import torch


@lru_cache(maxsize=None)
def default_device() -> torch.device:
    """cuda if present, else Apple's mps, else cpu. Set LLM_COURSE_DEVICE=cpu to force a choice."""
    forced = os.environ.get("LLM_COURSE_DEVICE")
    if forced:
        return torch.device(forced)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on a GPU that supports it (half the bytes to move, tensor cores); fp32 on a CPU."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def synchronize(device) -> None:
    """Wait until all queued work on `device` has finished (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_call(fn, device, repeats: int = 5, warmup: int = 1) -> list[float]:
    """Seconds per call of fn(), each measured between two synchronisations."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return times


def time_interleaved(fns, device, repeats: int = 5, warmup: int = 1, block: int = 1) -> list[list[float]]:
    """Seconds per call of each function in fns, called in turn (fns[0], fns[1], ..., fns[0], ...), so that
    a change in the machine's speed (a shared VM, a CPU changing clock) hits all of them alike: a ratio of
    their medians is then fair where back-to-back timings of each are not. One list per function.

    block > 1: each turn calls the function once untimed and then `block` times, recording the mean of
    those. Use it when the functions read different data (two models, two copies of the weights): called
    one after another, each finds the CPU's caches full of the other's data, and runs slower than it does
    in its own loop."""
    if block < 1:
        raise ValueError(f"block must be >= 1; got {block}")
    for _ in range(warmup):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            if block > 1:
                fn()  # brings its data back into the caches
            synchronize(device)
            t0 = time.perf_counter()
            for _ in range(block):
                fn()
            synchronize(device)
            out.append((time.perf_counter() - t0) / block)
    return times


def median(xs) -> float:
    return statistics.median(xs)
