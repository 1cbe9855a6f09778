"""helpers.sampling against HuggingFace's logits processors/warpers and OpenAI's penalty formula.

Random logits of three kinds: continuous (no ties), coarse (many exact ties) and with -inf entries
(tokens an earlier filter already removed). Tolerances: the masks must match exactly; surviving
logits are compared with torch.equal, since both sides do the same float32 operations.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import random_model
from transformers import (
    GenerationConfig,
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from helpers.generate import generate
from helpers.model import ModelConfig
from helpers.sampling import (
    SamplingConfig,
    apply_penalties,
    apply_temperature,
    min_p_filter,
    next_token,
    probabilities,
    sample_from_uniform,
    top_k_filter,
    top_p_filter,
    validate_sampling,
)

V = 50
NEG_INF = float("-inf")


def random_logits(kind: str, seed: int, rows: int = 16, vocab: int = V) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 2.0
    if kind == "ties":  # only a handful of distinct values: exact ties everywhere, boundaries included
        logits = torch.randint(-3, 4, (rows, vocab), generator=g).float()
    if kind == "neg_inf":
        logits[torch.rand(rows, vocab, generator=g) < 0.3] = NEG_INF
        logits[:, 0] = logits[:, 0].clamp(min=-1.0)  # every row keeps at least one finite logit
    return logits


KINDS = ["continuous", "ties", "neg_inf"]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, with -inf in the same places."""
    return torch.equal(torch.isinf(a), torch.isinf(b)) and torch.equal(a[~torch.isinf(a)], b[~torch.isinf(b)])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 1.8])
def test_temperature_equals_hf(kind, temperature):
    logits = random_logits(kind, 0)
    assert same(apply_temperature(logits, temperature), TemperatureLogitsWarper(temperature)(None, logits))


def test_temperature_of_one_or_more_needs_no_overflow_guard():
    """From T = 1 up the plain division is returned as it is (the guard is skipped): it cannot overflow,
    even at the largest finite float32 logits, and it is exactly the guarded result."""
    big = torch.finfo(torch.float32).max
    logits = torch.tensor([[big, -big, 0.0, float("-inf")]])
    for temperature in (1.0, 1.5, 3.0):  # exact in float32, so the tensor holds the same number
        got = apply_temperature(logits, temperature)
        assert torch.isfinite(got[0, :3]).all() and torch.isneginf(got[0, 3])
        assert same(got, apply_temperature(logits, torch.tensor(temperature)))  # the guarded (tensor) path


def test_temperature_as_a_tensor_equals_the_number():
    """A 0-d tensor temperature (how a compiled graph takes it) gives the same values, the overflow guard
    included: a row of huge finite logits at a tiny temperature."""
    logits = torch.cat([random_logits("neg_inf", 0, rows=3), torch.tensor([[3e38, 1e38] + [0.0] * (V - 2)])])
    for temperature in (1.8, 0.7, 1e-4):  # the last, 1e-4, overflows the plain division of the last row
        want = apply_temperature(logits, temperature)
        got = apply_temperature(logits, torch.tensor(temperature))
        assert same(got, want), temperature
    assert got[-1, 0] == 0 and not torch.isposinf(got).any() and not torch.isnan(got).any()  # 3e38 / 1e-4


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [1, 2, 5, 17, V - 1, V, V + 3])
def test_top_k_equals_hf(kind, k):
    logits = random_logits(kind, 1)
    assert same(top_k_filter(logits, k), TopKLogitsWarper(k)(None, logits))


@pytest.mark.parametrize("kind", ["continuous", "neg_inf"])
@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.95, 0.999])
def test_top_p_equals_hf(kind, p):
    for seed in range(5):
        logits = random_logits(kind, 100 + seed)
        assert same(top_p_filter(logits, p), TopPLogitsWarper(p)(None, logits))


