"""Prompt lookup: speculative decoding whose drafter is an n-gram index over the sequence so far.

No draft model: the proposal is what followed the most recent earlier occurrence of the last n tokens.
The proposals are deterministic, so the acceptance rule keeps the target's distribution exactly.
Runs on models only: its proposals vary in length every round, so each length would need its own graph.
"""

from __future__ import annotations

import torch

from ..sampling import SamplingConfig
from .loop import (
    DEFAULT_LOOKUP_GAMMA,
    DEFAULT_MAX_NGRAM,
    DEFAULT_MIN_NGRAM,
    EagerSteps,
    IdBuffer,
    check_common,
    finish,
    verify_round,
)
from .rule import SpeculativeStats


class NgramIndex:
    """For each n-gram of the sequence so far, where its most recent occurrence ended, so that the
    continuation after it can be proposed. Updated incrementally: O(max_ngram) dict writes per token."""

    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM, min_ngram: int = 1):
        if (
            not all(isinstance(n, int) and not isinstance(n, bool) for n in (min_ngram, max_ngram))
            or not 1 <= min_ngram <= max_ngram
        ):
            raise ValueError(f"need 1 <= min_ngram <= max_ngram; got min_ngram={min_ngram!r}, max_ngram={max_ngram!r}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        self.table: dict[tuple, int] = {}  # n-gram -> end position of its latest occurrence that has a successor

    def extend(self, new_tokens: list[int]) -> None:
        toks = self.tokens
        start = len(toks)
        toks.extend(new_tokens)
        # index n-grams ending at e for every e that now has a successor token: e <= len - 1
        for e in range(max(start, 1), len(toks)):
            for n in range(self.min_ngram, min(self.max_ngram, e) + 1):
                self.table[tuple(toks[e - n : e])] = e

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the most recent earlier occurrence of the longest matching suffix."""
        toks = self.tokens
        for n in range(min(self.max_ngram, len(toks)), self.min_ngram - 1, -1):
            e = self.table.get(tuple(toks[-n:]))
            if e is not None:
                return toks[e : e + k]
        return []


@torch.inference_mode()
def prompt_lookup_generate(
    target,
    prompt,
    max_new_tokens: int,
    *,
    gamma: int = DEFAULT_LOOKUP_GAMMA,
    max_ngram: int = DEFAULT_MAX_NGRAM,
    min_ngram: int = DEFAULT_MIN_NGRAM,
    temperature: float = 0.0,
    sampling: SamplingConfig | None = None,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    trace: bool = False,
) -> tuple[torch.Tensor, SpeculativeStats]:
    """Speculative decoding with prompt lookup as the drafter: no draft model.

    Each round proposes up to `gamma` tokens: the continuation of the most recent earlier occurrence of
    the last n tokens (n from max_ngram down to min_ngram), or nothing, in which case the round is a
    plain decode step. The proposals are deterministic (p_draft one-hot), so `accept_or_resample`
    keeps the output distribution exactly the target's; at temperature 0 the ids equal `generate`'s.
    """
    prompt, sampling = check_common(target, prompt, max_new_tokens, gamma, sampling, temperature, generator)
    index = NgramIndex(max_ngram, min_ngram)  # checks max_ngram / min_ngram before any model work
    T = prompt.shape[1]
    stats = SpeculativeStats(trace=[] if trace else None)
    if max_new_tokens == 0:
        return prompt.clone(), stats
    buf = IdBuffer(prompt, max_new_tokens, gamma)
    steps = EagerSteps(target, min(T + max_new_tokens + gamma, target.cfg.max_seq_len))
    if T > 1:
        steps.logits(prompt[:, :-1], last_only=True)
    index.extend(prompt[0].tolist())
    ids = buf.ids
    end = T + max_new_tokens
    while buf.n < end:
        n = buf.n
        proposal = index.propose(min(gamma, end - n - 1))
        g = len(proposal)
        if g:
            ids[0, n : n + g] = torch.tensor(proposal, dtype=torch.long)
        n_acc, nxt = verify_round(steps, ids, n, g, sampling, None, generator)
        stats.target_calls += 1
        k, nxt = torch.stack([n_acc, nxt]).tolist()  # the round's one device -> host read
        if trace:
            stats.trace.append((proposal, k, nxt))
        ids[0, n + k] = nxt
        stats.proposed.append(g)
        stats.accepted.append(k)
        buf.n = n + k + 1
        steps.truncate(n + k)
        index.extend(proposal[:k] + [nxt])
        if eos_id is not None and eos_id in index.tokens[n : n + k + 1]:
            break
    return finish(buf, T, max_new_tokens, eos_id, stats), stats
