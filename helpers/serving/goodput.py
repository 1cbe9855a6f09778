"""Goodput under a latency target: one workload at rising offered load through four serving designs.

    wl = make_workload(tok, 12, rate=1.0, prompt_len=(16, 128), output_len=(8, 24), seed=5)
    step = decode_step_seconds(model)                     # this machine's batch-1 decode step
    rates = [f * sequential_rate(wl, step) for f in LOAD_FACTORS]
    sweep = goodput_sweep(model, wl, rates, TTFT_TARGET_STEPS * step, TPOT_TARGET_STEPS * step)
    sweep.goodput("continuous")          # requests/s meeting both targets, one per rate
    sweep.knee("static")                 # the highest rate the design still serves (below)
    sweep.best("sequential")             # its best goodput over the rates

The designs (DESIGNS): sequential `generate`, one request at a time; static batching
(`Engine(policy="static")`); continuous batching with whole prompts (`chunked_prefill=False`); and
continuous batching with chunked prefill (a 64-token budget per step). Each batched design runs in a
fresh Engine with the same pool and batch limit (`engine_args`).

Load: at rate r the workload's arrival times are scaled so that its realised rate, (n - 1) requests over
the time from the first arrival to the last, is exactly r. Each rate replays the same requests (same
prompts, lengths and order of arrivals, same relative gaps), only closer together, so the curves differ
by load alone, not by which random sample each rate drew, and the offered rate is the one each run got.

Units that mean the same on any machine: the targets are counted in batch-1 decode steps s of the
machine (TTFT <= 50 s, TPOT <= 5 s), and the rates in multiples of `sequential_rate`, the requests per
second one-at-a-time decoding serves by the estimate 1 / (mean output tokens x s): at load factor 1
sequential decoding is just busy, so its queue, and TTFT, grow without bound above it (for as long
as arrivals last), on any machine.

Goodput is DistServe's: requests per second that meet both a TTFT target and a TPOT target (workload.py,
RunResult.goodput). The knee of a design is the highest offered rate of the sweep at which it, and every
lower rate, has at least `slo_share` (90%) of its requests meeting both targets (DistServe's SLO
attainment); None when even the lowest rate misses. Below the knee goodput follows the offered load;
past it requests start missing their targets, by queueing (TTFT) or by sharing steps (TPOT).

Left out: an open-loop generator that keeps sending while a design falls behind (each rate's arrivals
are fixed in advance, so an overloaded design's queue drains at the end), several seeds per rate, and a
search for the knee between the rates given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .engine import Engine
from .workload import RunResult, WorkloadRequest, run_engine, run_sequential

# name -> Engine keyword arguments (None: sequential generate, no engine)
DESIGNS: dict[str, dict | None] = {
    "sequential": None,
    "static": dict(policy="static"),
    "continuous": dict(chunked_prefill=False),
    "continuous + chunked prefill": dict(max_num_batched_tokens=64),
}


TTFT_TARGET_STEPS, TPOT_TARGET_STEPS = 50, 5  # the targets, in batch-1 decode steps
LOAD_FACTORS = (0.25, 1.0, 4.0, 16.0)  # offered load, in multiples of sequential_rate


def sequential_rate(workload: list[WorkloadRequest], step: float) -> float:
    """Requests/s that one-at-a-time decoding serves, estimated: 1 / (mean max_tokens * step seconds);
    prefill and the Python around each step are left out, so the true rate is somewhat lower."""
    if not step > 0:
        raise ValueError(f"step must be > 0 seconds; got {step!r}")
    return len(workload) / (sum(w.max_tokens for w in workload) * step)


def at_rate(workload: list[WorkloadRequest], rate: float) -> list[WorkloadRequest]:
    """The same requests, arrival times scaled so that (n - 1) / (last arrival - first) is `rate`."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests per second; got {rate!r}")
    first = min(w.arrival for w in workload)
    span = max(w.arrival for w in workload) - first
    if len(workload) < 2 or span <= 0:
        raise ValueError(
            "the workload needs at least two requests arriving at different times (make_workload(rate=...))"
        )
    scale = (len(workload) - 1) / (rate * span)
    return [WorkloadRequest(w.prompt, w.max_tokens, (w.arrival - first) * scale) for w in workload]


@dataclass
class GoodputSweep:
    rates: list[float]
    ttft_target: float  # seconds
    tpot_target: float  # seconds
    slo_share: float
    runs: dict[str, list[RunResult]] = field(default_factory=dict)  # design -> one run per rate, in rate order

    def goodput(self, design: str) -> list[float]:
        return [r.goodput(self.ttft_target, self.tpot_target) for r in self.runs[design]]

    def attainment(self, design: str) -> list[float]:
        """Share of the requests meeting both targets, per rate."""
        return [r.num_met(self.ttft_target, self.tpot_target) / len(r.outputs) for r in self.runs[design]]

    def knee(self, design: str) -> float | None:
        """The highest rate at which this and every lower rate had >= slo_share of requests meet both targets."""
        knee = None
        for rate, share in zip(self.rates, self.attainment(design)):
            if share < self.slo_share:
                break
            knee = rate
        return knee

    def best(self, design: str) -> float:
        return max(self.goodput(design))

    def series(self, design: str, key: str) -> list[float]:
        """A RunResult property per rate, e.g. "ttft_p99" or "tpot_p50" (seconds)."""
        return [getattr(r, key) for r in self.runs[design]]


def goodput_sweep(
    model,
    workload: list[WorkloadRequest],
    rates,
    ttft_target: float,
    tpot_target: float,
    designs: dict[str, dict | None] | None = None,
    engine_args: dict | None = None,
    slo_share: float = 0.9,
    progress=None,
) -> GoodputSweep:
    """Replay `workload` (Poisson arrivals at any rate) at each of `rates` through each design; see the module
    docstring. engine_args: what every batched design's Engine gets (default a 1,024-block pool, 16
    running). progress: a bar updated with each run's generated tokens."""
    rates = sorted(float(r) for r in rates)
    if not rates or rates[0] <= 0:
        raise ValueError(f"rates must be a non-empty list of rates > 0; got {rates!r}")
    if not (ttft_target > 0 and tpot_target > 0):
        raise ValueError(f"ttft_target and tpot_target must be > 0 seconds; got {ttft_target!r}, {tpot_target!r}")
    if not 0 < slo_share <= 1:
        raise ValueError(f"slo_share must be in (0, 1]; got {slo_share!r}")
    designs = DESIGNS if designs is None else designs
    engine_args = dict(num_blocks=1024, max_num_seqs=16) if engine_args is None else engine_args
    sweep = GoodputSweep(rates, ttft_target, tpot_target, slo_share, {name: [] for name in designs})
    for rate in rates:
        wl = at_rate(workload, rate)
        for name, kw in designs.items():
            label = f"{name}, {rate:g} req/s"
            if kw is None:
                run = run_sequential(model, wl, label, progress=progress)
            else:
                run = run_engine(Engine(model, **{**engine_args, **kw}), wl, label, progress=progress)
            sweep.runs[name].append(run)
    return sweep
