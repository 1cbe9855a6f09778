"""The loop of speculative rounds, one model call at a time, on two "steppers".

A stepper has two methods: logits(tokens) for T tokens at positions length..length+T-1, and
truncate(n). EagerSteps wraps a model with its own KVCache; StaticSteps a FastGenerator's static path.
One round (run_rounds) drafts, verifies with the rule (helpers.speculative.rule), writes the committed
tokens into one preallocated id buffer and rolls both steppers back. A round that runs as one compiled
graph (helpers.speculative.compiled.FusedRounds) is passed in as `fused`; this module does not compile.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..fast_decode import FastGenerator
from ..generate import as_prompt_tensor, check_generation_length
from ..kv_cache import KVCache
from ..sampling import SamplingConfig, check_generator, next_token, probabilities
from .rule import SpeculativeStats, accept_or_resample, check_gamma, check_sampling, greedy_accept

DEFAULT_GAMMA = 3  # draft tokens per round with a draft model (chapter 12 measures the choice)
# The same with compiled draft and verify steps (FastGenerators). Speed-up over plain compiled decoding,
# course target + draft, 3 prompts x 128 tokens x 3 repeats, range over three runs on a shared 2-core CPU:
# gamma 2: 1.11-1.17x greedy, 0.72-0.75x at T=1; gamma 3: 1.20-1.26x, 0.62-0.66x; gamma 4: 1.15-1.23x,
# 0.58x; gamma 5: 1.27-1.31x, 0.56-0.57x; gamma 6: 1.23-1.37x, 0.52-0.58x. Longer drafts help greedy a
# little and hurt sampling more (alpha 0.44 at T=1): none is clearly better for both, so 3. (Measured
# before the compiled step attended with fused sums, which made plain compiled decoding faster and not the
# 4-token verify pass: in the bench after that change gamma 3 gave 0.88x greedy, 0.51x at T=1.) With each
# greedy round one compiled graph (FusedRounds), one noisy run of the bench's rows, gamma 3 / 4 / 5 / 6:
# greedy 1.14x / 1.39x / 1.30x / 1.29x (models called one at a time: 1.14x / 1.14x / 1.12x / 1.02x), T=1
# 0.61x / 0.50x / 0.49x / 0.45x. Longer drafts now help greedy, and still hurt sampling; 3 stays.
DEFAULT_COMPILED_GAMMA = DEFAULT_GAMMA
# At temperature > 0 with the sampled round fused too (FusedRounds), T=1 against plain compiled sampling,
# 3 prompts x 128 tokens, the same seeds, two runs (the variants interleaved in each): gamma 1: 1.04x, 0.93x,
# 1.01x (the loop of model calls 0.68-0.79x); gamma 2: 1.01x, 0.86x, 0.88x (0.64-0.69x); gamma 3: 0.72x
# (0.57x). With alpha near 0.45 a second proposal is accepted too rarely to pay for its draft step and
# the longer verify pass, so sampled rounds propose one token (the bench's T=1 row at gamma 1 after: 1.08x).
DEFAULT_COMPILED_SAMPLED_GAMMA = 1
DEFAULT_LOOKUP_GAMMA = 6  # prompt-lookup proposals per round: no draft steps, but a longer verify pass
DEFAULT_MAX_NGRAM = 3
DEFAULT_MIN_NGRAM = 2  # a single-token match is weak evidence: its proposals are mostly rejected


def verify_round(target, ids, n: int, g: int, sampling: SamplingConfig, p_draft, generator):
    """One target pass over the last committed token (position n - 1) and the g proposals at n..n+g-1,
    then the acceptance rule. target: a stepper (EagerSteps or StaticSteps) whose length is n - 1.
    p_draft (g, V) or None (a deterministic proposer, e.g. prompt lookup).
    Returns (number accepted, next token), both 0-d tensors on the model's device."""
    logits = target.logits(ids[:, n - 1 : n + g])  # (g + 1, V)
    proposals = ids[0, n : n + g]  # (g,)
    if sampling.greedy:
        return greedy_accept(next_token(logits, sampling)[:, 0], proposals)  # next_token checks the logits
    return accept_or_resample(probabilities(logits, sampling), p_draft, proposals, generator)


