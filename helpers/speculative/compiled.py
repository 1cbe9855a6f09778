"""A whole speculative round as one compiled graph (FusedRounds), and the warm-up of every graph a
compiled speculative generation uses.

The loop of model calls (helpers.speculative.loop) pays torch.compile's wrapper, a copy of the inputs and
a device -> host read between gamma + 1 graph calls; a fused round pays them once. Compiled rounds are
kept per pair of generators (fused_rounds), so a second generation reuses them.
"""

from __future__ import annotations

import warnings
import weakref

import torch

from ..fast_decode import FastGenerator, warm_compiled
from ..sampling import SamplingConfig, apply_temperature, sample_from_uniform
from .loop import DEFAULT_COMPILED_GAMMA
from .prefill import compiled_for_pair, fused_prefill
from .rule import acceptance, check_gamma, check_sampling, greedy_accept


class FusedRounds:
    """A whole round on two compiled FastGenerators as ONE compiled graph: the draft's gamma proposals (each
    drawn inside the graph and fed straight into the next draft step), the target's verify pass over
    gamma + 1 positions, and the acceptance rule. Python sees the round once: one call, one device -> host
    read of (accepted, next token, logits usable, proposals). The graph also does the round's bookkeeping:
    it reads the committed ids at n - 2, n - 1 from its own id buffer (`ids`, which the loop uses as its
    buffer), writes the accepted proposals and the next token there and advances the committed length n,
    an input it keeps between rounds, so the host copies nothing in or out per round.

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
        # the loop's id buffer lives here (run_rounds takes its first columns as IdBuffer's), so that the graph
        # reads the two committed ids at n-2, n-1 and writes the accepted proposals and the next token itself:
        # the host copies nothing per round. Room for any generation these caches hold, plus a round's writes.
        self.ids = torch.zeros(1, target.cache.max_seq_len + gamma + 1, dtype=torch.long, device=device)  # (1, L)
        self._n = torch.zeros(1, dtype=torch.long, device=device)  # (1,): the committed length, advanced in the graph
        self._n_value = -1  # what self._n holds, as an int (-1: unknown, set it before the next round)
        self._arange = torch.arange(gamma + 1, device=device)  # (gamma + 1,)
        self._u = torch.full((2 * gamma + 1,), 0.5, device=device)  # (2 gamma + 1,) a sampled round's uniforms
        self._temperature = torch.ones((), device=device)  # a sampled round's temperature, a 0-d input
        self._temperature_value = 1.0
        # the round multiplies as the generators' own steps do: when both run inductor's autotuned GEMM
        # (opt-in, on frozen weights) so does the round, or its products would be the library's, slower
        # than the plain step it is compared with; otherwise the weights stay inputs (the generators' own
        # products: on a CPU by default the generated sums of row_sums.py, the verify pass's rows in one loop
        # over each weight; a frozen round without the GEMM loaded from the on-disk cache in 8-10 s, not ~2)
        self.room = round_room(target, draft)  # a round needs n + gamma <= room
        self._fn, self.freeze = compiled_for_pair(self._sampled_round if sampled else self._greedy_round, target, draft)
        self.compiled = False
        self.compile_seconds = 0.0

    # compiled, undecorated (see FastGenerator._static_step); called under no_grad
    def _last2(self, ids, n):  # (1, 2): the committed ids at positions n-2, n-1
        return ids[:, n - 2 + self._arange[:2]]

    def _commit(self, ids, n, n_accepted, nxt, proposed):
        """Write the accepted proposals and the next token at n .. n + n_accepted (what lies past them is
        not committed: the next round overwrites it) and advance n by n_accepted + 1, in the graph."""
        j = self._arange  # (gamma + 1,)
        ids[0, n + j] = torch.where(j < n_accepted, torch.cat([proposed, proposed[-1:]]), nxt)  # (gamma + 1,)
        n.add_(n_accepted + 1)

    def _draft_logits(self, last2, n, i, previous):  # the draft's logits (V,) for position n + i
        d = self.draft
        if i == 0:  # ids at n-2, n-1
            return d.decode_model(last2, cache=d.cache, input_pos=n - 2 + self._arange[:2], check=False)[0, -1]
        return d.decode_model(previous.view(1, 1), cache=d.cache, input_pos=n - 1 + i, check=False)[0, -1]

    def _verify_logits(self, last2, proposed, n):  # the target's logits (gamma + 1, V) at n-1 .. n+gamma-1
        t, g = self.target, self.gamma
        verify = torch.cat([last2[0, 1:], proposed]).view(1, g + 1)  # (1, gamma + 1)
        return t.decode_model(verify, cache=t.cache, input_pos=n - 1 + self._arange, check=False)[0]

    def _greedy_round(self, ids, n):  # ids (1, L) the id buffer, n (1,) the committed length
        last2 = self._last2(ids, n)  # (1, 2)
        proposals, finite = [], torch.ones((), dtype=torch.bool, device=last2.device)  # gamma x (1,)
        for i in range(self.gamma):
            logits = self._draft_logits(last2, n, i, proposals[-1] if proposals else None)  # (V,)
            finite &= torch.isfinite(logits.amax())  # sampling.check_logits's test, kept in the graph
            proposals.append(logits.argmax(-1, keepdim=True))
        proposed = torch.cat(proposals)  # (gamma,)
        t_logits = self._verify_logits(last2, proposed, n)  # (gamma + 1, V)
        finite &= torch.isfinite(t_logits.amax(-1)).all()
        n_accepted, nxt = greedy_accept(t_logits.argmax(-1), proposed)
        self._commit(ids, n, n_accepted, nxt, proposed)
        return torch.cat([n_accepted.view(1), nxt.view(1), finite.long().view(1), proposed])  # (3 + gamma,)

    def _sampled_round(self, ids, n, u, temperature):  # ... and u (2 gamma + 1,), temperature 0-d
        g = self.gamma
        last2 = self._last2(ids, n)  # (1, 2)
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
        n_accepted, residual = acceptance(p_target, torch.stack(p_draft), proposed, u[g : 2 * g])
        nxt = sample_from_uniform(residual, u[2 * g])
        self._commit(ids, n, n_accepted, nxt, proposed)
        return torch.cat([n_accepted.view(1), nxt.view(1), finite.long().view(1), proposed])  # (3 + gamma,)

    def _inputs(self):
        return (self.ids, self._n, self._u, self._temperature) if self.sampled else (self.ids, self._n)

    @torch.no_grad()  # the grad mode of the loop that calls it
    def warmup(self) -> Exception | None:
        """Compile now (if not yet) at n = 2, leaving both caches as they were; returns the error, if any."""
        if self.compiled:
            return None
        self.ids.zero_()

        def at_two(*inputs):  # the graph advances n: start both warm-up calls at n = 2
            self._n.fill_(2)
            return self._fn(*inputs)

        error, seconds, _ = warm_compiled(
            at_two, self._inputs(), [self.target.cache, self.draft.cache], self.gamma + 2, self.freeze
        )
        self._n_value = -1
        self.compile_seconds += seconds
        self.compiled = error is None
        return error

    def __call__(
        self, ids: torch.Tensor, n: int, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> tuple[int, int, list[int]]:
        """One round after the n committed ids in ids (1, S) (n >= 2): writes the accepted proposals and the
        next token into ids[0, n:n + accepted + 1]; returns (accepted, next token, the proposals).
        The round reads and writes `self.ids`: pass its first columns (run_rounds does) and nothing is copied;
        any other ids tensor is copied in and the round's writes copied back."""
        own = ids.data_ptr() == self.ids.data_ptr() and ids.stride(-1) == 1
        if not own:
            self.ids[:, :n].copy_(ids[:, :n])
        if n != self._n_value:  # after a round of model calls (or a first call): the graph advances it itself
            self._n.fill_(n)
        if self.sampled:
            if sampling.temperature != self._temperature_value:
                self._temperature.fill_(sampling.temperature)
                self._temperature_value = sampling.temperature
            torch.rand(self._u.shape, generator=generator, device=self._u.device, out=self._u)
        out = self._fn(*self._inputs())  # (3 + gamma,)
        k, nxt, finite, *proposed = out.tolist()  # the round's one device -> host read
        if not finite:
            self._n_value = -1
            raise ValueError(
                "the draft's or the target's logits hold NaN or +inf, or a row of nothing but -inf "
                "(allowed: finite values, with -inf for masked tokens); NaN logits usually mean "
                "the model overflowed"
            )
        self._n_value = n + k + 1
        if not own:
            ids[:, n : n + k + 1] = self.ids[:, n : n + k + 1]
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
            warnings.warn(
                f"torch.compile failed for the fused {kind} round ({type(error).__name__}: "
                f"{str(error)[:200]}); {kind} rounds call the models one at a time",
                stacklevel=2,
            )
            fused = None
        rounds[key] = fused
    return rounds[key]


