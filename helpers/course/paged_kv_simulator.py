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
while memory for them is free (their prefill runs in the admission step and yields the first token),
then every running request adds one token, and finished requests free their memory. When a paged
request needs a block and none is free, the most recently admitted request is pre-empted: its blocks
are freed, it keeps the tokens it has generated, and when it is admitted again its prompt and those
tokens are prefilled once more (vLLM's "recompute" pre-emption).

    requests = synthetic_requests(300, seed=0)
    paged = simulate(requests, capacity_tokens=32_768, policy="paged", block_size=16)
    contiguous = simulate(requests, capacity_tokens=32_768, policy="contiguous")
    paged.utilisation, contiguous.utilisation, paged.steps, contiguous.steps
    cost = StepCost(weight_bytes=16.06e9, kv_bytes_per_token=131_072, flops_per_token=15.0e9,
                    bandwidth=3.35e12, peak_flops=989.4e12)          # Llama-3-8B bf16 on an H100's spec sheet
    paged.seconds(cost).sum()                                        # the run in seconds, not steps

Utilisation = token states stored / token slots allocated, summed over all steps.

Steps are not time: a step that runs 40 requests reads far more cached keys and values than one that runs
10. `SimulationResult.seconds` prices each step with the roofline of one forward pass: the larger of
(weights + every stored token's keys and values) / bandwidth and (decoded + prefilled tokens) x FLOPs per
token / peak, so a step with many requests, and a re-admission that recomputes a long prefix, cost more.

Simplifications: the pool is treated as fungible (no external fragmentation: a real contiguous allocator
can fail with enough free memory in pieces), which favours contiguous allocation; attention's FLOPs,
activations and kernel overheads are left out of the step cost. Out of scope: prefix sharing between
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


def synthetic_requests(
    n: int,
    seed: int = 0,
    mean_prompt: float = 200.0,
    mean_output: float = 250.0,
    sigma: float = 0.9,
    max_seq_len: int = 2048,
    max_new_tokens: int | None = None,
    arrival_rate: float | None = None,
) -> list[SimulatedRequest]:
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
        return rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, size)

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


@dataclass(frozen=True)
class StepCost:
    """What one forward pass of the served model costs on one device (spec-sheet numbers): bytes of weights
    read every step, KV bytes per stored token, matmul FLOPs per token (2 x matmul weights), and the device's
    memory bandwidth (bytes/s) and peak FLOP/s."""

    weight_bytes: float
    kv_bytes_per_token: float
    flops_per_token: float
    bandwidth: float
    peak_flops: float

    def __post_init__(self):
        for name in ("weight_bytes", "kv_bytes_per_token", "flops_per_token", "bandwidth", "peak_flops"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"{name} must be a number > 0; got {value!r}")


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
    prefilled: np.ndarray = field(repr=False)  # per step: tokens prefilled at admission (recomputes included)
    preemptions: int = 0
    recomputed_tokens: int = 0  # tokens prefilled again because their request was pre-empted

    @property
    def mean_running(self) -> float:
        return float(self.running.mean())

    def seconds(self, cost: StepCost) -> np.ndarray:
        """Seconds of each step by the roofline: max(bytes read / bandwidth, FLOPs / peak), where a step reads
        the weights and every stored token's keys and values, and computes one token per running request
        plus every token it prefills."""
        if not isinstance(cost, StepCost):
            raise ValueError(f"cost must be a StepCost; got {type(cost).__name__}")
        read = cost.weight_bytes + self.stored * cost.kv_bytes_per_token
        flops = (self.running + self.prefilled) * cost.flops_per_token
        return np.maximum(read / cost.bandwidth, flops / cost.peak_flops)


class _Running:
    __slots__ = ("req", "generated", "slots", "alive")

    def __init__(self, req: SimulatedRequest, slots: int, generated: int = 0):
        self.req, self.generated, self.slots, self.alive = req, generated, slots, True


def simulate(
    requests: list[SimulatedRequest],
    capacity_tokens: int,
    policy: str = "paged",
    block_size: int = 16,
    max_seq_len: int = 2048,
) -> SimulationResult:
    """Run every request to completion with a KV pool of `capacity_tokens` token slots."""
    if policy not in ("paged", "contiguous"):
        raise ValueError(f"policy must be 'paged' or 'contiguous'; got {policy!r}")
    _check_int("capacity_tokens", capacity_tokens, 1)
    _check_int("block_size", block_size, 1)
    if not requests:
        raise ValueError("requests must not be empty")
    b = block_size if policy == "paged" else 1
    total_slots = capacity_tokens // b * b  # paged: whole blocks only

    def admission_slots(r: SimulatedRequest, generated: int = 0) -> int:
        if policy == "contiguous":
            return min(max_seq_len, r.prompt_len + r.max_new_tokens)
        return math.ceil((r.prompt_len + generated + 1) / b) * b  # what it holds, and the token it adds now

    for r in requests:
        largest = (
            min(max_seq_len, r.prompt_len + r.max_new_tokens)
            if policy == "contiguous"
            else math.ceil((r.prompt_len + r.output_len) / b) * b
        )
        if largest > total_slots:
            raise ValueError(f"a request needs {largest} token slots but capacity_tokens is {capacity_tokens}")

    pending = deque(sorted(requests, key=lambda r: r.arrival))
    waiting: deque[tuple[SimulatedRequest, int, bool]] = deque()  # (request, tokens generated, pre-empted?)
    running: list[_Running] = []
    free = total_slots
    stored_log, allocated_log, running_log, prefilled_log = [], [], [], []
    preemptions, recomputed, t = 0, 0, 0
    while pending or waiting or running:
        while pending and pending[0].arrival <= t:
            waiting.append((pending.popleft(), 0, False))
        prefilled = 0
        while waiting and admission_slots(*waiting[0][:2]) <= free:  # first come, first served
            r, done, preempted = waiting.popleft()
            running.append(_Running(r, admission_slots(r, done), done))
            free -= running[-1].slots
            prefilled += r.prompt_len + done  # a re-admitted request recomputes its generated tokens too
            if preempted:
                recomputed += r.prompt_len + done
        for s in list(running):
            if not s.alive:  # pre-empted earlier in this step
                continue
            s.generated += 1
            if policy == "paged" and s.req.prompt_len + s.generated > s.slots:
                while free < b:  # no free block: pre-empt the newest request (possibly s itself)
                    victim = running.pop()
                    free += victim.slots
                    victim.alive = False
                    # victims come after s in admission order, so only s has stepped yet: it gives back the
                    # token it has no slot for, and keeps the ones it generated before
                    waiting.appendleft((victim.req, victim.generated - (victim is s), True))
                    preemptions += 1
                    if victim is s:
                        break
                if s.alive:
                    s.slots += b
                    free -= b
        stored_log.append(sum(s.req.prompt_len + s.generated for s in running))
        allocated_log.append(total_slots - free)
        running_log.append(len(running))
        prefilled_log.append(prefilled)
        for s in [s for s in running if s.generated == s.req.output_len]:
            running.remove(s)
            free += s.slots
        t += 1
        if not running and waiting and admission_slots(*waiting[0][:2]) > free:
            raise RuntimeError("simulation stuck: a waiting request can never be admitted")
    stored, allocated = np.array(stored_log), np.array(allocated_log)
    return SimulationResult(
        policy,
        block_size if policy == "paged" else None,
        capacity_tokens,
        t,
        float(stored.sum() / allocated.sum()),
        stored,
        allocated,
        np.array(running_log),
        np.array(prefilled_log),
        preemptions,
        recomputed,
    )
