"""Speculative decoding: exactly the target's greedy tokens, and exactly the target's distribution.

Statistical tests use fixed seeds, so each is deterministic; the thresholds say how surprising the
counts may be if the sampler is right. A chi-square p-value above 1e-3 passes (a correct sampler
would fail it with probability 0.1% for a random seed); the wrong variants must give p < 1e-9.
"""

from __future__ import annotations

import pytest
import torch
from conftest import random_model

from helpers.fast_decode import FastGenerator, compile_available
from helpers.generate import generate
from helpers.model import ModelConfig
from helpers.sampling import SamplingConfig, probabilities
from helpers.speculative import (
    NgramIndex,
    SpeculativeStats,
    accept_or_resample,
    acceptance_probability,
    chi_square_test,
    expected_tokens_per_target_call,
    greedy_accept,
    prompt_lookup_generate,
    speculative_generate,
    total_variation,
    warmup_speculative,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Thousands of tiny forward passes: one thread avoids thread hand-offs that cost far more than the
    arithmetic (and are catastrophic on a loaded machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


PASS_P = 1e-3  # a correct sampler passes with p above this
FAIL_P = 1e-9  # a wrong one must be rejected this clearly

# A toy language: 4 tokens, and each model is a table of next-token distributions given the previous
# token (a Markov chain), so the exact distribution of any continuation is a product of table entries.
# The draft gives zero probability to some tokens the target likes and vice versa.
P_TARGET_TABLE = torch.tensor(
    [[0.50, 0.30, 0.15, 0.05], [0.10, 0.20, 0.30, 0.40], [0.25, 0.25, 0.25, 0.25], [0.70, 0.00, 0.20, 0.10]],
    dtype=torch.float64,
)
P_DRAFT_TABLE = torch.tensor(
    [[0.25, 0.25, 0.25, 0.25], [0.40, 0.30, 0.30, 0.00], [0.05, 0.80, 0.10, 0.05], [0.30, 0.30, 0.30, 0.10]],
    dtype=torch.float64,
)
START = 0


def notes_rule(p_target, p_draft, draft_tokens, generator):
    """The lecture notes' description: after the first rejection, every later proposal is "rejected
    and re-sampled" too, each from its own position's residual (computed with the rejected tokens in
    the context). Returns the gamma (+1 bonus if all accepted) output tokens and their count."""
    gamma = draft_tokens.shape[-1]
    n_acc, nxt = accept_or_resample(p_target, p_draft, draft_tokens, generator)
    residual = (p_target[..., :gamma, :] - p_draft).clamp_min(0)  # (N, gamma, V)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_target[..., :gamma, :])
    resampled = torch.multinomial(residual.reshape(-1, residual.shape[-1]), 1, generator=generator)
    resampled = resampled.view(draft_tokens.shape)
    pos = torch.arange(gamma)
    out = torch.where(pos < n_acc.unsqueeze(-1), draft_tokens, resampled)
    out = torch.cat([out, nxt.unsqueeze(-1)], -1)  # the bonus slot, used only when all were accepted
    count = torch.where(n_acc == gamma, gamma + 1, gamma)
    return out, count


def correct_rule(p_target, p_draft, draft_tokens, generator):
    n_acc, nxt = accept_or_resample(p_target, p_draft, draft_tokens, generator)
    out = torch.cat([draft_tokens, torch.zeros_like(nxt).unsqueeze(-1)], -1)
    out.scatter_(-1, n_acc.unsqueeze(-1), nxt.unsqueeze(-1))
    return out, n_acc + 1


def simulate_markov(rule, gamma, n_tokens, n_chains, seed=0):
    """Run n_chains independent speculative generations of n_tokens on the toy tables, all at once."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((n_chains, n_tokens + gamma + 1), -1, dtype=torch.long)
    filled = torch.zeros(n_chains, dtype=torch.long)
    prev = torch.full((n_chains,), START, dtype=torch.long)
    rows = torch.arange(n_chains)
    while (filled < n_tokens).any():
        drafts, p_drafts, ctx = [], [], prev
        for _ in range(gamma):
            p_draft = P_DRAFT_TABLE[ctx]  # (N, V)
            ctx = torch.multinomial(p_draft, 1, generator=g).squeeze(1)
            drafts.append(ctx)
            p_drafts.append(p_draft)
        draft_tokens = torch.stack(drafts, 1)  # (N, gamma)
        p_target = P_TARGET_TABLE[torch.cat([prev.unsqueeze(1), draft_tokens], 1)]  # (N, gamma + 1, V)
        new, count = rule(p_target, torch.stack(p_drafts, 1), draft_tokens, g)
        active = filled < n_tokens
        pos = filled.unsqueeze(1) + torch.arange(gamma + 1)  # (N, gamma + 1)
        keep = (torch.arange(gamma + 1) < count.unsqueeze(1)) & active.unsqueeze(1)
        out[rows.unsqueeze(1).expand_as(pos)[keep], pos[keep]] = new[keep]
        prev = torch.where(active, new.gather(1, (count - 1).unsqueeze(1)).squeeze(1), prev)
        filled = torch.where(active, filled + count, filled)
    return out[:, :n_tokens]


def markov_exact(n_tokens):
    """Exact probability of every continuation of n_tokens under the target table, flattened."""
    V = P_TARGET_TABLE.shape[0]
    probs = P_TARGET_TABLE[START]  # (V,)
    for _ in range(n_tokens - 1):
        last = torch.arange(probs.numel()) % V  # the last token of each continuation so far
        probs = (probs.unsqueeze(-1) * P_TARGET_TABLE[last]).flatten()  # (V^k * V,)
    return probs


def outcome_counts(tokens, vocab):
    codes = torch.zeros(tokens.shape[0], dtype=torch.long)
    for j in range(tokens.shape[1]):
        codes = codes * vocab + tokens[:, j]
    return torch.bincount(codes, minlength=vocab ** tokens.shape[1])


# ---------------------------------------------------------------------------------------------------
# the rule on hand-made tables


def test_one_step_output_distribution_is_p_target_exactly():
    """P(out = x) = p_draft(x) min(1, p_target(x)/p_draft(x)) + (1 - alpha) residual(x) = p_target(x)."""
    p_target, p_draft = P_TARGET_TABLE[3], P_DRAFT_TABLE[1]
    alpha = acceptance_probability(p_target, p_draft)
    accepted = p_draft * torch.clamp(p_target / p_draft.clamp_min(1e-300), max=1.0)
    residual = (p_target - p_draft).clamp_min(0)
    out = accepted + (1 - alpha) * residual / residual.sum()
    assert torch.allclose(out, p_target, atol=1e-12)


@pytest.mark.parametrize("gamma", [1, 3])
def test_markov_toy_joint_distribution_matches_target(gamma):
    n_tokens, n = 3, 100_000
    tokens = simulate_markov(correct_rule, gamma, n_tokens, n, seed=gamma)
    counts = outcome_counts(tokens, 4)
    exact = markov_exact(n_tokens)
    _, dof, p_value = chi_square_test(counts, exact)
    tv = total_variation(counts / n, exact)
    assert dof >= 40
    assert p_value > PASS_P, (p_value, tv)
    assert tv < 0.015  # the sampling noise of 100k draws over 64 outcomes is about 0.006


def test_markov_toy_the_notes_variant_changes_the_distribution():
    n_tokens, n = 3, 100_000
    exact = markov_exact(n_tokens)
    counts = outcome_counts(simulate_markov(notes_rule, 3, n_tokens, n, seed=3), 4)
    _, _, p_value = chi_square_test(counts, exact)
    assert p_value < FAIL_P
    assert total_variation(counts / n, exact) > 0.03


def test_accept_or_resample_equals_greedy_accept_on_one_hot_distributions():
    g = torch.Generator().manual_seed(0)
    V, gamma, N = 7, 4, 500
    target_argmax = torch.randint(0, V, (N, gamma + 1), generator=g)
    # drafts that agree with the target for a random number of leading positions
    draft = torch.where(
        torch.rand(N, gamma, generator=g) < 0.7, target_argmax[:, :gamma], torch.randint(0, V, (N, gamma), generator=g)
    )
    one_hot = lambda t: torch.nn.functional.one_hot(t, V).float()
    n1, x1 = accept_or_resample(one_hot(target_argmax), one_hot(draft), draft, g)
    n2, x2 = greedy_accept(target_argmax, draft)
    assert torch.equal(n1, n2) and torch.equal(x1, x2)
    assert 0 < n1.float().mean() < gamma  # both outcomes occur


def test_deterministic_drafter_rule_is_exact():
    """p_draft=None (prompt lookup): a fixed proposal x is accepted with probability p_target(x), and on
    rejection the next token comes from p_target without x."""
    p_target = P_TARGET_TABLE[1].float()
    N = 200_000
    g = torch.Generator().manual_seed(5)
    x = torch.full((N, 1), 3)
    n_acc, nxt = accept_or_resample(p_target.expand(N, 2, 4), None, x, g)
    first = torch.where(n_acc == 1, x[:, 0], nxt)
    _, _, p_value = chi_square_test(torch.bincount(first, minlength=4), p_target)
    assert p_value > PASS_P
    assert abs(n_acc.float().mean().item() - p_target[3].item()) < 0.005


def test_expected_tokens_per_target_call_formula():
    """With the same tables at every position, each proposal is accepted with probability alpha."""
    p_target, p_draft = P_TARGET_TABLE[0], P_DRAFT_TABLE[0]
    alpha = float(acceptance_probability(p_target, p_draft))
    g = torch.Generator().manual_seed(0)
    N, gamma = 200_000, 4
    draft = torch.multinomial(p_draft, N * gamma, replacement=True, generator=g).view(N, gamma)
    n_acc, _ = accept_or_resample(p_target.expand(N, gamma + 1, 4), p_draft.expand(N, gamma, 4), draft, g)
    measured = (n_acc + 1).double().mean().item()
    assert abs(measured - expected_tokens_per_target_call(alpha, gamma)) < 0.01
    assert expected_tokens_per_target_call(1.0, gamma) == gamma + 1
    assert expected_tokens_per_target_call(0.0, gamma) == 1


def test_chi_square_test_can_fail_and_pass():
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.5, 0.3, 0.2])
    counts = torch.bincount(torch.multinomial(probs, 30_000, replacement=True, generator=g), minlength=3)
    assert chi_square_test(counts, probs)[2] > PASS_P
    assert chi_square_test(counts, torch.tensor([0.45, 0.35, 0.2]))[2] < FAIL_P
    assert chi_square_test(torch.tensor([10, 0, 3]), torch.tensor([0.5, 0.5, 0.0]))[2] == 0.0


# ---------------------------------------------------------------------------------------------------
# the generation loops on real models


PROMPTS = ["import os\nimport sys\n\n\ndef main(", "class Queue:\n    def __init__(self", '"""Utilities for']


@pytest.mark.parametrize("gamma", [1, 2, 3, 5, 8])
def test_greedy_speculative_equals_target_greedy(shipped, gamma):
    target, draft, tok = shipped
    for text in PROMPTS:
        prompt = tok.encode(text, bos=True)
        ref = generate(target, prompt, max_new_tokens=64)
        out, stats = speculative_generate(target, draft, prompt, 64, gamma=gamma)
        assert torch.equal(out, ref), (text, gamma)
        assert stats.new_tokens == 64 == sum(stats.accepted) + stats.rounds
        assert stats.target_calls == stats.rounds and stats.draft_calls == sum(stats.proposed)


@pytest.mark.parametrize("gamma,max_ngram,min_ngram", [(1, 1, 1), (4, 2, 1), (6, 3, 2), (16, 4, 2)])
def test_greedy_prompt_lookup_equals_target_greedy(shipped, gamma, max_ngram, min_ngram):
    target, _, tok = shipped
    for text in PROMPTS:
        prompt = tok.encode(text * 2, bos=True)
        ref = generate(target, prompt, max_new_tokens=64)
        out, stats = prompt_lookup_generate(target, prompt, 64, gamma=gamma, max_ngram=max_ngram, min_ngram=min_ngram)
        assert torch.equal(out, ref), (text, gamma, max_ngram)
        assert stats.new_tokens == 64 and stats.target_calls == stats.rounds
    assert sum(stats.accepted) > 0  # the repeated prompt gives lookups something to find


TINY_T = ModelConfig.from_preset("tiny", vocab_size=5, max_seq_len=64)
TINY_D = ModelConfig.from_preset("tiny", vocab_size=5, max_seq_len=64, n_layers=1, d_model=32, d_ff=64)


@pytest.fixture(scope="module")
def tiny_pair():
    return random_model(TINY_T, seed=3, std=0.3), random_model(TINY_D, seed=4, std=0.3)


def test_greedy_edge_cases_on_tiny_models(tiny_pair):
    target, draft = tiny_pair
    for prompt in ([0], [1, 2], [4, 0, 3, 3, 1, 2, 0]):
        for n in (0, 1, 2, 7, 40):
            ref = generate(target, prompt, n)
            for gamma in (1, 4, 16):
                assert torch.equal(speculative_generate(target, draft, prompt, n, gamma=gamma)[0], ref)
                assert torch.equal(prompt_lookup_generate(target, prompt, n, gamma=gamma)[0], ref)
    # stopping at end-of-text behaves like generate
    prompt = [4, 0, 3]
    full = generate(target, prompt, 40)[0, 3:].tolist()
    eos = full[5]
    ref = generate(target, prompt, 40, eos_id=eos)
    assert ref.shape[1] < 43
    assert torch.equal(speculative_generate(target, draft, prompt, 40, gamma=3, eos_id=eos)[0], ref)
    assert torch.equal(prompt_lookup_generate(target, prompt, 40, eos_id=eos)[0], ref)


def tiny_exact_joint(target, prompt, cfg):
    """Exact distribution of the 3 tokens after `prompt` under target + sampling config: 5^3 outcomes."""
    V = target.cfg.vocab_size
    with torch.no_grad():
        p1 = probabilities(target(torch.tensor([prompt]))[0, -1], cfg)  # (V,)
        two = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)])  # (V*V, T+2)
        logits = target(two)
        p2 = probabilities(logits[::V, -2], cfg)  # (V, V): after a
        p3 = probabilities(logits[:, -1], cfg)  # (V*V, V): after a, b
    return (p1[:, None, None] * p2[:, :, None] * p3.view(V, V, V)).flatten().double()