@pytest.mark.parametrize("k", [1, 3, 10])
def test_top_p_exact_boundary(k):
    """When the kept probability lands exactly on p, that is enough: the next token is dropped (as in HF)."""
    logits = random_logits("continuous", 9, rows=1)
    cumulative = torch.sort(logits, dim=-1).values.softmax(-1).cumsum(-1)  # float32, as both filters compute it
    p = 1 - cumulative[0, k - 1].item()  # the k least likely tokens have probability exactly 1 - p
    ours = top_p_filter(logits, p)
    assert same(ours, TopPLogitsWarper(p)(None, logits))
    assert torch.isinf(ours).sum().item() == k


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.95])
def test_top_p_with_ties(p):
    """With tied logits HF's kept set depends on how its (unstable) sort orders equal values. Ours is
    the union of every set HF can return: checked by running HF on many permutations of the vocabulary.
    Away from the boundary the two agree exactly."""
    logits = random_logits("ties", 7, rows=8, vocab=20)
    ours = ~torch.isinf(top_p_filter(logits, p))
    union = torch.zeros_like(ours)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        perm = torch.randperm(logits.shape[-1], generator=g)
        kept = ~torch.isinf(TopPLogitsWarper(p)(None, logits[:, perm]))
        union[:, perm] |= kept
        hf_kept = torch.zeros_like(kept)
        hf_kept[:, perm] = kept
        assert (hf_kept <= ours).all()  # HF's set is always inside ours
    assert torch.equal(ours, union)
    # and ours is still a nucleus: its probability reaches p, and without its least likely value it would not
    probs = logits.softmax(-1)
    assert ((probs * ours).sum(-1) >= p - 1e-6).all()
    for row in range(logits.shape[0]):
        lowest = logits[row][ours[row]].min()
        above = probs[row][logits[row] > lowest].sum()
        assert above < p


def test_top_p_is_the_smallest_set_reaching_p():
    """The definition, by hand, on the 6-token example at T=0.7: 5 tokens (94.18%), not all 6."""
    logits = torch.tensor([0.3, 0.8, 1.2, 0.5, 0.4, -0.1]) / 0.7
    kept = ~torch.isinf(top_p_filter(logits, 0.9))
    assert kept.tolist() == [True, True, True, True, True, False]
    assert math.isclose(logits.softmax(-1)[kept].sum().item(), 0.9418, abs_tol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("min_p", [0.01, 0.1, 0.3, 0.9, 1.0])
def test_min_p_equals_hf(kind, min_p):
    logits = random_logits(kind, 2)
    assert same(min_p_filter(logits, min_p), MinPLogitsWarper(min_p)(None, logits))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("penalty", [0.5, 1.2, 2.0])
def test_repetition_penalty_equals_hf(kind, penalty):
    logits = random_logits(kind, 3)
    g = torch.Generator().manual_seed(3)
    previous = torch.randint(0, V, (logits.shape[0], 30), generator=g)  # repeats included
    ours = apply_penalties(logits, previous, repetition_penalty=penalty)
    assert same(ours, RepetitionPenaltyLogitsProcessor(penalty)(previous, logits))


@pytest.mark.parametrize("penalty", [0.5, 1e-3, 1e-300])
@pytest.mark.parametrize("temperature", [0.0, 1e-4, 1.0])
def test_a_penalty_past_float32s_range_still_gives_a_distribution(penalty, temperature):
    """A finite logit above ~2.4e38 divided by a penalty below 1 overflows float32: that row is penalised in
    float64 and shifted instead, so the distribution is the exact one, never NaN."""
    logits = torch.tensor([[3e38, 1.0, -2.0, 2.9e38, 0.5], [0.1, 0.2, 0.3, 0.4, 0.5]])  # (2, 5)
    previous = torch.tensor([[0, 3], [0, 1]])
    cfg = SamplingConfig(temperature=temperature, repetition_penalty=penalty)
    probs = probabilities(logits, cfg, previous)
    assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(2))
    if penalty >= 1e-3:  # float64 holds 3e38 / 1e-3: token 0 wins outright, as exact arithmetic says
        assert probs[0].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    else:  # past float64's range too: both seen tokens sit at the largest value, nothing else can win
        assert probs[0, 1:3].sum() == 0 and probs[0, 4] == 0
    if penalty >= 1e-3:  # the second row does not overflow: HuggingFace's exact values, bit for bit
        plain = apply_penalties(logits[1:], previous[1:], repetition_penalty=penalty)
        assert same(plain, RepetitionPenaltyLogitsProcessor(penalty)(previous[1:], logits[1:]))
    token = next_token(logits, cfg, torch.Generator().manual_seed(0), previous)
    assert token[0, 0] in (0, 3)


