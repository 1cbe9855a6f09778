"""Speculative decoding: a cheap drafter proposes tokens, the target checks them all in one pass.

    ids, stats = speculative_generate(target, draft, prompt, max_new_tokens=128, gamma=4)
    ids, stats = prompt_lookup_generate(target, prompt, max_new_tokens=128)   # no draft model

    # the same loop on compiled static steps: pass FastGenerators instead of models
    fast_target, fast_draft = FastGenerator(target, max_seq_len=320), FastGenerator(draft, max_seq_len=320)
    warmup_speculative(fast_target, fast_draft, gamma=DEFAULT_COMPILED_GAMMA)  # compiles 5 graphs, once
    ids, stats = speculative_generate(fast_target, fast_draft, prompt, max_new_tokens=128)
    # sampling: its own round graph, and by default gamma = DEFAULT_COMPILED_SAMPLED_GAMMA
    ids, stats = speculative_generate(fast_target, fast_draft, prompt, 128, temperature=1.0, generator=g)

Speculative sampling (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative
Sampling"). One round:

1. the draft model proposes gamma tokens x_1..x_gamma, one at a time, against its own KV cache,
   remembering the distribution p_draft it drew each one from;
2. the target runs ONE forward pass over the gamma + 1 positions (the last committed token and the
   gamma proposals) against its KV cache, which gives p_target at every proposed position plus one;
3. x_i is accepted with probability min(1, p_target(x_i) / p_draft(x_i)), left to right;
4. at the first rejection, position i gets a token drawn from norm(max(0, p_target - p_draft)) and
   the later proposals are discarded (they were conditioned on the rejected token); if all gamma are
   accepted, a bonus token is drawn from the target's extra position;
5. both caches are rolled back to the committed length (`KVCache.truncate`).

Each committed token is distributed exactly as the target alone would have produced it. Both
distributions come from `sampling.probabilities` with the same SamplingConfig; at temperature 0 both
are one-hot, the rule reduces to "accept while the argmaxes agree, then take the target's argmax",
and the output equals greedy decoding with the target, token for token.

Prompt lookup (n-gram) drafting needs no draft model: the proposal is what followed the most recent
earlier occurrence of the sequence's last n tokens. Such a draft is deterministic, so p_draft is
one-hot at each proposal, and the same rule keeps the output distribution exact.

The loop is kept lean, because on a CPU a small model's decode step is mostly per-operation
overhead: the committed tokens and the proposals live in one preallocated id buffer (the
verification input is a slice of it, never a concatenation), the acceptance test for all gamma
tokens is a handful of batched tensor ops, and each round reads back from the device only how many
proposals were accepted, plus one flag per model call (sampling.check_logits: are the logits usable).

One loop (`_speculative_loop`) drives both kinds of model through a two-method "stepper": logits(tokens)
for T tokens at positions length..length+T-1, and truncate(n). With models, each gets a fresh KVCache
and truncate is KVCache.truncate. With FastGenerators, the tokens go through the static path (positions
in a tensor, attention over the whole buffer with a mask), and truncate only moves the bookkeeping:
slots past it are overwritten before any query attends to them. A round then uses three shapes, each
one compiled graph (`warmup_speculative`): the target's (gamma + 1)-token verify pass and the draft's
1-token step and 2-token catch-up (after a fully accepted round the draft has not seen its last
proposal). The prefill and a last round cut short by max_new_tokens run the same static path eagerly,
so a generation never compiles in its middle; greedy output still equals `generate`'s token for token.
A round goes further: draft proposals, verify pass and acceptance are one compiled graph (`FusedRounds`,
the fifth graph), so Python sees a round once instead of gamma + 1 times; at temperature > 0 the graph
draws its tokens from uniforms drawn on the host (a compiled graph takes no torch.Generator).
Sampled tokens keep the target's distribution, but need not equal the eager loop's for the same
generator: the static path's logits differ from the eager ones by float rounding, and the fused round
draws by inverse CDF (sampling.sample_from_uniform) where the loop of model calls uses torch.multinomial.

Out of scope: batch size > 1 (rows would accept different numbers of tokens), repetition / presence /
frequency penalties (their distribution depends on the tokens before each position), tree
verification (several drafts per round), and self-speculation (early-exit drafting). Prompt lookup
runs on models only: its proposals vary in length every round, so each length would need its own graph.
The compiled path compiles neither the prefill nor the short last round (both eager static).
"""
from __future__ import annotations

import contextlib
import warnings
import weakref
from dataclasses import dataclass, field

import torch

from .fast_decode import FastGenerator, compile_options, guards_checked_once, warm_compiled
from .generate import as_prompt_tensor, check_generation_length
from .kv_cache import KVCache
from .sampling import (
    SamplingConfig,
    apply_temperature,
    check_generator,
    next_token,
    probabilities,
    sample_from_uniform,
)

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


