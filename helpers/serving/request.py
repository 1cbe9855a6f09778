"""One request's state inside the engine: its tokens, its blocks, its sampling settings, its clock.

    WAITING -> RUNNING -> FINISHED        (and RUNNING -> WAITING again when preempted)

`num_computed` is how many of the request's tokens (prompt, then generated) have keys and values in
the cache; the scheduler gives it more tokens to compute each step until it has computed every known
token, and then each step samples one more. A preempted request keeps its generated tokens and only
loses its blocks: when it runs again it recomputes prompt + generated tokens (prefix-cache hits make
that cheap) and carries on where it stopped.

Out of scope: priorities (vLLM's priority scheduling), n > 1 samples per request, logprobs output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..sampling import SamplingConfig

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass
class Request:
    request_id: str
    prompt: list[int]
    max_tokens: int
    sampling: SamplingConfig
    generator: torch.Generator | None = None
    stop: object = None  # a stopping.StopChecker, or None
    logits_processors: tuple = ()  # each proc(ids (1, T), logits (1, V)) -> logits
    arrival_time: float = 0.0
    output: list[int] = field(default_factory=list)
    status: str = WAITING
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # chained hashes of its full blocks so far
    finish_reason: str | None = None  # "length", "eos", "stop_sequence", "stop_criterion", "cancelled", "error"
    error: BaseException | None = None
    token_times: list[float] = field(default_factory=list)  # engine time at which each output token appeared
    finish_time: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache

    @property
    def all_ids(self) -> list[int]:
        return self.prompt + self.output

    def ids(self, start: int, end: int) -> list[int]:
        """Token ids at positions start .. end-1 (prompt then output), without building the whole list."""
        P = len(self.prompt)
        if start >= P:
            return self.output[start - P : end - P]
        return self.prompt[start:end] + (self.output[: end - P] if end > P else [])

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def blocks_for(self, n_positions: int, block_size: int) -> int:
        return math.ceil(n_positions / block_size)

    @property
    def ttft(self) -> float | None:
        """Time to first token: arrival until the first output token."""
        return self.token_times[0] - self.arrival_time if self.token_times else None

    @property
    def inter_token_latencies(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]
