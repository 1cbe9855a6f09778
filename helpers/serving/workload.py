"""Synthetic serving workloads, replayed through sequential generate, static batching or the engine.

A workload is a list of requests with an arrival time, a prompt cut from the held-out validation text
and a number of tokens to generate (greedy, no end-of-text stop, so every policy does the same work):

    wl = make_workload(tok, n=64, rate=None, prompt_len=(16, 128), output_len=(16, 256), seed=0)
    seq = run_sequential(model, wl)                       # one request at a time with helpers.generate
    cont = run_engine(Engine(model, num_blocks=512), wl)  # continuous batching
    cont.throughput, cont.ttft_p50, cont.itl_p99
    cont.goodput(ttft_target=0.5, tpot_target=0.05)       # requests/s meeting both latency targets

Distributions, stated: prompt and output lengths uniform on the given inclusive ranges; arrivals a
Poisson process of `rate` requests per second (exponential gaps), or all at time 0 when rate is None;
an optional shared prefix (the same first tokens for every prompt, as a system prompt would be).

Time is the engine's clock (engine.py): measured compute, with idle gaps skipped, so a replay takes
only as long as its compute. Sequential generate is charged the same way: each request starts at
max(its arrival, the end of the previous one) and is charged its measured duration.

Out of scope: client-side network and detokenisation time, and open-loop load generators that keep
sending while the server falls behind (arrivals here are fixed in advance).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..generate import generate


@dataclass(frozen=True)
class WorkloadRequest:
    prompt: list[int]
    max_tokens: int
    arrival: float  # seconds


def make_workload(
    tokenizer,
    n: int,
    rate: float | None = None,
    prompt_len=(16, 128),
    output_len=(16, 256),
    seed: int = 0,
    shared_prefix_len: int = 0,
    source_ids=None,
) -> list[WorkloadRequest]:
    """n requests whose prompts are windows of `source_ids` (default: the first 100,000 characters of the
    validation text, encoded), each led by the same first `shared_prefix_len` tokens of it."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1; got {n!r}")
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be > 0 requests per second, or None (all at once); got {rate!r}")
    if source_ids is None:
        from ..data import validation_text

        source_ids = tokenizer.encode(validation_text()[:100_000])
    ids = [int(t) for t in source_ids]
    rng = np.random.default_rng(seed)
    prefix = ids[:shared_prefix_len]
    p_lens = rng.integers(prompt_len[0], prompt_len[1] + 1, n)
    o_lens = rng.integers(output_len[0], output_len[1] + 1, n)
    gaps = rng.exponential(1 / rate, n) if rate is not None else np.zeros(n)
    arrivals = np.cumsum(gaps) - gaps[0]  # the first request arrives at 0
    out = []
    for p, o, a in zip(p_lens.tolist(), o_lens.tolist(), arrivals.tolist()):
        start = int(rng.integers(shared_prefix_len, len(ids) - p))
        out.append(WorkloadRequest(prefix + ids[start : start + p], o, float(a)))
    return out