@dataclass
class SpeculativeStats:
    """What happened in one generation call.

    proposed[r] / accepted[r]: draft tokens proposed and accepted in round r. Every round is one
    target forward pass (`target_calls`; the prompt's prefill is not counted) and commits
    accepted[r] + 1 tokens (the last one from the residual, or the bonus token), except that the
    final round may be cut at max_new_tokens or at eos.
    """
    proposed: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    target_calls: int = 0
    draft_calls: int = 0
    new_tokens: int = 0
    trace: list[tuple[list[int], int, int]] | None = None  # with trace=True: (proposal ids, n accepted, next id)

    @property
    def rounds(self) -> int:
        return len(self.proposed)

    @property
    def acceptance_rate(self) -> float:
        """Estimate of alpha: accepted / examined proposals. A proposal is examined when all before it
        in its round were accepted, so examined = accepted + rejections (rounds that stopped early)."""
        rejections = sum(a < p for a, p in zip(self.accepted, self.proposed))
        examined = sum(self.accepted) + rejections
        return sum(self.accepted) / examined if examined else float("nan")

    @property
    def tokens_per_target_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else float("nan")

    def merge(self, other: "SpeculativeStats") -> "SpeculativeStats":
        trace = None if self.trace is None or other.trace is None else self.trace + other.trace
        return SpeculativeStats(self.proposed + other.proposed, self.accepted + other.accepted,
                                self.target_calls + other.target_calls, self.draft_calls + other.draft_calls,
                                self.new_tokens + other.new_tokens, trace)


def expected_tokens_per_target_call(alpha: float, gamma: int) -> float:
    """(1 - alpha^(gamma+1)) / (1 - alpha): committed tokens per round when each proposal is accepted
    independently with probability alpha (Leviathan et al., eq. 1)."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1]; got {alpha!r}")
    if not isinstance(gamma, int) or gamma < 0:
        raise ValueError(f"gamma must be an int >= 0; got {gamma!r}")
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def acceptance_probability(p_target: torch.Tensor, p_draft: torch.Tensor) -> torch.Tensor:
    """The chance that a token drawn from p_draft is accepted: sum_x min(p_target(x), p_draft(x)),
    i.e. 1 - total variation distance. Works on (..., V), returns (...)."""
    return torch.minimum(p_target, p_draft).sum(-1)


def accept_or_resample(p_target: torch.Tensor, p_draft: torch.Tensor | None, draft_tokens: torch.Tensor,
                       generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The verification rule, for one round or for a batch of independent rounds.

    p_target:     (..., gamma + 1, V) the target's distributions at the gamma proposed positions and one more
    p_draft:      (..., gamma, V) the distributions the proposals were drawn from; None means a
                  deterministic drafter (prompt lookup): p_draft is one-hot at each proposal
    draft_tokens: (..., gamma) the proposals
    Returns n_accepted (...) in 0..gamma and next_token (...): the token that follows the accepted
    ones, from norm(max(0, p_target - p_draft)) at the first rejected position, or from p_target's
    extra position when all were accepted (the bonus token).

    Random numbers, in this order: gamma uniforms (one per proposal; u < p_target/p_draft accepts, written
    u * p_draft < p_target so nothing divides by zero), then one multinomial draw per round.
    """
    check_generator(generator)
    _check_round_shapes(p_target, p_draft, draft_tokens)
    u = torch.rand(draft_tokens.shape, generator=generator, device=p_target.device)  # (..., gamma)
    n_accepted, residual = acceptance(p_target, p_draft, draft_tokens, u)
    V = p_target.shape[-1]
    next_token = torch.multinomial(residual.reshape(-1, V), 1, generator=generator).view(n_accepted.shape)
    return n_accepted, next_token  # (multinomial normalises the residual)


def _check_round_shapes(p_target, p_draft, draft_tokens) -> None:
    gamma = draft_tokens.shape[-1]
    if p_target.shape[-2] != gamma + 1:
        raise ValueError(f"p_target must have gamma + 1 = {gamma + 1} positions; got {p_target.shape[-2]}")
    if p_draft is not None and p_draft.shape[-2] != gamma:
        raise ValueError(f"p_draft must have gamma = {gamma} positions; got {p_draft.shape[-2]}")