@pytest.mark.parametrize(
    "cfg", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=3)], ids=["t1", "t0.7-topk3"]
)
def test_speculative_sampling_end_to_end_matches_target_joint(tiny_pair, cfg):
    target, draft = tiny_pair
    prompt = [1, 3, 0]
    exact = tiny_exact_joint(target, prompt, cfg)
    g = torch.Generator().manual_seed(0)
    n, runs = 1200, SpeculativeStats()
    samples = []
    for _ in range(n):
        out, stats = speculative_generate(target, draft, prompt, 3, gamma=2, sampling=cfg, generator=g)
        samples.append(out[0, 3:])
        runs = runs.merge(stats)
    counts = outcome_counts(torch.stack(samples), 5)
    _, _, p_value = chi_square_test(counts, exact)
    assert p_value > PASS_P, p_value
    assert 0.05 < runs.acceptance_rate < 0.95  # both branches of the rule were exercised
    # and the test has power: sampling the draft alone would have failed it
    d_exact = tiny_exact_joint(draft, prompt, cfg)
    assert chi_square_test(counts, d_exact)[2] < FAIL_P


def test_prompt_lookup_sampling_end_to_end_matches_target_joint(tiny_pair):
    target, _ = tiny_pair
    prompt = [1, 3, 0, 2, 1, 3, 0, 2, 1, 3]
    cfg = SamplingConfig(temperature=1.0)
    exact = tiny_exact_joint(target, prompt, cfg)
    g = torch.Generator().manual_seed(1)
    samples, runs = [], SpeculativeStats()
    for _ in range(1200):
        out, stats = prompt_lookup_generate(target, prompt, 3, gamma=3, sampling=cfg, generator=g)
        samples.append(out[0, len(prompt) :])
        runs = runs.merge(stats)
    _, _, p_value = chi_square_test(outcome_counts(torch.stack(samples), 5), exact)
    assert p_value > PASS_P, p_value
    assert sum(runs.accepted) > 100 and sum(runs.proposed) > sum(runs.accepted)


