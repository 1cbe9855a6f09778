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

One loop (`speculative_loop`) drives both kinds of model through a two-method "stepper": logits(tokens)
for T tokens at positions length..length+T-1, and truncate(n). With models, each gets a fresh KVCache
and truncate is KVCache.truncate. With FastGenerators, the tokens go through the static path (positions
in a tensor, attention over the whole buffer with a mask), and truncate only moves the bookkeeping:
slots past it are overwritten before any query attends to them. A round then uses three shapes, each
one compiled graph (`warmup_speculative`): the target's (gamma + 1)-token verify pass and the draft's
1-token step and 2-token catch-up (after a fully accepted round the draft has not seen its last
proposal). A last round cut short by max_new_tokens runs the same static path eagerly, so a generation
never compiles in its middle; greedy output still equals `generate`'s token for token.
A round goes further: draft proposals, verify pass and acceptance are one compiled graph (`FusedRounds`,
the fifth graph), so Python sees a round once instead of gamma + 1 times; the graph also reads the
committed ids from the loop's id buffer and writes the accepted ones back, so the host only reads how many
were accepted. At temperature > 0 the graph draws its tokens from uniforms drawn on the host (a compiled
graph takes no torch.Generator). The prompt's prefill runs both models eagerly, or, for the prompt lengths
named in `warmup_speculative(..., prompt_lengths=...)`, as one more compiled graph (`FusedPrefill`, one per
16-token bucket of prompt lengths: prefill.py).
Sampled tokens keep the target's distribution, but need not equal the eager loop's for the same
generator: the static path's logits differ from the eager ones by float rounding, and the fused round
draws by inverse CDF (sampling.sample_from_uniform) where the loop of model calls uses torch.multinomial.

Out of scope here: batch size > 1 (rows would accept different numbers of tokens; batched.py runs B rows
greedily in lockstep, each round accepting the fewest any row accepted), repetition / presence /
frequency penalties (their distribution depends on the tokens before each position), tree
verification (several drafts per round), and self-speculation (early-exit drafting). Prompt lookup
runs on models only: its proposals vary in length every round, so each length would need its own graph.
The compiled path does not compile the short last round, nor the prefill of a prompt whose bucket was not
warmed up (both eager static).