def test_a_temperature_too_small_for_float32_is_refused_not_nan():
    with pytest.raises(ValueError, match="temperature 1e-300 is too small"):
        next_token(torch.randn(1, V), SamplingConfig(temperature=1e-300), torch.Generator().manual_seed(0))
    assert torch.isfinite(apply_temperature(torch.randn(1, V) * 1e38, 1.2e-38)).any()  # the smallest allowed


def openai_penalties(logits, previous, presence, frequency):
    """OpenAI's documented rule, element by element:
    mu[j] -> mu[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence."""
    out = logits.clone()
    for b in range(logits.shape[0]):
        counts = {}
        for t in previous[b].tolist():
            counts[t] = counts.get(t, 0) + 1
        for j, c in counts.items():
            out[b, j] = logits[b, j] - c * frequency - float(c > 0) * presence
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("presence, frequency", [(0.5, 0.0), (0.0, 0.7), (0.3, 0.5), (-1.0, 2.0)])
def test_presence_frequency_equal_openai_formula(kind, presence, frequency):
    logits = random_logits(kind, 4)
    g = torch.Generator().manual_seed(4)
    previous = torch.randint(0, V, (logits.shape[0], 40), generator=g)
    ours = apply_penalties(logits, previous, presence_penalty=presence, frequency_penalty=frequency)
    ref = openai_penalties(logits, previous, presence, frequency)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    finite = ~torch.isinf(ref)
    torch.testing.assert_close(ours[finite], ref[finite], rtol=0, atol=1e-5)  # float32 sums in another order


@pytest.fixture(scope="module")
def hf_model():
    from helpers.hf import to_hf_llama

    return to_hf_llama(random_model(ModelConfig.from_preset("tiny")))


@pytest.mark.parametrize("kind", ["continuous", "neg_inf"])
@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=0.7, top_k=10, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
        dict(temperature=1.5, top_k=0, top_p=0.5, min_p=0.0, repetition_penalty=1.0),
        dict(temperature=0.4, top_k=3, top_p=1.0, min_p=0.2, repetition_penalty=0.8),
    ],
)
def test_whole_pipeline_equals_hf_generate_order(hf_model, kind, settings):
    """probabilities() applies the same steps in the same order as HF's generate builds them."""
    V_hf = hf_model.config.vocab_size
    logits = random_logits(kind, 5, rows=4, vocab=V_hf)
    previous = torch.randint(0, V_hf, (4, 12), generator=torch.Generator().manual_seed(5))
    gen_cfg = GenerationConfig(do_sample=True, **settings)
    processors = hf_model._get_logits_processor(
        generation_config=gen_cfg, input_ids_seq_length=12, logits_processor=LogitsProcessorList()
    )
    names = [type(p).__name__ for p in processors]
    assert names == [
        n
        for n, on in [
            ("RepetitionPenaltyLogitsProcessor", settings["repetition_penalty"] != 1),
            ("TemperatureLogitsWarper", settings["temperature"] != 1),
            ("TopKLogitsWarper", settings["top_k"] > 0),
            ("TopPLogitsWarper", settings["top_p"] < 1),
            ("MinPLogitsWarper", True),
        ]
        if on
    ]
    hf_probs = processors(previous, logits.clone()).softmax(-1)
    ours = probabilities(logits, SamplingConfig(**settings), previous)
    torch.testing.assert_close(ours, hf_probs, rtol=0, atol=0)


def test_greedy_and_ties():
    logits = random_logits("ties", 8)
    greedy = SamplingConfig(temperature=0)
    assert torch.equal(next_token(logits, greedy)[:, 0], logits.argmax(-1))  # first maximum, like torch/HF
    assert torch.equal(probabilities(logits, greedy).argmax(-1), logits.argmax(-1))
    assert torch.equal(probabilities(logits, greedy).sum(-1), torch.ones(logits.shape[0]))
    # temperature 0 ignores top-p (the "temperature 0, top_p 0.9" question): still the argmax
    assert torch.equal(probabilities(logits, SamplingConfig(temperature=0, top_p=0.9)), probabilities(logits, greedy))