class EagerSteps:
    """A model with its own KVCache (dynamic shapes): the T tokens go to positions length..length+T-1,
    and rolling back is KVCache.truncate."""

    def __init__(self, model, max_seq_len: int):
        self.model = model
        self.cache = KVCache.for_model(model, 1, max_seq_len)

    @property
    def length(self) -> int:
        return self.cache.length

    def logits(self, tokens: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """tokens (1, T) -> (T, V) logits, or (1, V) with last_only (no head on the other positions)."""
        return self.model(tokens, cache=self.cache, last_only=last_only, check=False)[0]

    def truncate(self, length: int) -> None:
        self.cache.truncate(length)


class StaticSteps:
    """The same interface over a FastGenerator's static path: positions are a tensor, so one compiled
    graph per number of tokens serves every round. The generator's cache is written by position and
    never truncated: `length` here is the bookkeeping, and stale slots past it are overwritten before
    any query can see them (a query at position p attends keys 0..p only, all written by then)."""

    def __init__(self, fast: FastGenerator, token_counts):
        self.fast, self.model = fast, fast.model
        self.length = 0
        device = fast.model.device
        self._arange = torch.arange(fast.cache.max_seq_len, device=device)  # (S,)
        # the compiled graphs (T = 1 is always one) read their inputs from these fixed tensors, whose
        # strides are the ones compiled for
        self._inputs = {
            T: (torch.zeros(1, T, dtype=torch.long, device=device), torch.zeros(T, dtype=torch.long, device=device))
            for T in {1, *token_counts}
        }

    def logits(self, tokens: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        T, start = tokens.shape[1], self.length
        fast = self.fast
        if T in self._inputs:
            tok, pos = self._inputs[T]  # (1, T), (T,)
            tok.copy_(tokens)
            pos.copy_(self._arange[start : start + T])
            logits = fast.forward(tok, pos)[0]  # (T, V)
        elif T in fast.compiled_token_counts:  # a graph warmed up for another gamma
            logits = fast.forward(tokens, self._arange[start : start + T])[0]  # (T, V)
        else:
            # no graph for this T (the prefill, a short last round): the eager dynamic path on the same
            # buffers, which attends over positions 0..start+T-1 only, not over the whole masked buffer
            # (the prefill of the bench's 64-token prompts: 2x faster); cache.length is its bookkeeping,
            # which the static steps ignore
            fast.cache.commit(start)
            logits = fast.decode_model(tokens, cache=fast.cache, last_only=last_only, check=False)[0]
        self.length = start + T
        return logits[-1:] if last_only else logits

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"length must be in [0, {self.length}]; got {length}")
        self.length = length

    def commit(self, end: int) -> None:
        """Positions [0, end) hold keys and values now (a fused round wrote them); later ones are forgotten."""
        self.length = end


class IdBuffer:
    """Committed ids (and the current round's proposals after them) in one preallocated (1, S) tensor."""

    def __init__(self, prompt: torch.Tensor, max_new_tokens: int, gamma: int, storage: torch.Tensor | None = None):
        """storage: a longer (1, L) tensor whose first columns to use (a compiled round's own buffer)."""
        T = prompt.shape[1]
        size = T + max_new_tokens + gamma + 1
        if storage is not None and storage.shape[1] >= size:
            self.ids = storage[:, :size]
        else:
            self.ids = torch.empty(1, size, dtype=torch.long, device=prompt.device)
        self.ids[:, :T] = prompt
        self.n = T  # committed length


def finish(buf: IdBuffer, prompt_len: int, max_new_tokens: int, eos_id, stats: SpeculativeStats):
    end = min(buf.n, prompt_len + max_new_tokens)
    if eos_id is not None:
        new = buf.ids[0, prompt_len:end].tolist()
        if eos_id in new:
            end = prompt_len + new.index(eos_id) + 1
    stats.new_tokens = end - prompt_len
    return buf.ids[:, :end].clone()


def check_common(target, prompt, max_new_tokens, gamma, sampling, temperature, generator, name="gamma"):
    check_generator(generator)
    prompt = as_prompt_tensor(prompt, target)
    if prompt.shape[0] != 1:
        raise ValueError(f"speculative decoding needs batch size 1; got prompt batch size {prompt.shape[0]}")
    check_generation_length(prompt.shape[1], max_new_tokens, target.cfg.max_seq_len)
    check_gamma(gamma, name)
    return prompt, check_sampling(sampling, temperature)


@dataclass(frozen=True)
class RunSettings:
    """What stays fixed over one speculative generation: the (1, T) prompt, how many tokens to add, the
    proposals per round, the sampling and its generator, the end-of-sequence id, and whether to record
    every round (stats.trace). Checked by the caller (check_common), not here."""

    prompt: torch.Tensor
    max_new_tokens: int
    gamma: int
    sampling: SamplingConfig
    generator: torch.Generator | None = None
    eos_id: int | None = None
    trace: bool = False


def speculative_loop(target, draft, run: RunSettings, later_rounds=None, fused=None, prefill=None):
    """The rounds, on two steppers (EagerSteps or StaticSteps): logits(tokens) at positions
    length..length+T-1, and truncate(n). later_rounds: a context manager factory entered after the
    first round (the static path's guard skipping). fused: a FusedRounds for the steppers' generators and
    this kind of sampling, which then runs every full-length round with n >= 2. prefill: a function that
    writes both models' K/V for prompt[:, :-1] (a compiled prefill: speculative.prefill), or None: each
    stepper prefills by its logits()."""
    with contextlib.ExitStack() as stack:
        after_first = (lambda: stack.enter_context(later_rounds())) if later_rounds else None
        return run_rounds(target, draft, run, after_first, fused, prefill)


def run_rounds(target, draft, run: RunSettings, after_first, fused=None, prefill=None):
    prompt, max_new_tokens, gamma, eos_id, trace = run.prompt, run.max_new_tokens, run.gamma, run.eos_id, run.trace
    sampling, generator = run.sampling, run.generator
    T = prompt.shape[1]
    stats = SpeculativeStats(trace=[] if trace else None)
    if max_new_tokens == 0:
        return prompt.clone(), stats
    buf = IdBuffer(prompt, max_new_tokens, gamma, None if fused is None else fused.ids)
    if T > 1:  # prefill everything but the last prompt token: the first round feeds it
        if prefill is not None:
            prefill(prompt[:, :-1])
            target.commit(T - 1)
            draft.commit(T - 1)
        else:
            target.logits(prompt[:, :-1], last_only=True)
            draft.logits(prompt[:, :-1], last_only=True)
    ids = buf.ids
    end = T + max_new_tokens
    V = target.model.cfg.vocab_size
    p_draft = None if sampling.greedy else torch.empty(gamma, V, device=ids.device)  # (gamma, V)
    while buf.n < end:
        n = buf.n
        g = min(gamma, end - n - 1)  # never propose past max_new_tokens (the last round may be shorter)
        if fused is not None and n >= 2 and n + gamma <= fused.room:
            # the whole round in one compiled graph: it fed the draft n-2 .. n+g-2, the target n-1 .. n+g-1.
            # A last round that needs fewer than gamma proposals runs it too, where the caches have room, and
            # finish drops what lands past max_new_tokens: a shorter round would run the models eagerly
            # (no graph is compiled for its length): 6.1 ms against 1.6 ms for a full round (course models,
            # 128 tokens, one thread on an AMD Zen 5 VM)
            g = gamma
            k, nxt, proposed = fused(ids, n, sampling, generator)
            if trace:
                stats.trace.append((proposed, k, nxt))
            # 5. (as below) the round fed the target n-1 .. n+g-1 and the draft n-2 .. n+g-2
            target.commit(n + k)
            draft.commit(min(n + k, n + g - 1))
        else:
            k = round_of_calls(target, draft, ids, n, g, sampling, generator, p_draft, stats, trace)
            # 5. roll back: the target has seen everything but the new last token; the draft never saw
            # the last proposal, so after a full acceptance it lags by one more (fed next round)
            target.truncate(n + k)
            draft.truncate(min(n + k, draft.length))
        stats.draft_calls += g
        stats.target_calls += 1
        stats.proposed.append(g)
        stats.accepted.append(k)
        buf.n = n + k + 1
        if eos_id is not None and eos_id in ids[0, n : n + k + 1].tolist():
            break
        if after_first is not None and stats.rounds == 1:
            after_first()
    return finish(buf, T, max_new_tokens, eos_id, stats), stats


def round_of_calls(target, draft, ids, n, g, sampling, generator, p_draft, stats, trace) -> int:
    """Steps 1-4 of a round, one model call at a time: writes the accepted proposals and the next token
    into ids[0, n:n + accepted + 1] (and, with trace, the round into stats.trace); returns the number accepted."""
    greedy = sampling.greedy
    # 1. draft g tokens; the first step also feeds the committed tokens the draft has not seen (1 or 2)
    d_start = draft.length
    for i in range(g):
        x = ids[:, d_start:n] if i == 0 else ids[:, n + i - 1 : n + i]  # (1, 1 or 2)
        logits = draft.logits(x, last_only=True)[-1]  # (V,)
        if greedy:
            ids[0, n + i] = next_token(logits, sampling)  # the argmax, after checking the logits
        else:
            p_draft[i] = probabilities(logits, sampling)
            ids[0, n + i] = torch.multinomial(p_draft[i], 1, generator=generator)[0]
    # 2.-4. the target scores them in one pass; accept a prefix, then the residual or bonus token
    n_acc, nxt = verify_round(target, ids, n, g, sampling, None if greedy else p_draft[:g], generator)
    if trace:
        stats.trace.append((ids[0, n : n + g].tolist(), int(n_acc), int(nxt)))
    ids[0, n + n_acc] = nxt  # overwrites the first rejected proposal, if any
    return int(n_acc)  # the round's one device -> host read
