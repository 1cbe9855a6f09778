"""Choosing a device once, and waiting for it.

`default_device()` picks cuda -> mps -> cpu, once. Everything else derives the device from its
inputs (`tensor.device`, `model.device`) rather than asking again. GPU work is asynchronous: a clock
read without `synchronize` measures how fast Python queued the work, not how fast it ran; the course's
timers (measure/timing.py) synchronise for you.

Out of scope: multi-GPU placement, timing (measure/timing.py).
"""

from __future__ import annotations

import os
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