def test_same_seed_same_tokens_and_temperature_zero_is_greedy():
    model = random_model(ModelConfig.from_preset("tiny"))
    prompt = torch.tensor([[1, 2, 3, 4]])
    cfg = SamplingConfig(temperature=1.0, top_p=0.95)
    runs = [generate(model, prompt, 30, sampling=cfg, generator=torch.Generator().manual_seed(s)) for s in (7, 7, 8)]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])
    # temperature 0 equals an argmax loop written out by hand
    greedy = generate(model, prompt, 20, sampling=SamplingConfig(temperature=0.0))
    seq = prompt
    with torch.no_grad():
        for _ in range(20):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(greedy, seq)


def test_sampling_draws_from_the_filtered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    cfg = SamplingConfig(temperature=0.8, top_p=0.8)
    probs = probabilities(logits, cfg)[0]
    g = torch.Generator().manual_seed(0)
    draws = next_token(logits.expand(20000, -1), cfg, g)[:, 0]
    freq = torch.bincount(draws, minlength=5).float() / len(draws)
    assert (freq[probs == 0] == 0).all()
    torch.testing.assert_close(freq, probs, rtol=0, atol=0.015)  # ~4 standard errors at n=20000


def test_sample_from_uniform_is_the_inverse_cdf():
    """Evenly spaced uniforms give every token its share of them, to one draw (what inverse-CDF sampling
    means, with no randomness in the test); tokens of probability 0 are never picked, even at u = 0 or u
    just below 1 and at either end of the vocabulary; rows need not be normalised; any leading shape."""
    probs = torch.tensor([0.0, 0.1, 0.0, 0.45, 0.3, 0.15, 0.0])  # (V,)
    N = 10_000
    u = (torch.arange(N) + 0.5) / N  # (N,)
    picks = sample_from_uniform(probs.expand(N, -1), u)  # (N,)
    counts = torch.bincount(picks, minlength=len(probs))
    assert (counts - N * probs).abs().max() <= 1
    edges = torch.tensor([0.0, torch.nextafter(torch.tensor(1.0), torch.tensor(0.0)).item()])
    assert sample_from_uniform(probs.expand(2, -1), edges).tolist() == [1, 5]
    assert sample_from_uniform(3 * probs.expand(2, -1), edges).tolist() == [1, 5]  # unnormalised
    batch = torch.softmax(torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0)), -1)  # (2, 3, V)
    got = sample_from_uniform(batch, torch.full((2, 3), 0.5))  # (2, 3)
    assert got.shape == (2, 3)
    assert torch.equal(got, (batch.cumsum(-1) <= 0.5 * batch.sum(-1, keepdim=True)).sum(-1))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.01), "top_p"),
        (dict(top_p=float("nan")), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(min_p=1.5), "min_p"),
        (dict(repetition_penalty=-1.0), "repetition_penalty"),
        (dict(repetition_penalty=float("nan")), "repetition_penalty"),
        (dict(presence_penalty=3.0), "presence_penalty"),
        (dict(frequency_penalty=-2.5), "frequency_penalty"),
    ],
)
def test_bad_settings_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingConfig(**kwargs)
    with pytest.raises(ValueError, match=name):
        validate_sampling(**kwargs)


def test_bad_settings_in_the_pure_functions():
    logits = torch.zeros(1, 5)
    with pytest.raises(ValueError, match="temperature"):
        apply_temperature(logits, 0.0)
    with pytest.raises(ValueError, match="top_k"):
        top_k_filter(logits, -2)
    with pytest.raises(ValueError, match="top_p"):
        top_p_filter(logits, 0.0)
    with pytest.raises(ValueError, match="min_p"):
        min_p_filter(logits, -0.5)
    with pytest.raises(ValueError, match="repetition_penalty"):
        apply_penalties(logits, torch.zeros(1, 2, dtype=torch.long), repetition_penalty=0.0)
