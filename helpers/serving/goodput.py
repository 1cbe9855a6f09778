"""Goodput under a latency target: one workload at rising offered load through four serving designs.

    wl = make_workload(tok, 10, rate=1.0, prompt_len=(16, 128), output_len=(8, 16), seed=1)
    service, tpot = sequential_service(model, wl)        # measured: seconds per request, TPOT alone
    rates = [f / service for f in LOAD_FACTORS]
    sweep = goodput_sweep(model, wl, rates, TTFT_TARGET_SERVICES * service, TPOT_TARGET_TPOTS * tpot)
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

Units that mean the same on any machine, measured by `sequential_service` (the workload served back to
back by sequential generate): the rates are multiples of the rate sequential decoding serves, 1 / its
seconds per request, so at load factor 1 it is just busy and above it its queue, and TTFT, grow for as
long as arrivals last; the targets are TTFT <= 3 of those seconds per request and TPOT <= 3 times its
median TPOT.

Goodput is DistServe's: requests per second that meet both a TTFT target and a TPOT target (workload.py,
RunResult.goodput). The knee of a design is the highest offered rate of the sweep at which it, and every
lower rate, has at least `slo_share` (90%) of its requests meeting both targets (DistServe's SLO
attainment); None when even the lowest rate misses. Below the knee goodput follows the offered load
(less the time the last requests take to finish); past it requests start missing their targets, by
queueing (TTFT) or by sharing steps (TPOT).

Left out: an open-loop generator that keeps sending while a design falls behind (each rate's arrivals
are fixed in advance, so an overloaded design's queue drains at the end), several seeds per rate, and a
search for the knee between the rates given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .engine import Engine
from .workload import RunResult, WorkloadRequest, percentile, run_engine, run_sequential

# name -> Engine keyword arguments (None: sequential generate, no engine)
DESIGNS: dict[str, dict | None] = {
    "sequential": None,
    "static": dict(policy="static"),
    "continuous": dict(chunked_prefill=False),
    "continuous + chunked prefill": dict(max_num_batched_tokens=64),
}


TTFT_TARGET_SERVICES, TPOT_TARGET_TPOTS = 3, 3  # the targets, in sequential_service's two units
LOAD_FACTORS = (1.0, 2.0, 4.0, 8.0)  # offered load, in multiples of 1 / (sequential seconds per request)


def sequential_service(model, workload: list[WorkloadRequest]) -> tuple[float, float]:
    """Sequential generate serving `workload` back to back (all arriving at once), the faster of two passes,
    measured: (seconds per request, median TPOT in seconds). 1 / the first is the rate one-at-a-time
    decoding serves, the load unit; the targets are counted in both, so they ask the same of any machine."""
    at_once = [WorkloadRequest(w.prompt, w.max_tokens, 0.0) for w in workload]
    # twice, the faster kept: the first pass also pays one-off costs (allocator, caches) the sweep does not
    run = min((run_sequential(model, at_once, "sequential, back to back") for _ in range(2)), key=lambda r: r.makespan)
    return run.makespan / len(workload), percentile(run.tpots(), 50)


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
