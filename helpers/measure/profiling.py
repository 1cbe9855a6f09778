"""Where the time of one step goes: the torch calls Python makes, and torch.profiler's split of the time.

    calls = count_torch_calls(lambda: decode_one_token(model, tok, cache))   # Counter: name -> calls
    prof = profile_step(lambda: decode_one_token(model, tok, cache), steps=20)
    prof.aten_ops_per_step, prof.matmul_share, prof.table(10)

Two different counts, on purpose:

- `count_torch_calls` intercepts every torch function and tensor method called from Python (a
  `TorchFunctionMode`): what the model's code asks for, the same on every machine and device;
- `profile_step` runs torch.profiler and counts the ATen operators those calls dispatched (a call may
  dispatch several: `F.linear` -> `aten::linear` -> `aten::t`, `aten::matmul`, `aten::mm`), with their
  time. Matmul time is the *self* time of the matrix-multiply operators; everything else (the other
  kernels and all the dispatch between them) is "the rest".

Out of scope: GPU kernel timelines (the profiler's CUDA activity), memory profiling, traces on disk.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

# torch.profiler's CPU tracer (kineto) writes "USDT: ... profiler_start" and "profiler_stop" to stderr on
# every profile, a log level above its errors: a notebook cell would show them under every table. Level 6
# silences kineto's own log (read when a profile starts; set KINETO_LOG_LEVEL yourself to see it again).
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

# the operators that do a matrix multiply on a CPU (the kernel itself, not the wrappers around it)
MATMUL_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::_weight_int8pack_mm",
        "aten::_weight_int4pack_mm_for_cpu",
        "mkldnn::_linear_pointwise",
    }
)


class _CountCalls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", repr(func))
        if name != "__get__":  # reading an attribute such as x.shape or x.dtype is not an operation
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))


@torch.no_grad()
def count_torch_calls(fn) -> Counter:
    """How many times each torch function / tensor method is called from Python while fn() runs."""
    mode = _CountCalls()
    with mode:
        fn()
    return mode.calls


@dataclass(frozen=True)
class StepProfile:
    steps: int
    ops: dict  # ATen operator name -> (calls, self seconds), summed over all steps
    wall_seconds: float  # profiled wall time of all steps (the profiler itself adds some)

    @property
    def aten_ops_per_step(self) -> float:
        return sum(c for c, _ in self.ops.values()) / self.steps

    @property
    def self_seconds_per_step(self) -> float:
        return sum(s for _, s in self.ops.values()) / self.steps

    @property
    def matmul_seconds_per_step(self) -> float:
        return sum(s for name, (_, s) in self.ops.items() if name in MATMUL_OPS) / self.steps

    @property
    def matmul_share(self) -> float:
        """Fraction of the profiled operator time spent inside matrix multiplies."""
        return self.matmul_seconds_per_step / self.self_seconds_per_step

    def table(self, rows: int = 10) -> str:
        lines = [f"{'operator':44s} {'calls/step':>10s} {'us/step':>9s} {'share':>6s}"]
        total = sum(s for _, s in self.ops.values())
        for name, (c, s) in sorted(self.ops.items(), key=lambda kv: -kv[1][1])[:rows]:
            lines.append(f"{name[:44]:44s} {c / self.steps:10.1f} {s / self.steps * 1e6:9.1f} {s / total:6.1%}")
        return "\n".join(lines)


@torch.no_grad()
def profile_step(fn, steps: int = 20, warmup: int = 3) -> StepProfile:
    """Run fn() `steps` times under torch.profiler (CPU activity) and sum each ATen operator's calls and
    self time. Only operators whose name starts with "aten::" or "mkldnn::" are kept (not the profiler's
    own markers)."""
    import time

    from torch.profiler import ProfilerActivity, profile

    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1; got {steps!r}")
    for _ in range(warmup):
        fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        wall = time.perf_counter() - t0
    ops = {}
    for e in prof.key_averages():
        if e.key.startswith(("aten::", "mkldnn::")):
            ops[e.key] = (e.count, e.self_cpu_time_total / 1e6)
    return StepProfile(steps=steps, ops=ops, wall_seconds=wall)