def _spread_prompt(target, draft, tok):
    """A prompt whose next-token distributions differ a lot between target and draft (test power)."""
    best = None
    for text in ["def ", "import ", "    return ", "class ", "# ", "x = ", "for i in "]:
        prompt = tok.encode(text, bos=True)
        with torch.no_grad():
            p_target = target(torch.tensor([prompt]))[0, -1].softmax(-1)
            p_draft = draft(torch.tensor([prompt]))[0, -1].softmax(-1)
        tv = total_variation(p_target, p_draft)
        if best is None or tv > best[0]:
            best = (tv, prompt, p_target, p_draft)
    return best


def test_real_model_first_token_distribution(shipped):
    """The rule on the real models' next-token distributions (20k draws), then the whole loop (300 calls)."""
    target, draft, tok = shipped
    tv, prompt, p_target, p_draft = _spread_prompt(target, draft, tok)
    assert tv > 0.2, tv  # otherwise the test below could not tell the two apart
    g = torch.Generator().manual_seed(0)
    V, firsts = p_target.numel(), []
    N = 5_000
    for _ in range(4):  # 4 batches of 5k independent one-proposal rounds
        x = torch.multinomial(p_draft, N, replacement=True, generator=g).unsqueeze(1)  # (N, 1)
        n_acc, nxt = accept_or_resample(p_target.expand(N, 2, V), p_draft.expand(N, 1, V), x, g)
        firsts.append(torch.where(n_acc == 1, x[:, 0], nxt))
    counts = torch.bincount(torch.cat(firsts), minlength=V)
    assert chi_square_test(counts, p_target)[2] > PASS_P
    assert chi_square_test(counts, p_draft)[2] < FAIL_P

    firsts = [
        speculative_generate(target, draft, prompt, 2, gamma=1, temperature=1.0, generator=g)[0][0, len(prompt)]
        for _ in range(300)
    ]
    counts = torch.bincount(torch.stack(firsts), minlength=V)
    assert chi_square_test(counts, p_target)[2] > PASS_P
    assert chi_square_test(counts, p_draft)[2] < FAIL_P