def acceptance(p_target: torch.Tensor, p_draft: torch.Tensor | None, draft_tokens: torch.Tensor,
               u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule of accept_or_resample with its gamma uniforms u (..., gamma) given: returns n_accepted (...)
    and the (unnormalised) distribution (..., V) the next token is drawn from. No shape checks and no
    device -> host read, so a compiled graph can hold it (the fused sampled round)."""
    gamma = draft_tokens.shape[-1]
    V = p_target.shape[-1]
    idx = draft_tokens.unsqueeze(-1)  # (..., gamma, 1)
    p_target_x = p_target[..., :gamma, :].gather(-1, idx).squeeze(-1)  # (..., gamma)
    p_draft_x = torch.ones_like(p_target_x) if p_draft is None else p_draft.gather(-1, idx).squeeze(-1)
    accepted = u * p_draft_x < p_target_x  # (..., gamma): u < p_target / p_draft, without dividing
    n_accepted = accepted.long().cumprod(-1).sum(-1)  # (...,) length of the leading run of acceptances
    # the next token's distribution: the residual at position n_accepted; at n_accepted == gamma the
    # draft row is zero padding, so the same formula gives p_target's extra row (the bonus token)
    lead = n_accepted.shape
    pick = n_accepted.view(*lead, 1, 1).expand(*lead, 1, V)  # (..., 1, V)
    p_target_n = p_target.gather(-2, pick).squeeze(-2)  # (..., V)
    if p_draft is None:
        draft_padded = torch.nn.functional.pad(draft_tokens, (0, 1), value=-1)  # (..., gamma + 1)
        x_n = draft_padded.gather(-1, n_accepted.unsqueeze(-1))  # (..., 1)
        residual = p_target_n.masked_fill(torch.arange(V, device=x_n.device) == x_n, 0.0)
    else:
        p_draft_padded = torch.nn.functional.pad(p_draft, (0, 0, 0, 1))  # (..., gamma + 1, V)
        residual = (p_target_n - p_draft_padded.gather(-2, pick).squeeze(-2)).clamp_min(0.0)  # (..., V)
    # a rejection has probability zero when the residual is all zero; guard against float rounding
    return n_accepted, torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_target_n)


def greedy_accept(target_argmax: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """accept_or_resample for one-hot distributions (temperature 0), without building them.

    target_argmax (..., gamma + 1), draft_tokens (..., gamma). A one-hot p_target accepts x_i with
    probability 1 if x_i is its argmax and 0 otherwise; the residual of two different one-hots is the
    target's one-hot. So: accept while the tokens agree, then take the target's argmax. No randomness.
    """
    gamma = draft_tokens.shape[-1]
    agree = draft_tokens == target_argmax[..., :gamma]
    n_accepted = agree.long().cumprod(-1).sum(-1)
    return n_accepted, target_argmax.gather(-1, n_accepted.unsqueeze(-1)).squeeze(-1)


def _verify(target, ids, n: int, g: int, sampling: SamplingConfig, p_draft, generator):
    """One target pass over the last committed token (position n - 1) and the g proposals at n..n+g-1,
    then the acceptance rule. target: a stepper (_EagerSteps or _StaticSteps) whose length is n - 1.
    p_draft (g, V) or None (a deterministic proposer, e.g. prompt lookup).
    Returns (number accepted, next token), both 0-d tensors on the model's device."""
    logits = target.logits(ids[:, n - 1:n + g])  # (g + 1, V)
    proposals = ids[0, n:n + g]  # (g,)
    if sampling.greedy:
        return greedy_accept(next_token(logits, sampling)[:, 0], proposals)  # next_token checks the logits
    return accept_or_resample(probabilities(logits, sampling), p_draft, proposals, generator)


class _EagerSteps:
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


class _StaticSteps:
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
        self._inputs = {T: (torch.zeros(1, T, dtype=torch.long, device=device),
                            torch.zeros(T, dtype=torch.long, device=device)) for T in {1, *token_counts}}

    def logits(self, tokens: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        T, start = tokens.shape[1], self.length
        fast = self.fast
        if T in self._inputs:
            tok, pos = self._inputs[T]  # (1, T), (T,)
            tok.copy_(tokens)
            pos.copy_(self._arange[start:start + T])
            logits = fast.forward(tok, pos)[0]  # (T, V)
        elif T in fast.compiled_token_counts:  # a graph warmed up for another gamma
            logits = fast.forward(tokens, self._arange[start:start + T])[0]  # (T, V)
        else:
            # no graph for this T (the prefill, a short last round): the eager dynamic path on the same
            # buffers, which attends over positions 0..start+T-1 only, not over the whole masked buffer
            # (the prefill of the bench's 64-token prompts: 2x faster); cache.length is its bookkeeping,
            # which the static steps ignore
            fast.cache.length = start
            logits = fast.decode_model(tokens, cache=fast.cache, last_only=last_only, check=False)[0]
        self.length = start + T
        return logits[-1:] if last_only else logits

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"length must be in [0, {self.length}]; got {length}")
        self.length = length


class FusedRounds:
    """A whole round on two compiled FastGenerators as ONE compiled graph: the draft's gamma proposals (each
    drawn inside the graph and fed straight into the next draft step), the target's verify pass over
    gamma + 1 positions, and the acceptance rule. Python sees the round once: one call, one device -> host
    read of (accepted, next token, logits usable, proposals).

    Greedy (sampled=False): each proposal is the draft's argmax, acceptance is greedy_accept. Sampled: both
    models' distributions are softmax(logits / temperature), as sampling.probabilities computes them (the
    temperature is an input, so one graph serves every temperature); a compiled graph takes no
    torch.Generator, so each round's 2 * gamma + 1 uniforms (gamma draft draws, gamma acceptance tests, one
    draw of the next token) are drawn from the caller's generator on the host and passed in, and every
    draw is sampling.sample_from_uniform (inverse CDF). The acceptance is `acceptance`, the rule
    accept_or_resample uses, so each committed token keeps the target's distribution; a seed fixes the
    tokens, but not the ones the loop of model calls (multinomial draws) would give.

    Per round, the loop of model calls pays torch.compile's wrapper, a copy of the inputs and the draw with
    its check between gamma + 1 graph calls (`python -m helpers.bench` times both loops against plain
    compiled decoding, on the same prompts in the same run). The draft always starts from the two
    committed tokens at n - 2 and n - 1, so that one graph serves both cases: after a partial acceptance
    it rewrites the K/V it already holds at n - 2 with the same token, after a full acceptance it catches
    up on the proposal it never saw. Positions are a tensor input, so one graph serves every round of
    every generation with this gamma; rounds cut short by max_new_tokens, and a first round with n < 2,
    use the loop of model calls. Not fused: top-k, top-p and min-p (their values would be compiled in, a
    graph per setting), so those rounds call the models one at a time."""

    def __init__(self, target: FastGenerator, draft: FastGenerator, gamma: int, sampled: bool = False):
        self.target, self.draft, self.gamma, self.sampled = target, draft, gamma, sampled
        device = target.model.device
        self._last2 = torch.zeros(1, 2, dtype=torch.long, device=device)  # (1, 2): ids at n-2, n-1
        self._n = torch.zeros(1, dtype=torch.long, device=device)  # (1,): the committed length
        self._arange = torch.arange(gamma + 1, device=device)  # (gamma + 1,)
        self._u = torch.full((2 * gamma + 1,), 0.5, device=device)  # (2 gamma + 1,) a sampled round's uniforms
        self._temperature = torch.ones((), device=device)  # a sampled round's temperature, a 0-d input
        # the round multiplies as the generators' own steps do: when both run inductor's autotuned GEMM
        # (opt-in, on frozen weights) so does the round, or its products would be the library's, slower
        # than the plain step it is compared with; otherwise the weights stay inputs (library products;
        # a frozen round without the GEMM loaded from the on-disk cache in 8-10 s, not ~2)
        self.freeze = target.gemm_autotune and draft.gemm_autotune
        self.room = _round_room(target, draft)  # a round needs n + gamma <= room
        self._fn = torch.compile(self._sampled_round if sampled else self._greedy_round,
                                 **compile_options(target.mode, cpp_wrapper=target.cpp_wrapper, freeze=self.freeze,
                                                   gemm_autotune=self.freeze))
        self.compiled = False
        self.compile_seconds = 0.0

    # compiled, undecorated (see FastGenerator._static_step); called under no_grad
    def _draft_logits(self, last2, n, i, previous):  # the draft's logits (V,) for position n + i
        d = self.draft
        if i == 0:  # ids at n-2, n-1
            return d.decode_model(last2, cache=d.cache, input_pos=n - 2 + self._arange[:2], check=False)[0, -1]
        return d.decode_model(previous.view(1, 1), cache=d.cache, input_pos=n - 1 + i, check=False)[0, -1]

    def _verify_logits(self, last2, proposed, n):  # the target's logits (gamma + 1, V) at n-1 .. n+gamma-1
        t, g = self.target, self.gamma
        verify = torch.cat([last2[0, 1:], proposed]).view(1, g + 1)  # (1, gamma + 1)
        return t.decode_model(verify, cache=t.cache, input_pos=n - 1 + self._arange, check=False)[0]

    def _greedy_round(self, last2, n):  # last2 (1, 2) ids at positions n-2, n-1; n (1,)
        proposals, finite = [], torch.ones((), dtype=torch.bool, device=last2.device)  # gamma x (1,)
        for i in range(self.gamma):
            logits = self._draft_logits(last2, n, i, proposals[-1] if proposals else None)  # (V,)
            finite &= torch.isfinite(logits.amax())  # sampling.check_logits's test, kept in the graph
            proposals.append(logits.argmax(-1, keepdim=True))
        proposed = torch.cat(proposals)  # (gamma,)
        t_logits = self._verify_logits(last2, proposed, n)  # (gamma + 1, V)
        finite &= torch.isfinite(t_logits.amax(-1)).all()
        n_accepted, nxt = greedy_accept(t_logits.argmax(-1), proposed)
        return torch.cat([n_accepted.view(1), nxt.view(1), finite.long().view(1), proposed])  # (3 + gamma,)

    def _sampled_round(self, last2, n, u, temperature):  # ... and u (2 gamma + 1,), temperature 0-d
        g = self.gamma
        proposals, p_draft, finite = [], [], torch.ones((), dtype=torch.bool, device=last2.device)
        for i in range(g):
            logits = self._draft_logits(last2, n, i, proposals[-1] if proposals else None)  # (V,)
            finite &= torch.isfinite(logits.amax())
            p_draft.append(apply_temperature(logits.float(), temperature).softmax(-1))  # (V,), as probabilities()
            proposals.append(sample_from_uniform(p_draft[-1], u[i]).view(1))
        proposed = torch.cat(proposals)  # (gamma,)
        t_logits = self._verify_logits(last2, proposed, n)  # (gamma + 1, V)
        finite &= torch.isfinite(t_logits.amax(-1)).all()
        p_target = apply_temperature(t_logits.float(), temperature).softmax(-1)  # (gamma + 1, V)
        n_accepted, residual = acceptance(p_target, torch.stack(p_draft), proposed, u[g:2 * g])
        nxt = sample_from_uniform(residual, u[2 * g])
        return torch.cat([n_accepted.view(1), nxt.view(1), finite.long().view(1), proposed])  # (3 + gamma,)

    def _inputs(self):
        return (self._last2, self._n, self._u, self._temperature) if self.sampled else (self._last2, self._n)

    @torch.no_grad()  # the grad mode of the loop that calls it
    def warmup(self) -> Exception | None:
        """Compile now (if not yet) at n = 2, leaving both caches as they were; returns the error, if any."""
        if self.compiled:
            return None
        self._last2.zero_()
        self._n.fill_(2)
        error, seconds, _ = warm_compiled(self._fn, self._inputs(), [self.target.cache, self.draft.cache],
                                          self.gamma + 2, self.freeze)
        self.compile_seconds += seconds
        self.compiled = error is None
        return error

    def __call__(self, ids: torch.Tensor, n: int, sampling: SamplingConfig,
                 generator: torch.Generator | None = None) -> tuple[int, int, list[int]]:
        """One round after the n committed ids in ids (1, S) (n >= 2): writes the accepted proposals and the
        next token into ids[0, n:n + accepted + 1]; returns (accepted, next token, the proposals)."""
        self._last2.copy_(ids[:, n - 2:n])
        self._n.fill_(n)
        if self.sampled:
            self._temperature.fill_(sampling.temperature)
            torch.rand(self._u.shape, generator=generator, device=self._u.device, out=self._u)
        out = self._fn(*self._inputs())  # (3 + gamma,)
        k, nxt, finite, *proposed = out.tolist()  # the round's one device -> host read
        if not finite:
            raise ValueError("the draft's or the target's logits hold NaN or +inf, or a row of nothing but -inf "
                             "(allowed: finite values, with -inf for masked tokens); NaN logits usually mean "
                             "the model overflowed")
        ids[0, n:n + self.gamma] = out[3:]
        ids[0, n + k] = nxt  # overwrites the first rejected proposal, if any
        return k, nxt, proposed


def fuses_rounds(sampling: SamplingConfig) -> bool:
    """Whether the compiled loop runs this config's full rounds as one graph each (FusedRounds): greedy,
    or plain temperature sampling (no top-k, top-p or min-p)."""
    return sampling.greedy or (sampling.top_k == 0 and sampling.top_p == 1.0 and sampling.min_p == 0.0)


# target FastGenerator -> {(draft FastGenerator's id, gamma, sampled): its compiled round}; a round holds its
# draft, so that id stays the draft's while the entry exists
_FUSED_ROUNDS: "weakref.WeakKeyDictionary[FastGenerator, dict]" = weakref.WeakKeyDictionary()


def fused_rounds(target: FastGenerator, draft: FastGenerator, gamma: int, sampled: bool) -> FusedRounds | None:
    """The compiled round of this kind for these generators and gamma, compiling it on first use; None when
    either generator is not compiled or the round failed to compile (then the loop of model calls runs)."""
    if not (target.compiled and draft.compiled):
        return None
    rounds = _FUSED_ROUNDS.setdefault(target, {})
    key = (id(draft), gamma, sampled)
    if key not in rounds:
        fused = FusedRounds(target, draft, gamma, sampled)
        error = fused.warmup()
        if error is not None:
            kind = "sampled" if sampled else "greedy"
            warnings.warn(f"torch.compile failed for the fused {kind} round ({type(error).__name__}: "
                          f"{str(error)[:200]}); {kind} rounds call the models one at a time", stacklevel=2)
            fused = None
        rounds[key] = fused
    return rounds[key]


def _round_room(target: FastGenerator, draft: FastGenerator) -> int:
    """A round at n writes the target's cache at n-1 .. n+gamma-1 and the draft's at n-2 .. n+gamma-2, so both
    fit when n + gamma <= this."""
    return min(target.cache.max_seq_len, draft.cache.max_seq_len + 1)


def fused_round_call(fast_target: FastGenerator, fast_draft: FastGenerator, gamma: int, position: int,
                     sampled: bool = False):
    """A zero-argument function that runs one compiled round (gamma draft steps and the verify pass, one graph:
    FusedRounds) after `position` committed tokens, for timing it against a single target step; None when
    the round does not compile. It writes both caches (the target's at position - 1 .. position + gamma - 1,
    the draft's one lower), so time it before a generation (which prefills again), not in the middle of one.
    Greedy by default; with sampled=True, a temperature-1 round on fixed uniforms."""
    _check_gamma(gamma)
    rounds = fused_rounds(fast_target, fast_draft, gamma, sampled)
    limit = _round_room(fast_target, fast_draft) - gamma
    if not isinstance(position, int) or not 2 <= position <= limit:
        raise ValueError(f"position must be an int in [2, {limit}] for these caches; got {position!r}")
    if rounds is None:
        return None

    @torch.no_grad()  # the grad mode the round was compiled under
    def run():
        rounds._last2.zero_()
        rounds._n.fill_(position)
        return rounds._fn(*rounds._inputs())
    return run


def speculative_token_counts(gamma: int) -> dict[str, tuple[int, ...]]:
    """Tokens per call that a round of the static loop uses, by model: the target's verify pass (gamma + 1)
    and the draft's steps (1, and 2 when it catches up after a fully accepted round)."""
    return {"target": (gamma + 1,), "draft": (1, 2)}


def warmup_speculative(fast_target: FastGenerator, fast_draft: FastGenerator, gamma: int = DEFAULT_COMPILED_GAMMA,
                       *, temperature: float = 0.0, sampling: SamplingConfig | None = None) -> float:
    """Compile every graph speculative_generate(fast_target, fast_draft, ..., gamma=gamma) uses with these
    sampling settings (the same arguments): each model's steps for the loop of model calls, and the
    round as one graph (FusedRounds, greedy or sampled) where fuses_rounds(sampling). Returns the seconds
    the generators' warm-ups took so far plus the compile seconds of this pair's rounds at this gamma (time
    it apart from the generation; a difference of two calls with different gammas is not a warm-up time)."""
    _check_gamma(gamma)
    sampling = _check_sampling(sampling, temperature)
    counts = speculative_token_counts(gamma)
    seconds = fast_target.warmup(counts["target"]) + fast_draft.warmup(counts["draft"])
    if fuses_rounds(sampling):
        fused_rounds(fast_target, fast_draft, gamma, sampled=not sampling.greedy)  # compiles on first use
    rounds = _FUSED_ROUNDS.get(fast_target, {})
    return seconds + sum(r.compile_seconds for (d, g, _), r in rounds.items()
                         if d == id(fast_draft) and g == gamma and r is not None)


def _check_sampling(sampling: SamplingConfig | None, temperature: float) -> SamplingConfig:
    if sampling is None:
        sampling = SamplingConfig(temperature=temperature)
    if sampling.repetition_penalty != 1.0 or sampling.presence_penalty or sampling.frequency_penalty:
        raise ValueError("speculative decoding here supports temperature, top_k, top_p and min_p; "
                         "repetition_penalty must be 1.0 and presence_penalty / frequency_penalty 0.0 "
                         f"(got {sampling.repetition_penalty}, {sampling.presence_penalty}, "
                         f"{sampling.frequency_penalty})")
    return sampling


def _check_gamma(gamma, name="gamma"):
    if not isinstance(gamma, int) or isinstance(gamma, bool) or not 1 <= gamma <= 64:
        raise ValueError(f"{name} must be an int in [1, 64]; got {gamma!r}")


class _Buffer:
    """Committed ids (and the current round's proposals after them) in one preallocated (1, S) tensor."""

    def __init__(self, prompt: torch.Tensor, max_new_tokens: int, gamma: int):
        T = prompt.shape[1]
        self.ids = torch.empty(1, T + max_new_tokens + gamma + 1, dtype=torch.long, device=prompt.device)
        self.ids[:, :T] = prompt
        self.n = T  # committed length


def _finish(buf: _Buffer, prompt_len: int, max_new_tokens: int, eos_id, stats: SpeculativeStats):
    end = min(buf.n, prompt_len + max_new_tokens)
    if eos_id is not None:
        new = buf.ids[0, prompt_len:end].tolist()
        if eos_id in new:
            end = prompt_len + new.index(eos_id) + 1
    stats.new_tokens = end - prompt_len
    return buf.ids[:, :end].clone()


def _check_common(target, prompt, max_new_tokens, gamma, sampling, temperature, generator, name="gamma"):
    check_generator(generator)
    prompt = as_prompt_tensor(prompt, target)
    if prompt.shape[0] != 1:
        raise ValueError(f"speculative decoding needs batch size 1; got prompt batch size {prompt.shape[0]}")
    check_generation_length(prompt.shape[1], max_new_tokens, target.cfg.max_seq_len)
    _check_gamma(gamma, name)
    return prompt, _check_sampling(sampling, temperature)


def speculative_generate(target, draft, prompt, max_new_tokens: int, *, gamma: int | None = None,
                         temperature: float = 0.0, sampling: SamplingConfig | None = None,
                         generator: torch.Generator | None = None, eos_id: int | None = None,
                         trace: bool = False, fuse_rounds: bool = True) -> tuple[torch.Tensor, SpeculativeStats]:
    """Generate max_new_tokens after `prompt` (batch size 1) with `draft` proposing `gamma` tokens per round.

    Returns ((1, T + n_new) ids, SpeculativeStats). At temperature 0 the ids equal
    `generate(target, prompt, max_new_tokens)`; otherwise each token has the target's distribution.
    The two models must share the tokenizer (same vocab_size), and the draft's context window must hold
    prompt + max_new_tokens, as the target's must (checked up front). trace=True records every round's
    proposals in stats.trace (one extra device -> host read per round).

    target and draft are both models (the eager loop, each with a fresh KVCache; gamma defaults to
    DEFAULT_GAMMA) or both FastGenerators (the static, compiled steps, on the generators' own caches;
    gamma defaults to DEFAULT_COMPILED_GAMMA, or DEFAULT_COMPILED_SAMPLED_GAMMA at temperature > 0; the
    first call compiles what `warmup_speculative` would with the same arguments).
    fuse_rounds (compiled FastGenerators, greedy or plain temperature sampling: `fuses_rounds`): run each
    full round as one compiled graph (FusedRounds); False calls the models one at a time, as top-k,
    top-p and min-p always do.
    """
    static = isinstance(target, FastGenerator)
    if static != isinstance(draft, FastGenerator):
        raise ValueError("target and draft must both be models or both FastGenerators; got "
                         f"{type(target).__name__} and {type(draft).__name__}")
    if gamma is None:
        greedy = _check_sampling(sampling, temperature).greedy  # validates the settings first
        gamma = (DEFAULT_COMPILED_GAMMA if greedy else DEFAULT_COMPILED_SAMPLED_GAMMA) if static else DEFAULT_GAMMA
    t_model, d_model = (target.model, draft.model) if static else (target, draft)
    prompt, sampling = _check_common(t_model, prompt, max_new_tokens, gamma, sampling, temperature, generator)
    if d_model.cfg.vocab_size != t_model.cfg.vocab_size:
        raise ValueError(f"draft and target must share a vocabulary; vocab_size {d_model.cfg.vocab_size} "
                         f"!= {t_model.cfg.vocab_size}")
    T = prompt.shape[1]
    # the draft reads the same sequence, so it needs the same room (its proposals never go past
    # max_new_tokens); checked now, or its cache would overflow in the middle of the run
    check_generation_length(T, max_new_tokens, d_model.cfg.max_seq_len, window="the draft model's context window")
    if not static:
        S = min(T + max_new_tokens + gamma, t_model.cfg.max_seq_len)
        with torch.inference_mode():
            return _speculative_loop(_EagerSteps(t_model, S), _EagerSteps(d_model, min(S, d_model.cfg.max_seq_len)),
                                     prompt, max_new_tokens, gamma, sampling, generator, eos_id, trace)
    # static: positions n - 1 .. n + g of a round stay below T + max_new_tokens (g stops at max_new_tokens)
    for name, fast in (("target", target), ("draft", draft)):
        if fast.cache.batch_size != 1:
            raise ValueError(f"the {name} FastGenerator must have batch_size=1; got {fast.cache.batch_size}")
        if T + max_new_tokens > fast.cache.max_seq_len:
            raise ValueError(f"prompt ({T}) + max_new_tokens ({max_new_tokens}) exceeds the {name} "
                             f"FastGenerator's max_seq_len={fast.cache.max_seq_len}")
    warmup_speculative(target, draft, gamma, sampling=sampling)  # a no-op once compiled
    counts = speculative_token_counts(gamma)
    # no_grad, not inference_mode: the graphs were compiled under no_grad, and another grad mode is a
    # guard failure (a second compile)
    # after the first round, skip dynamo's guard checks: that round checked them for every graph a round
    # uses (fast_decode.guards_checked_once)
    later = guards_checked_once if target.compiled else None
    fused = fused_rounds(target, draft, gamma, not sampling.greedy) if fuse_rounds and fuses_rounds(sampling) else None
    with torch.no_grad():
        return _speculative_loop(_StaticSteps(target, counts["target"]), _StaticSteps(draft, counts["draft"]),
                                 prompt, max_new_tokens, gamma, sampling, generator, eos_id, trace, later, fused)


def _speculative_loop(target, draft, prompt, max_new_tokens, gamma, sampling, generator, eos_id, trace,
                      later_rounds=None, fused=None):
    """The rounds, on two steppers (_EagerSteps or _StaticSteps): logits(tokens) at positions
    length..length+T-1, and truncate(n). later_rounds: a context manager factory entered after the
    first round (the static path's guard skipping). fused: a FusedRounds for the steppers' generators and
    this kind of sampling, which then runs every full-length round with n >= 2."""
    with contextlib.ExitStack() as stack:
        return _rounds(target, draft, prompt, max_new_tokens, gamma, sampling, generator, eos_id, trace,
                       (lambda: stack.enter_context(later_rounds())) if later_rounds else None, fused)


def _rounds(target, draft, prompt, max_new_tokens, gamma, sampling, generator, eos_id, trace, after_first,
            fused=None):
    T = prompt.shape[1]
    stats = SpeculativeStats(trace=[] if trace else None)
    if max_new_tokens == 0:
        return prompt.clone(), stats
    buf = _Buffer(prompt, max_new_tokens, gamma)
    if T > 1:  # prefill everything but the last prompt token: the first round feeds it
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
            # _finish drops what lands past max_new_tokens: a shorter round would run the models eagerly
            # (no graph is compiled for its length): 6.1 ms against 1.6 ms for a full round (course models,
            # 128 tokens, one thread on an AMD Zen 5 VM)
            g = gamma
            k, nxt, proposed = fused(ids, n, sampling, generator)
            target.length, draft.length = n + g, n + g - 1
            if trace:
                stats.trace.append((proposed, k, nxt))
        else:
            k = _round_of_calls(target, draft, ids, n, g, sampling, generator, p_draft, stats, trace)
        stats.draft_calls += g
        stats.target_calls += 1
        stats.proposed.append(g)
        stats.accepted.append(k)
        buf.n = n + k + 1
        # 5. roll back: the target has seen everything but the new last token; the draft never saw
        # the last proposal, so after a full acceptance it lags by one more (fed next round)
        target.truncate(n + k)
        draft.truncate(min(n + k, draft.length))
        if eos_id is not None and eos_id in ids[0, n:n + k + 1].tolist():
            break
        if after_first is not None and stats.rounds == 1:
            after_first()
    return _finish(buf, T, max_new_tokens, eos_id, stats), stats


def _round_of_calls(target, draft, ids, n, g, sampling, generator, p_draft, stats, trace) -> int:
    """Steps 1-4 of a round, one model call at a time: writes the accepted proposals and the next token
    into ids[0, n:n + accepted + 1] (and, with trace, the round into stats.trace); returns the number accepted."""
    greedy = sampling.greedy
    # 1. draft g tokens; the first step also feeds the committed tokens the draft has not seen (1 or 2)
    d_start = draft.length
    for i in range(g):
        x = ids[:, d_start:n] if i == 0 else ids[:, n + i - 1:n + i]  # (1, 1 or 2)
        logits = draft.logits(x, last_only=True)[-1]  # (V,)
        if greedy:
            ids[0, n + i] = next_token(logits, sampling)  # the argmax, after checking the logits
        else:
            p_draft[i] = probabilities(logits, sampling)
            ids[0, n + i] = torch.multinomial(p_draft[i], 1, generator=generator)[0]
    # 2.-4. the target scores them in one pass; accept a prefix, then the residual or bonus token
    n_acc, nxt = _verify(target, ids, n, g, sampling, None if greedy else p_draft[:g], generator)
    if trace:
        stats.trace.append((ids[0, n:n + g].tolist(), int(n_acc), int(nxt)))
    ids[0, n + n_acc] = nxt  # overwrites the first rejected proposal, if any
    return int(n_acc)  # the round's one device -> host read


class NgramIndex:
    """For each n-gram of the sequence so far, where its most recent occurrence ended, so that the
    continuation after it can be proposed. Updated incrementally: O(max_ngram) dict writes per token."""

    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM, min_ngram: int = 1):
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (min_ngram, max_ngram)) \
                or not 1 <= min_ngram <= max_ngram:
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
                self.table[tuple(toks[e - n:e])] = e

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the most recent earlier occurrence of the longest matching suffix."""
        toks = self.tokens
        for n in range(min(self.max_ngram, len(toks)), self.min_ngram - 1, -1):
            e = self.table.get(tuple(toks[-n:]))
            if e is not None:
                return toks[e:e + k]
        return []


@torch.inference_mode()
def prompt_lookup_generate(target, prompt, max_new_tokens: int, *, gamma: int = DEFAULT_LOOKUP_GAMMA,
                           max_ngram: int = DEFAULT_MAX_NGRAM, min_ngram: int = DEFAULT_MIN_NGRAM,
                           temperature: float = 0.0, sampling: SamplingConfig | None = None,
                           generator: torch.Generator | None = None,
                           eos_id: int | None = None, trace: bool = False) -> tuple[torch.Tensor, SpeculativeStats]:
    """Speculative decoding with prompt lookup as the drafter: no draft model.

    Each round proposes up to `gamma` tokens: the continuation of the most recent earlier occurrence of
    the last n tokens (n from max_ngram down to min_ngram), or nothing, in which case the round is a
    plain decode step. The proposals are deterministic (p_draft one-hot), so `accept_or_resample`
    keeps the output distribution exactly the target's; at temperature 0 the ids equal `generate`'s.
    """
    prompt, sampling = _check_common(target, prompt, max_new_tokens, gamma, sampling, temperature, generator)
    index = NgramIndex(max_ngram, min_ngram)  # checks max_ngram / min_ngram before any model work
    T = prompt.shape[1]
    stats = SpeculativeStats(trace=[] if trace else None)
    if max_new_tokens == 0:
        return prompt.clone(), stats
    buf = _Buffer(prompt, max_new_tokens, gamma)
    steps = _EagerSteps(target, min(T + max_new_tokens + gamma, target.cfg.max_seq_len))
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
            ids[0, n:n + g] = torch.tensor(proposal, dtype=torch.long)
        n_acc, nxt = _verify(steps, ids, n, g, sampling, None, generator)
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
        if eos_id is not None and eos_id in index.tokens[n:n + k + 1]:
            break
    return _finish(buf, T, max_new_tokens, eos_id, stats), stats


# --- checking exactness: is a sample distributed as p_target? ---------------------------------------

def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    """Half the L1 distance between two distributions over the same outcomes: the largest difference in
    probability they give to any set of outcomes."""
    return 0.5 * float((p.double() - q.double()).abs().sum())


def chi_square_test(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Pearson's goodness-of-fit test of observed `counts` against `probs` (same outcomes, 1-D).

    Outcomes whose expected count is below `min_expected` are pooled into one bin, so the chi-square
    approximation holds. Returns (statistic, degrees of freedom, p-value); a tiny p-value says the
    counts did not come from `probs`. The p-value is the chi-square survival function,
    Q(dof/2, statistic/2) (the regularised upper incomplete gamma function).
    """
    counts, probs = counts.double().flatten(), probs.double().flatten()
    if counts.shape != probs.shape:
        raise ValueError(f"counts and probs must have the same number of outcomes; got {counts.numel()} "
                         f"and {probs.numel()}")
    n = counts.sum()
    expected = n * probs / probs.sum()
    if (counts[expected == 0] > 0).any():  # an impossible outcome happened: certainly not from probs
        return float("inf"), int((expected > 0).sum()) - 1, 0.0
    big = expected >= min_expected
    obs, exp = counts[big], expected[big]
    if (~big).any():  # pool the rare outcomes: into their own bin, or into the rarest kept bin if still too rare
        rare_obs, rare_exp = counts[~big].sum(), expected[~big].sum()
        if rare_exp >= min_expected or obs.numel() == 0:
            obs, exp = torch.cat([obs, rare_obs.view(1)]), torch.cat([exp, rare_exp.view(1)])
        else:
            j = int(exp.argmin())
            obs, exp = obs.clone(), exp.clone()
            obs[j] += rare_obs
            exp[j] += rare_exp
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = int(obs.numel()) - 1
    if dof < 1:
        raise ValueError("chi_square_test needs at least 2 outcomes with enough expected counts; "
                         f"got {obs.numel()} (lower min_expected or draw more samples)")
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                            torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, dof, p_value