def round_room(target: FastGenerator, draft: FastGenerator) -> int:
    """A round at n writes the target's cache at n-1 .. n+gamma-1 and the draft's at n-2 .. n+gamma-2, so both
    fit when n + gamma <= this."""
    return min(target.cache.max_seq_len, draft.cache.max_seq_len + 1)


def fused_round_call(
    fast_target: FastGenerator, fast_draft: FastGenerator, gamma: int, position: int, sampled: bool = False
):
    """A zero-argument function that runs one compiled round (gamma draft steps and the verify pass, one graph:
    FusedRounds) after `position` committed tokens, for timing it against a single target step; None when
    the round does not compile. It writes both caches (the target's at position - 1 .. position + gamma - 1,
    the draft's one lower), so time it before a generation (which prefills again), not in the middle of one.
    Greedy by default; with sampled=True, a temperature-1 round on fixed uniforms."""
    check_gamma(gamma)
    rounds = fused_rounds(fast_target, fast_draft, gamma, sampled)
    limit = round_room(fast_target, fast_draft) - gamma
    if not isinstance(position, int) or not 2 <= position <= limit:
        raise ValueError(f"position must be an int in [2, {limit}] for these caches; got {position!r}")
    if rounds is None:
        return None

    @torch.no_grad()  # the grad mode the round was compiled under
    def run():
        rounds._n.fill_(position)
        rounds._n_value = -1
        return rounds._fn(*rounds._inputs())

    return run