# ---------------------------------------------------------------------------------------------------
# pieces and bad input


def test_ngram_index_proposes_the_most_recent_continuation():
    index = NgramIndex(max_ngram=2)
    index.extend([5, 6, 7, 1, 5, 6, 8, 2, 5])
    assert index.propose(3) == [6, 8, 2]  # the last "5" was followed most recently by 6, 8, 2
    index.extend([6])
    assert index.propose(2) == [8, 2]  # "5 6" -> 8 (most recent), not 7
    index.extend([9])
    assert index.propose(4) == []  # "6 9" and "9" never occurred before


def test_bad_input_raises_value_error(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ValueError, match="gamma"):
        speculative_generate(target, draft, [1, 2], 5, gamma=0)
    with pytest.raises(ValueError, match="repetition_penalty"):
        speculative_generate(target, draft, [1, 2], 5, sampling=SamplingConfig(repetition_penalty=1.2))
    with pytest.raises(ValueError, match="batch size 1"):
        speculative_generate(target, draft, torch.tensor([[1, 2], [3, 4]]), 5)
    other = random_model(ModelConfig.from_preset("tiny", vocab_size=7, max_seq_len=64))
    with pytest.raises(ValueError, match="vocab"):
        speculative_generate(target, other, [1, 2], 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        prompt_lookup_generate(target, [1, 2], 100)
    with pytest.raises(ValueError, match="max_ngram"):
        prompt_lookup_generate(target, [1, 2], 5, max_ngram=0)
    with pytest.raises(ValueError, match="min_ngram"):
        prompt_lookup_generate(target, [1, 2], 5, max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError, match="min_ngram"):
        prompt_lookup_generate(target, [1, 2], 5, min_ngram=1.5)
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens_per_target_call(1.5, 3)


# ---------------------------------------------------------------------------------------------------
# the same loop on static steps (FastGenerator): eagerly, compiled, and falling back


def _fast_pair(tiny_pair, compile):
    target, draft = tiny_pair
    return FastGenerator(target, compile=compile), FastGenerator(draft, compile=compile)


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_fused_round_multiplies_as_its_generators_do(tiny_pair):
    """On generators with the autotuned GEMM (frozen weights) the round is frozen and autotuned too, so its
    products are the plain step's kind; on the default generators it keeps the weights as inputs. Greedy
    tokens are the target's either way."""
    from helpers import speculative

    target, _ = tiny_pair
    plain_t, plain_d = _fast_pair(tiny_pair, compile=True)
    tuned_t, tuned_d = (FastGenerator(m, gemm_autotune=True) for m in tiny_pair)
    for fast_t, fast_d, frozen in ((plain_t, plain_d, False), (tuned_t, tuned_d, True)):
        warmup_speculative(fast_t, fast_d, 3)
        fused = speculative.fused_rounds(fast_t, fast_d, 3, sampled=False)
        assert fused.compiled and fused.freeze == frozen
        for prompt in ([1, 2], [4, 0, 3, 3, 1, 2, 0]):
            out, _ = speculative_generate(fast_t, fast_d, prompt, 40, gamma=3)
            assert torch.equal(out, generate(target, prompt, 40)), (frozen, prompt)


def test_static_eager_speculative_equals_target_greedy(tiny_pair):
    target, _ = tiny_pair
    fast_t, fast_d = _fast_pair(tiny_pair, compile=False)
    for prompt in ([0], [1, 2], [4, 0, 3, 3, 1, 2, 0]):
        for n in (0, 1, 2, 7, 40):
            ref = generate(target, prompt, n)
            for gamma in (1, 4, 16):
                out, stats = speculative_generate(fast_t, fast_d, prompt, n, gamma=gamma)
                assert torch.equal(out, ref), (prompt, n, gamma)
                assert stats.new_tokens == n and stats.target_calls == stats.rounds
    prompt = [4, 0, 3]
    eos = generate(target, prompt, 40)[0, 8].item()
    assert torch.equal(
        speculative_generate(fast_t, fast_d, prompt, 40, eos_id=eos)[0], generate(target, prompt, 40, eos_id=eos)
    )


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_compiled_speculative_equals_target_greedy(tiny_pair):
    target, _ = tiny_pair
    fast_t, fast_d = _fast_pair(tiny_pair, compile=True)
    gamma = 3
    seconds = warmup_speculative(fast_t, fast_d, gamma)
    assert seconds > 0 and fast_t.compiled_token_counts == (1, gamma + 1) and fast_d.compiled_token_counts == (1, 2)
    # n = 1 has no draft step; 2, 5, 7 end on a short round (g < gamma: the eager static verify); both loops:
    # each round one graph (the default) and the models called one at a time (the compiled steps alone)
    for fuse in (True, False):
        for prompt in ([0], [1, 2], [4, 0, 3, 3, 1, 2, 0]):
            for n in (1, 2, 5, 7, 40, 57):
                out, stats = speculative_generate(fast_t, fast_d, prompt, n, gamma=gamma, fuse_rounds=fuse)
                assert torch.equal(out, generate(target, prompt, n)), (prompt, n, fuse)
    assert any(a == gamma for a in stats.accepted)  # full acceptances: the draft's 2-token catch-up step ran
    assert fast_t.compile_seconds == fast_t.warmup() and fast_d.compile_seconds == fast_d.warmup()  # no new graph
    # the draft as good as it gets: the target itself, so every proposal is accepted
    self_draft = FastGenerator(target)
    out, stats = speculative_generate(fast_t, self_draft, [1, 2], 40, gamma=gamma)
    assert torch.equal(out, generate(target, [1, 2], 40))
    assert stats.acceptance_rate == 1.0


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "T=1"])
def test_fused_round_runs_the_rounds(tiny_pair, monkeypatch, temperature):
    """Full rounds on compiled generators run as one graph each (FusedRounds), greedy and sampled: count its
    calls, check what trace records against the output, that greedy equals the target's greedy tokens and
    a seed fixes the sampled ones, and that unusable logits are a clear error, not a wrong token."""
    from helpers import speculative

    target, _ = tiny_pair
    fast_t, fast_d = _fast_pair(tiny_pair, compile=True)
    gamma, sampling = 3, SamplingConfig(temperature=temperature)
    warmup_speculative(fast_t, fast_d, gamma, sampling=sampling)
    fused = speculative.fused_rounds(fast_t, fast_d, gamma, sampled=temperature > 0)
    assert fused is not None and fused.compiled and fused.sampled == (temperature > 0)
    calls = []
    real_call = speculative.FusedRounds.__call__
    monkeypatch.setattr(
        speculative.FusedRounds,
        "__call__",
        lambda self, ids, n, *args: calls.append(n) or real_call(self, ids, n, *args),
    )

    def run(prompt, n_new, seed=0, cfg=sampling):
        return speculative_generate(
            fast_t,
            fast_d,
            prompt,
            n_new,
            gamma=gamma,
            sampling=cfg,
            generator=torch.Generator().manual_seed(seed),
            trace=True,
        )

    for prompt in ([0], [1, 2], [4, 0, 3, 3, 1, 2, 0]):
        calls.clear()
        out, stats = run(prompt, 40)
        first = list(calls)
        if sampling.greedy:
            assert torch.equal(out, generate(target, prompt, 40)), prompt
        else:  # the uniforms come from the generator: the same seed, the same tokens; another seed, others
            assert torch.equal(run(prompt, 40)[0], out)
            assert any(not torch.equal(run(prompt, 40, seed)[0], out) for seed in (1, 2, 3))
        # fused: every round from n >= 2 whose gamma proposals fit in the caches (not a first round at n = 1),
        # the last one too: it proposes gamma tokens and the output keeps those up to max_new_tokens
        starts = _round_starts(len(prompt), stats)
        assert fused.room >= len(prompt) + 40 + gamma  # these caches hold a full last round
        assert first == [n for n in starts if n >= 2], (prompt, stats.proposed)
        assert stats.proposed == [gamma] * stats.rounds and stats.new_tokens == 40
        n = len(prompt)
        for proposed, k, nxt in stats.trace:  # the accepted proposals and the next token are the output
            assert out[0, n : n + k + 1].tolist() == (proposed[:k] + [nxt])[: out.shape[1] - n]
            n += k + 1
        assert n >= out.shape[1]
    assert speculative.fused_rounds(fast_t, fast_d, gamma, sampled=temperature > 0) is fused  # compiled once
    if not sampling.greedy:  # top-k (compiled in, it would be a graph per value) calls the models one at a time
        calls.clear()
        run([1, 2], 20, cfg=SamplingConfig(temperature=temperature, top_k=3))
        assert calls == []
    # a NaN embedding row: the (eager) prefill writes NaN K/V into the cache, which the compiled verify pass
    # reads (its weights are frozen copies): its logits are NaN, an error, not a token
    row = target.embed.weight[1].clone()
    try:
        with torch.no_grad():
            target.embed.weight[1] = float("nan")
        with pytest.raises(ValueError, match="NaN"):
            run([1, 2, 3], 10)
        assert calls[-1] == 3  # raised by the fused round
    finally:
        with torch.no_grad():
            target.embed.weight[1] = row


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_fused_prefill_runs_the_warmed_buckets_only(tiny_pair, monkeypatch):
    """warmup_speculative(prompt_lengths=...) compiles both models' prefill as one graph per bucket of
    PREFILL_BUCKET tokens; a prompt of that bucket (any length in it: the rest is padding) runs it, another is
    prefilled eagerly, and greedy tokens are the target's either way, sampled ones fixed by the seed."""
    from helpers import speculative

    target, _ = tiny_pair
    fast_t, fast_d = _fast_pair(tiny_pair, compile=True)
    bucket = speculative.PREFILL_BUCKET
    warmup_speculative(fast_t, fast_d, 3, prompt_lengths=(bucket + 2,))
    warmup_speculative(fast_t, fast_d, 1, temperature=1.0)
    calls = []
    real_call = speculative.FusedPrefill.__call__
    monkeypatch.setattr(
        speculative.FusedPrefill,
        "__call__",
        lambda self, prompt: calls.append((self.tokens, prompt.shape[1])) or real_call(self, prompt),
    )
    g = torch.Generator().manual_seed(0)
    for length in (bucket + 2, bucket + 9, 2 * bucket + 1, bucket + 1, 3):  # the last two: other buckets
        prompt = torch.randint(0, 5, (1, length), generator=g)
        calls.clear()
        out, _ = speculative_generate(fast_t, fast_d, prompt, 20, gamma=3)
        assert torch.equal(out, generate(target, prompt, 20)), length
        used = bucket + 2 <= length <= 2 * bucket + 1  # prefills of bucket + 1 .. 2 bucket
        assert calls == ([(2 * bucket, length - 1)] if used else []), length
        sampled = [
            speculative_generate(
                fast_t, fast_d, prompt, 20, temperature=1.0, generator=torch.Generator().manual_seed(1)
            )[0]
            for _ in range(2)
        ]
        assert torch.equal(*sampled)
    with pytest.raises(ValueError, match="prompt_lengths"):
        warmup_speculative(fast_t, fast_d, 3, prompt_lengths=(0,))
    with pytest.raises(ValueError, match="tokens must be an int"):
        speculative.prefill_bucket(0)


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_last_rounds_without_room_call_the_models(tiny_pair, monkeypatch):
    """Caches sized to prompt + max_new_tokens exactly leave no room for a full round near the end: those
    rounds propose fewer tokens, one model call at a time, and the tokens are still the target's."""
    from helpers import speculative

    target, draft = tiny_pair
    prompt, n_new, gamma = [4, 0, 3], 30, 6  # rounds advance 1-2 tokens here: the last few have no room
    fast_t = FastGenerator(target, max_seq_len=len(prompt) + n_new)
    fast_d = FastGenerator(draft, max_seq_len=len(prompt) + n_new)
    calls = []
    real_call = speculative.FusedRounds.__call__
    monkeypatch.setattr(
        speculative.FusedRounds,
        "__call__",
        lambda self, ids, n, *args: calls.append(n) or real_call(self, ids, n, *args),
    )
    out, stats = speculative_generate(fast_t, fast_d, prompt, n_new, gamma=gamma)
    assert torch.equal(out, generate(target, prompt, n_new))
    starts = _round_starts(len(prompt), stats)
    room = len(prompt) + n_new  # a round at n writes the target's cache up to position n + gamma - 1
    assert calls == [n for n in starts if n + gamma <= room] and len(calls) < stats.rounds
    assert all(p < gamma or n + gamma <= room for p, n in zip(stats.proposed, starts))


