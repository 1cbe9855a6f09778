"""Chapter 05's allocation simulator: contiguous vs paged KV memory, counted in token slots, with no tensors.

How much of the memory set aside for keys and values holds tokens? The real paged cache, with tensors, a
block pool and a scheduler, is helpers/serving/ (chapter 13); this module only counts slots.

A server keeps a KV cache for every request it is running, and the memory for all of them comes
from one pool. Two ways to hand it out:

- contiguous: at admission a request gets one region big enough for the longest sequence it may
  reach (prompt + max_new_tokens, capped by the context window), as a preallocated KVCache does.
  Slots for tokens not generated yet, and for tokens it will never generate, sit unused.
- paged (vLLM's PagedAttention): the pool is cut into blocks of `block_size` token slots; a request
  gets one more block when its last one is full, and a block table maps its logical blocks to
  physical ones, so they need not be adjacent. A request wastes less than one block.

Time advances in decode steps. Each step, waiting requests are admitted first come, first served
while memory for them is free (prefill happens in the admission step and yields the first token),
then every running request adds one token, and finished requests free their memory. When a paged
request needs a block and none is free, the most recently admitted request is preempted: its
blocks are freed and it waits to start again from scratch (vLLM's "recompute" preemption).

    requests = synthetic_requests(300, seed=0)
    paged = simulate(requests, capacity_tokens=32_768, policy="paged", block_size=16)
    contiguous = simulate(requests, capacity_tokens=32_768, policy="contiguous")
    paged.utilisation, contiguous.utilisation, paged.steps, contiguous.steps

Utilisation = token states stored / token slots allocated, summed over all steps.

Simplifications, all in favour of contiguous allocation: the pool is treated as fungible (no
external fragmentation: a real contiguous allocator can fail with enough free memory in pieces),
and every step costs the same however many requests run. Out of scope: prefix sharing between
requests (copy-on-write blocks), swapping to CPU memory, chunked prefill.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class SimulatedRequest:
    prompt_len: int
    output_len: int  # tokens it will actually generate (unknown to the server in advance)
    max_new_tokens: int  # what the client allowed: the most it could generate
    arrival: int = 0  # the decode step at which it arrives


def _check_int(name: str, value, minimum: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")


def synthetic_requests(n: int, seed: int = 0, mean_prompt: float = 200.0, mean_output: float = 250.0,
                       sigma: float = 0.9, max_seq_len: int = 2048, max_new_tokens: int | None = None,
                       arrival_rate: float | None = None) -> list[SimulatedRequest]:
    """`n` requests with log-normally distributed prompt and output lengths (means as given), cut so
    that prompt + output fits max_seq_len. max_new_tokens defaults to "whatever fits the context
    window" (the client set no limit). arrival_rate (requests per step): Poisson arrivals; None: all
    arrive at step 0."""
    _check_int("n", n, 1)
    _check_int("max_seq_len", max_seq_len, 2)
    if not (mean_prompt >= 1 and mean_output >= 1 and sigma >= 0):
        raise ValueError("mean_prompt and mean_output must be >= 1 and sigma >= 0")
    rng = np.random.default_rng(seed)

    def lognormal(mean, size):  # parameterised by its mean
        return rng.lognormal(np.log(mean) - sigma ** 2 / 2, sigma, size)

    prompts = np.clip(np.round(lognormal(mean_prompt, n)), 1, max_seq_len - 1).astype(int)
    outputs = np.clip(np.round(lognormal(mean_output, n)), 1, max_seq_len - prompts).astype(int)
    if arrival_rate is None:
        arrivals = np.zeros(n, dtype=int)
    else:
        if not arrival_rate > 0:
            raise ValueError(f"arrival_rate must be > 0 requests per step (or None); got {arrival_rate!r}")
        arrivals = np.floor(np.cumsum(rng.exponential(1 / arrival_rate, n))).astype(int)
    out = []
    for p, o, a in zip(prompts.tolist(), outputs.tolist(), arrivals.tolist()):
        allowed = max_seq_len - p if max_new_tokens is None else max(o, min(max_new_tokens, max_seq_len - p))
        out.append(SimulatedRequest(p, o, allowed, a))
    return out


@dataclass
class SimulationResult:
    policy: str
    block_size: int | None
    capacity_tokens: int
    steps: int  # decode steps until every request finished
    utilisation: float  # sum of stored token states / sum of allocated slots, over all steps
    stored: np.ndarray = field(repr=False)  # per step: token states held by running requests
    allocated: np.ndarray = field(repr=False)  # per step: token slots handed out
    running: np.ndarray = field(repr=False)  # per step: requests running
    preemptions: int = 0

    @property
    def mean_running(self) -> float:
        return float(self.running.mean())


class _Running:
    __slots__ = ("req", "generated", "slots", "alive")

    def __init__(self, req: SimulatedRequest, slots: int):
        self.req, self.generated, self.slots, self.alive = req, 0, slots, True


def simulate(requests: list[SimulatedRequest], capacity_tokens: int, policy: str = "paged", block_size: int = 16,
             max_seq_len: int = 2048) -> SimulationResult:
    """Run every request to completion with a KV pool of `capacity_tokens` token slots."""
    if policy not in ("paged", "contiguous"):
        raise ValueError(f"policy must be 'paged' or 'contiguous'; got {policy!r}")
    _check_int("capacity_tokens", capacity_tokens, 1)
    _check_int("block_size", block_size, 1)
    if not requests:
        raise ValueError("requests must not be empty")
    b = block_size if policy == "paged" else 1
    total_slots = capacity_tokens // b * b  # paged: whole blocks only

    def admission_slots(r: SimulatedRequest) -> int:
        if policy == "contiguous":
            return min(max_seq_len, r.prompt_len + r.max_new_tokens)
        return math.ceil((r.prompt_len + 1) / b) * b  # the prompt and the first generated token

    for r in requests:
        largest = min(max_seq_len, r.prompt_len + r.max_new_tokens) if policy == "contiguous" else \
            math.ceil((r.prompt_len + r.output_len) / b) * b
        if largest > total_slots:
            raise ValueError(f"a request needs {largest} token slots but capacity_tokens is {capacity_tokens}")

    pending = deque(sorted(requests, key=lambda r: r.arrival))
    waiting: deque[SimulatedRequest] = deque()
    running: list[_Running] = []
    free = total_slots
    stored_log, allocated_log, running_log = [], [], []
    preemptions, t = 0, 0
    while pending or waiting or running:
        while pending and pending[0].arrival <= t:
            waiting.append(pending.popleft())
        while waiting and admission_slots(waiting[0]) <= free:  # first come, first served
            r = waiting.popleft()
            running.append(_Running(r, admission_slots(r)))
            free -= running[-1].slots
        for s in list(running):
            if not s.alive:  # preempted earlier in this step
                continue
            s.generated += 1
            if policy == "paged" and s.req.prompt_len + s.generated > s.slots:
                while free < b:  # no free block: preempt the newest request (possibly s itself)
                    victim = running.pop()
                    free += victim.slots
                    victim.alive = False
                    waiting.appendleft(victim.req)
                    preemptions += 1
                    if victim is s:
                        break
                if s.alive:
                    s.slots += b
                    free -= b
        stored_log.append(sum(s.req.prompt_len + s.generated for s in running))
        allocated_log.append(total_slots - free)
        running_log.append(len(running))
        for s in [s for s in running if s.generated == s.req.output_len]:
            running.remove(s)
            free += s.slots
        t += 1
        if not running and waiting and admission_slots(waiting[0]) > free:
            raise RuntimeError("simulation stuck: a waiting request can never be admitted")
    stored, allocated = np.array(stored_log), np.array(allocated_log)
    return SimulationResult(policy, block_size if policy == "paged" else None, capacity_tokens, t,
                            float(stored.sum() / allocated.sum()), stored, allocated, np.array(running_log),
                            preemptions)