Modules: rule.py (the acceptance rule, SpeculativeStats), loop.py (the rounds, one model call at a time,
on eager or static steppers), compiled.py (a round as one compiled graph, and the warm-up), prefill.py
(both models' prefill as one compiled graph), lookup.py (prompt lookup), exactness.py (total variation,
chi-square test). Every public name is importable from here.
"""

from __future__ import annotations

import torch

from ..fast_decode import FastGenerator, guards_checked_once
from ..generate import check_generation_length
from ..sampling import SamplingConfig
from .compiled import (
    FusedRounds,
    fused_round_call,
    fused_rounds,
    fuses_rounds,
    speculative_token_counts,
    warmup_speculative,
)
from .exactness import chi_square_test, total_variation
from .lookup import NgramIndex, prompt_lookup_generate
from .loop import (
    DEFAULT_COMPILED_GAMMA,
    DEFAULT_COMPILED_SAMPLED_GAMMA,
    DEFAULT_GAMMA,
    DEFAULT_LOOKUP_GAMMA,
    DEFAULT_MAX_NGRAM,
    DEFAULT_MIN_NGRAM,
    EagerSteps,
    RunSettings,
    StaticSteps,
    check_common,
    speculative_loop,
)
from .prefill import PREFILL_BUCKET, FusedPrefill, fused_prefill, prefill_bucket
from .rule import (
    SpeculativeStats,
    accept_or_resample,
    acceptance,
    acceptance_probability,
    check_sampling,
    expected_tokens_per_target_call,
    greedy_accept,
)

__all__ = [
    "DEFAULT_COMPILED_GAMMA",
    "DEFAULT_COMPILED_SAMPLED_GAMMA",
    "DEFAULT_GAMMA",
    "DEFAULT_LOOKUP_GAMMA",
    "DEFAULT_MAX_NGRAM",
    "DEFAULT_MIN_NGRAM",
    "PREFILL_BUCKET",
    "FusedPrefill",
    "FusedRounds",
    "NgramIndex",
    "SpeculativeStats",
    "accept_or_resample",
    "acceptance",
    "acceptance_probability",
    "chi_square_test",
    "expected_tokens_per_target_call",
    "fused_prefill",
    "fused_round_call",
    "fused_rounds",
    "fuses_rounds",
    "greedy_accept",
    "prefill_bucket",
    "prompt_lookup_generate",
    "speculative_generate",
    "speculative_token_counts",
    "total_variation",
    "warmup_speculative",
]


def speculative_generate(
    target,
    draft,
    prompt,
    max_new_tokens: int,
    *,
    gamma: int | None = None,
    temperature: float = 0.0,
    sampling: SamplingConfig | None = None,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    trace: bool = False,
    fuse_rounds: bool = True,
) -> tuple[torch.Tensor, SpeculativeStats]:
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
        raise ValueError(
            "target and draft must both be models or both FastGenerators; got "
            f"{type(target).__name__} and {type(draft).__name__}"
        )
    if gamma is None:
        greedy = check_sampling(sampling, temperature).greedy  # validates the settings first
        gamma = (DEFAULT_COMPILED_GAMMA if greedy else DEFAULT_COMPILED_SAMPLED_GAMMA) if static else DEFAULT_GAMMA
    t_model, d_model = (target.model, draft.model) if static else (target, draft)
    prompt, sampling = check_common(t_model, prompt, max_new_tokens, gamma, sampling, temperature, generator)
    if d_model.cfg.vocab_size != t_model.cfg.vocab_size:
        raise ValueError(
            f"draft and target must share a vocabulary; vocab_size {d_model.cfg.vocab_size} != {t_model.cfg.vocab_size}"
        )
    T = prompt.shape[1]
    run = RunSettings(prompt, max_new_tokens, gamma, sampling, generator, eos_id, trace)
    # the draft reads the same sequence, so it needs the same room (its proposals never go past
    # max_new_tokens); checked now, or its cache would overflow in the middle of the run
    check_generation_length(T, max_new_tokens, d_model.cfg.max_seq_len, window="the draft model's context window")
    if not static:
        S = min(T + max_new_tokens + gamma, t_model.cfg.max_seq_len)
        with torch.inference_mode():
            return speculative_loop(EagerSteps(t_model, S), EagerSteps(d_model, min(S, d_model.cfg.max_seq_len)), run)
    # static: positions n - 1 .. n + g of a round stay below T + max_new_tokens (g stops at max_new_tokens)
    for name, fast in (("target", target), ("draft", draft)):
        if fast.cache.batch_size != 1:
            raise ValueError(f"the {name} FastGenerator must have batch_size=1; got {fast.cache.batch_size}")
        if T + max_new_tokens > fast.cache.max_seq_len:
            raise ValueError(
                f"prompt ({T}) + max_new_tokens ({max_new_tokens}) exceeds the {name} "
                f"FastGenerator's max_seq_len={fast.cache.max_seq_len}"
            )
    warmup_speculative(target, draft, gamma, sampling=sampling)  # a no-op once compiled
    counts = speculative_token_counts(gamma)
    # no_grad, not inference_mode: the graphs were compiled under no_grad, and another grad mode is a
    # guard failure (a second compile)
    # after the first round, skip dynamo's guard checks: that round checked them for every graph a round
    # uses (fast_decode.guards_checked_once)
    later = guards_checked_once if target.compiled else None
    fused = fused_rounds(target, draft, gamma, not sampling.greedy) if fuse_rounds and fuses_rounds(sampling) else None
    prefill = fused_prefill(target, draft, T) if fuse_rounds else None  # compiled by warmup_speculative only
    with torch.no_grad():
        return speculative_loop(
            StaticSteps(target, counts["target"]), StaticSteps(draft, counts["draft"]), run, later, fused, prefill
        )