def _round_starts(prompt_len: int, stats) -> list[int]:
    """The committed length at the start of each round."""
    starts, n = [], prompt_len
    for k in stats.accepted:
        starts.append(n)
        n += k + 1
    return starts


_needs_compiler = pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")


@pytest.mark.parametrize(
    "compile,fuse",
    [(False, True), pytest.param(True, False, marks=_needs_compiler), pytest.param(True, True, marks=_needs_compiler)],
    ids=["eager", "compiled, models called one at a time", "compiled, each round one graph"],
)
def test_static_speculative_sampling_matches_target_joint(tiny_pair, compile, fuse):
    """The static path's logits equal the eager ones only to float rounding, and the fused round draws by
    inverse CDF from uniforms drawn on the host, so a seeded run need not draw the eager loop's tokens;
    what must hold is the distribution."""
    target, draft = tiny_pair
    fast_t, fast_d = _fast_pair(tiny_pair, compile=compile)
    cfg = SamplingConfig(temperature=1.0)
    prompt = [1, 3, 0]
    exact = tiny_exact_joint(target, prompt, cfg)
    g = torch.Generator().manual_seed(0)
    samples, runs = [], SpeculativeStats()
    for _ in range(1200):
        out, stats = speculative_generate(
            fast_t, fast_d, prompt, 3, gamma=2, sampling=cfg, generator=g, fuse_rounds=fuse
        )
        samples.append(out[0, 3:])
        runs = runs.merge(stats)
    counts = outcome_counts(torch.stack(samples), 5)
    assert chi_square_test(counts, exact)[2] > PASS_P
    assert chi_square_test(counts, tiny_exact_joint(draft, prompt, cfg))[2] < FAIL_P
    assert 0.05 < runs.acceptance_rate < 0.95