def speculative_token_counts(gamma: int) -> dict[str, tuple[int, ...]]:
    """Tokens per call that a round of the static loop uses, by model: the target's verify pass (gamma + 1)
    and the draft's steps (1, and 2 when it catches up after a fully accepted round)."""
    return {"target": (gamma + 1,), "draft": (1, 2)}


def warmup_speculative(
    fast_target: FastGenerator,
    fast_draft: FastGenerator,
    gamma: int = DEFAULT_COMPILED_GAMMA,
    *,
    temperature: float = 0.0,
    sampling: SamplingConfig | None = None,
    prompt_lengths=(),
) -> float:
    """Compile every graph speculative_generate(fast_target, fast_draft, ..., gamma=gamma) uses with these
    sampling settings (the same arguments): each model's steps for the loop of model calls, and the
    round as one graph (FusedRounds, greedy or sampled) where fuses_rounds(sampling); with prompt_lengths,
    also both models' prefill as one graph for each of those prompt lengths' buckets (speculative.prefill;
    a prompt of another bucket is prefilled eagerly). Returns the seconds the generators' warm-ups took so
    far plus the compile seconds of this pair's rounds at this gamma and of its prefills (time it apart
    from the generation; a difference of two calls with different gammas is not a warm-up time)."""
    check_gamma(gamma)
    sampling = check_sampling(sampling, temperature)
    lengths = tuple(prompt_lengths)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in lengths):
        raise ValueError(f"prompt_lengths must hold ints >= 1; got {prompt_lengths!r}")
    counts = speculative_token_counts(gamma)
    seconds = fast_target.warmup(counts["target"]) + fast_draft.warmup(counts["draft"])
    if fuses_rounds(sampling):
        fused_rounds(fast_target, fast_draft, gamma, sampled=not sampling.greedy)  # compiles on first use
    prefills = {fused_prefill(fast_target, fast_draft, n, compile=True) for n in lengths} - {None}
    rounds = _FUSED_ROUNDS.get(fast_target, {})
    return (
        seconds
        + sum(
            r.compile_seconds for (d, g, _), r in rounds.items() if d == id(fast_draft) and g == gamma and r is not None
        )
        + sum(p.compile_seconds for p in prefills)
    )