def percentile(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def percentile_of(samples: str, q: float) -> property:
    """A read-only property: the q-th percentile of the list the property or method `samples` returns (nan if
    empty)."""

    def value(self):
        got = getattr(self, samples)
        return percentile(got() if callable(got) else got, q)  # tpots is a method, the others properties

    return property(value, doc=f"The {q}th percentile of {samples}, in seconds (nan when there are none).")


@dataclass
class RunResult:
    name: str
    outputs: list[list[int]]
    arrivals: list[float]
    token_times: list[list[float]]
    engine_metrics: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def makespan(self) -> float:
        """First arrival to last token."""
        return max(t[-1] for t in self.token_times if t) - min(self.arrivals)

    @property
    def throughput(self) -> float:
        return self.num_tokens / self.makespan

    @property
    def ttfts(self) -> list[float]:
        return [t[0] - a for t, a in zip(self.token_times, self.arrivals) if t]

    @property
    def itls(self) -> list[float]:
        return [b - a for t in self.token_times for a, b in zip(t, t[1:])]

    ttft_p50 = percentile_of("ttfts", 50)
    ttft_p99 = percentile_of("ttfts", 99)
    itl_p50 = percentile_of("itls", 50)
    itl_p99 = percentile_of("itls", 99)

    def tpots(self) -> list[float]:
        """Each request's mean time per output token after its first: (last - first) / (n - 1)."""
        return [(t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else 0.0 for t in self.token_times if t]

    tpot_p50 = percentile_of("tpots", 50)
    tpot_p99 = percentile_of("tpots", 99)

    def num_met(self, ttft_target: float, tpot_target: float) -> int:
        """Requests that met both targets (seconds): TTFT <= ttft_target and TPOT <= tpot_target."""
        return sum(1 for ttft, tpot in zip(self.ttfts, self.tpots()) if ttft <= ttft_target and tpot <= tpot_target)

    def goodput(self, ttft_target: float, tpot_target: float) -> float:
        """Requests per second that met both targets, over the run's makespan (DistServe's goodput)."""
        return self.num_met(ttft_target, tpot_target) / self.makespan

    def row(self) -> str:
        """One line: throughput, then TTFT and inter-token latency as p50 / p99 in milliseconds."""
        return (
            f"{self.name:<26}{self.throughput:7.0f} tok/s   TTFT {1e3 * self.ttft_p50:7.1f} / "
            f"{1e3 * self.ttft_p99:7.1f} ms   ITL {1e3 * self.itl_p50:5.1f} / {1e3 * self.itl_p99:6.1f} ms"
        )


def run_engine(engine, workload: list[WorkloadRequest], name: str = "engine", progress=None) -> RunResult:
    """Submit each request when the engine's clock reaches its arrival; step until all are done."""
    order = sorted(range(len(workload)), key=lambda i: workload[i].arrival)
    ids: dict[int, str] = {}
    nxt = 0
    t_offset = engine.time  # the workload's time 0 on this engine's clock
    while nxt < len(order) or engine.has_unfinished():
        while nxt < len(order) and workload[order[nxt]].arrival + t_offset <= engine.time:
            w = workload[order[nxt]]
            ids[order[nxt]] = engine.submit(w.prompt, w.max_tokens, arrival_time=w.arrival + t_offset)
            nxt += 1
        if not engine.has_unfinished():
            engine.advance_to(workload[order[nxt]].arrival + t_offset)  # idle until the next arrival
            continue
        for out in engine.step():
            if progress is not None:
                progress.update(len(out.new_token_ids))
    reqs = [engine.get(ids[i]) for i in range(len(workload))]
    return RunResult(
        name, [r.output for r in reqs], [r.arrival_time for r in reqs], [r.token_times for r in reqs], engine.metrics()
    )


def run_sequential(
    model, workload: list[WorkloadRequest], name: str = "sequential generate", progress=None
) -> RunResult:
    """Each request alone with helpers.generate, in arrival order; token times recorded by a stop criterion
    that never stops (it is called right after each new token but the last, which is timed at return)."""
    clock, outputs, times = 0.0, [None] * len(workload), [None] * len(workload)
    for i in sorted(range(len(workload)), key=lambda i: workload[i].arrival):
        w = workload[i]
        start = max(clock, w.arrival)
        stamps: list[float] = []
        t0 = time.perf_counter()
        out = generate(model, w.prompt, w.max_tokens, stop_criteria=[_stamper(stamps)])
        end = time.perf_counter()
        clock = start + end - t0
        outputs[i] = out[0, len(w.prompt) :].tolist()
        stamps += [end] * (len(outputs[i]) - len(stamps))  # the last token: generate asks no criterion after it
        times[i] = [start + s - t0 for s in stamps]
        if progress is not None:
            progress.update(w.max_tokens)
    return RunResult(name, outputs, [w.arrival for w in workload], times)


def _stamper(stamps: list[float]):
    """A stop criterion that never stops: it records when each token appeared."""

    def stamp(generated) -> bool:
        stamps.append(time.perf_counter())
        return False

    return stamp