def test_compile_failure_falls_back_to_the_eager_static_path(tiny_pair, compile_fails):
    fast_t, fast_d = _fast_pair(tiny_pair, compile=True)
    with pytest.warns(UserWarning, match="torch.compile failed"):
        out, _ = speculative_generate(fast_t, fast_d, [1, 2], 30, gamma=3)
    assert not fast_t.compiled and not fast_d.compiled
    assert fast_t.compiled_token_counts == ()
    assert torch.equal(out, generate(tiny_pair[0], [1, 2], 30))


def test_static_speculative_rejects_bad_input(tiny_pair):
    target, draft = tiny_pair
    fast_t, fast_d = _fast_pair(tiny_pair, compile=False)
    with pytest.raises(ValueError, match="both be models or both FastGenerators"):
        speculative_generate(fast_t, draft, [1, 2], 5)
    with pytest.raises(ValueError, match="both be models or both FastGenerators"):
        speculative_generate(target, fast_d, [1, 2], 5)
    short = FastGenerator(draft, max_seq_len=16, compile=False)
    with pytest.raises(ValueError, match="draft FastGenerator's max_seq_len=16"):
        speculative_generate(fast_t, short, [1, 2], 20)
    with pytest.raises(ValueError, match="batch_size=1"):
        speculative_generate(FastGenerator(target, batch_size=2, compile=False), fast_d, [1, 2], 5)
    with pytest.raises(ValueError, match="token_counts"):
        fast_t.warmup(token_counts=(0,))
