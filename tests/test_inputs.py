"""Bad input gives a ValueError that names the parameter and the allowed range, never a deep torch error."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import random_model

from helpers.fast_decode import FastGenerator
from helpers.generate import decode_one_token, generate, generate_sliding_window, generate_without_cache, prefill
from helpers.kv_cache import KVCache
from helpers.model import ModelConfig
from helpers.sampling import SamplingConfig, next_token, probabilities
from helpers.sliding_window import RollingKVCache
from helpers.speculative import prompt_lookup_generate, speculative_generate
from helpers.tokenizer import Tokenizer

CFG = ModelConfig.from_preset("tiny")
NEG_INF = float("-inf")


@pytest.fixture(scope="module")
def model():
    return random_model(CFG)


# every public loop that turns a prompt into tokens, with one signature: (model, prompt, max_new_tokens, **kw)
ENTRY_POINTS = {
    "generate": generate,
    "generate_without_cache": generate_without_cache,
    "generate_sliding_window": lambda m, p, n, **kw: generate_sliding_window(m, p, n, window=8, **kw),
    "FastGenerator": lambda m, p, n, **kw: FastGenerator(m, compile=False).generate(p, n, **kw),
    "speculative_generate": lambda m, p, n, **kw: speculative_generate(m, m, p, n, **kw)[0],
    "prompt_lookup_generate": lambda m, p, n, **kw: prompt_lookup_generate(m, p, n, **kw)[0],
}


@pytest.mark.parametrize("gen", [generate, generate_without_cache])
def test_empty_prompt(model, gen):
    with pytest.raises(ValueError, match="prompt must contain at least 1 token"):
        gen(model, [], 5)
    with pytest.raises(ValueError, match="prompt must contain at least 1 token"):
        gen(model, torch.zeros(1, 0, dtype=torch.long), 5)


@pytest.mark.parametrize("gen", [generate, generate_without_cache])
def test_prompt_longer_than_context(model, gen):
    with pytest.raises(ValueError, match=r"prompt has 129 tokens .* allowed prompt length is 1\.\.128"):
        gen(model, [1] * 129, 0)


def test_prompt_plus_new_tokens_past_the_window(model):
    with pytest.raises(ValueError, match=r"max_new_tokens \(30\) exceeds .* allowed max_new_tokens is 0\.\.28"):
        generate(model, [1] * 100, 30)


@pytest.mark.parametrize("bad", [-1, -100, 2.5, "3", True])
def test_bad_max_new_tokens(model, bad):
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0"):
        generate(model, [1, 2, 3], bad)


def test_zero_new_tokens_returns_the_prompt(model):
    assert generate(model, [1, 2, 3], 0).tolist() == [[1, 2, 3]]


@pytest.mark.parametrize(
    "idx, msg",
    [
        (torch.ones(1, 4), "integer token ids"),
        (torch.ones(2, 3, 4, dtype=torch.long), r"shape \(B, T\)"),
        (torch.tensor([[1, 2, 256]]), r"token ids must be in \[0, 255\]"),
        (torch.tensor([[-1, 2]]), r"token ids must be in \[0, 255\]"),
        ([[1, 2]], "torch.Tensor"),
    ],
)
def test_forward_rejects_bad_idx(model, idx, msg):
    with pytest.raises(ValueError, match=msg):
        model(idx)


@pytest.mark.parametrize(
    "prompt, msg",
    [
        ([1.5, 2], "list of int token ids"),
        (["a"], "list of int token ids"),
        ("hello", "list of token ids or a tensor"),
        ([1, 999], r"token ids must be in \[0, 255\]"),
    ],
)
def test_generate_rejects_bad_prompt(model, prompt, msg):
    with pytest.raises(ValueError, match=msg):
        generate(model, prompt, 3)


def test_cache_misuse(model):
    cache = KVCache.for_model(model, max_seq_len=8)
    with pytest.raises(ValueError, match=r"do not fit the cache \(max_seq_len=8\)"):
        model(torch.ones(1, 9, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"start_pos must be in \[0, 0\]"):
        model(torch.ones(1, 2, dtype=torch.long), cache=cache, start_pos=3)
    with pytest.raises(ValueError, match="cache was built for batch size 1; got a batch of 2"):
        model(torch.ones(2, 2, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"max_seq_len must be in \[1, 128\]"):
        KVCache.for_model(model, max_seq_len=500)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.0), "top_k"),
        (dict(min_p=-0.1), "min_p"),
        (dict(repetition_penalty=0), "repetition_penalty"),
    ],
)
def test_bad_sampling_settings(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingConfig(**kwargs)


def test_stop_conditions(model):
    greedy = generate(model, [1, 2, 3], 40)[0, 3:].tolist()
    eos = greedy[5]
    out = generate(model, [1, 2, 3], 40, eos_id=eos)[0, 3:].tolist()
    assert out == greedy[: greedy.index(eos) + 1]  # stops at the first end-of-text, which is kept
    stop = greedy[10:12]
    out = generate(model, [1, 2, 3], 40, stop_sequences=[stop])[0, 3:].tolist()
    first = next(i for i in range(len(greedy) - 1) if greedy[i : i + 2] == stop)
    assert out == greedy[: first + 2]
    assert generate_without_cache(model, [1, 2, 3], 40, stop_sequences=[stop])[0, 3:].tolist() == out


def test_bad_config():
    with pytest.raises(ValueError, match="n_heads .* divisible by n_kv_heads"):
        ModelConfig.from_preset("tiny", n_kv_heads=3)
    with pytest.raises(ValueError, match="unknown preset"):
        ModelConfig.from_preset("huge")


# --- the sampler: logits that have no distribution, and huge ones that do ----------------------------------

SAMPLERS = [
    SamplingConfig(temperature=0),
    SamplingConfig(temperature=0, repetition_penalty=1.3),
    SamplingConfig(temperature=0.8),
    SamplingConfig(temperature=0.7, top_k=3, top_p=0.9, min_p=0.05),
]
SAMPLER_IDS = ["greedy", "greedy-penalty", "t0.8", "t0.7-filters"]


@pytest.mark.parametrize("cfg", SAMPLERS, ids=SAMPLER_IDS)
@pytest.mark.parametrize(
    "bad, msg",
    [
        (torch.tensor([[0.5, 1.0, 2.0], [NEG_INF, NEG_INF, NEG_INF]]), "logits have a row where every entry is -inf"),
        (torch.tensor([[0.5, float("nan"), 2.0]]), "logits contain NaN"),
        (torch.tensor([[0.5, float("inf"), 2.0]]), r"logits contain \+inf"),
    ],
    ids=["all-neg-inf-row", "nan", "pos-inf"],
)
def test_sampler_rejects_logits_without_a_distribution(cfg, bad, msg):
    previous = torch.zeros(bad.shape[0], 1, dtype=torch.long)
    with pytest.raises(ValueError, match=msg):
        next_token(bad, cfg, previous=previous)
    with pytest.raises(ValueError, match=msg):
        probabilities(bad, cfg, previous)


@pytest.mark.parametrize("cfg", SAMPLERS, ids=SAMPLER_IDS)
def test_masked_tokens_are_fine(cfg):
    logits = torch.tensor([[NEG_INF, 1.0, NEG_INF, 0.5], [2.0, NEG_INF, NEG_INF, NEG_INF]])
    probs = probabilities(logits, cfg)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2))
    assert (probs[torch.isinf(logits)] == 0).all()
    tokens = next_token(logits, cfg, torch.Generator().manual_seed(0))[:, 0].tolist()
    assert tokens[0] in (1, 3) and tokens[1] == 0


@pytest.mark.parametrize(
    "cfg",
    [
        SamplingConfig(temperature=1e-4),
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=1e-4, top_k=2, top_p=0.9, min_p=0.1),
        SamplingConfig(temperature=0),
    ],
    ids=["t1e-4", "t1", "t1e-4-filters", "greedy"],
)
def test_huge_finite_logits_give_a_valid_distribution(cfg):
    """3e38 / 1e-4 overflows float32: the row maximum is subtracted before the temperature divides."""
    logits = torch.tensor([[-3e38, 3e38, 0.0, 1.5e38], [3e38, -3e38, 1.0, 3e38 * 0.999]])
    probs = probabilities(logits, cfg)
    assert torch.isfinite(probs).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(2))
    assert probs.argmax(-1).tolist() == [1, 0]
    assert next_token(logits, cfg, torch.Generator().manual_seed(0))[:, 0].tolist() == [1, 0]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_loop_refuses_nan_logits(model, entry, temperature):
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.norm.weight.fill_(float("nan"))  # what an overflow inside the model looks like
    with pytest.raises(ValueError, match="logits contain NaN"):
        ENTRY_POINTS[entry](broken, [1, 2, 3], 5, temperature=temperature)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_speculative_checks_the_drafts_logits_too(model, temperature):
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.norm.weight.fill_(float("nan"))
    with pytest.raises(ValueError, match="logits contain NaN"):
        speculative_generate(model, broken, [1, 2, 3], 5, temperature=temperature)


# --- a KV cache built for another model ----------------------------------------------------------------


@pytest.mark.parametrize(
    "other_cfg",
    [replace(CFG, n_layers=1), replace(CFG, n_kv_heads=1), replace(CFG, d_ff=64)],
    ids=["fewer-layers", "fewer-kv-heads", "same-layout-other-config"],
)
def test_cache_built_for_another_model_is_refused(model, other_cfg):
    cache = KVCache.for_model(random_model(other_cfg), max_seq_len=16)
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="cache was built for another model"):
        model(ids, cache=cache)
    with pytest.raises(ValueError, match="cache was built for another model"):
        prefill(model, ids, cache)
    with pytest.raises(ValueError, match="cache was built for another model"):
        decode_one_token(model, ids[:, :1], cache)
    with pytest.raises(ValueError, match="cache was built for another model"):
        generate(model, [1, 2, 3], 5, cache=cache)
    ring = RollingKVCache.for_model(random_model(other_cfg), window=8)
    with pytest.raises(ValueError, match="cache was built for another model"):
        model(ids, cache=ring, attn_window=8)


def test_cache_dtype_and_capacity_are_checked(model):
    with pytest.raises(ValueError, match=r"cache was built for another model \(.*dtype=torch.bfloat16"):
        generate(model, [1, 2, 3], 5, cache=KVCache.for_model(model, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="cache was built for batch size 2; prompt has batch size 1"):
        generate(model, [1, 2, 3], 5, cache=KVCache.for_model(model, batch_size=2))
    with pytest.raises(ValueError, match=r"cache holds 10 positions but prompt \(3 tokens\) \+ max_new_tokens \(30\)"):
        generate(model, [1, 2, 3], 30, cache=KVCache.for_model(model, max_seq_len=10))  # not after 7 tokens
    with pytest.raises(ValueError, match="cache must be a KVCache"):
        prefill(model, torch.tensor([[1, 2]]), None)
    # a cache built by hand with the model's layout is fine, and a full one just fits
    hand_made = KVCache(CFG.n_layers, 1, CFG.n_kv_heads, 12, CFG.head_dim)
    assert torch.equal(generate(model, [1, 2, 3], 10, cache=hand_made), generate(model, [1, 2, 3], 10))


# --- stop sequences, token ids for decode, generators --------------------------------------------------


@pytest.mark.parametrize("stops", [["\n"], "\n\n", [b"x"], [1, 2]], ids=["list-of-str", "str", "bytes", "flat-ids"])
@pytest.mark.parametrize("entry", ["generate", "generate_without_cache", "FastGenerator"])
def test_stop_sequences_must_be_token_ids(model, entry, stops):
    with pytest.raises(ValueError, match=r"stop_sequences must be lists of token ids.*TextStop"):
        ENTRY_POINTS[entry](model, [1, 2, 3], 5, stop_sequences=stops)


@pytest.mark.parametrize(
    "ids",
    [[1.5, 2.0], [104.0], "104", b"hi", torch.tensor([104.0, 105.0]), np.array([1.5]), [[104, 105]], 104, [True]],
    ids=["floats", "float", "str", "bytes", "float-tensor", "float-array", "nested", "int", "bool"],
)
def test_decode_needs_integer_ids(ids):
    tok = Tokenizer([])
    with pytest.raises(ValueError, match="ids must be integer token ids"):
        tok.decode(ids)
    with pytest.raises(ValueError, match="ids must be integer token ids"):
        tok.token_strings(ids)


def test_decode_accepts_every_integer_container():
    tok = Tokenizer([])
    for ids in ([104, 105], (104, 105), torch.tensor([104, 105]), np.array([104, 105]), range(104, 106)):
        assert tok.decode(ids) == "hi"


@pytest.mark.parametrize("generator", [0, "seed", np.random.default_rng(0)], ids=["int", "str", "numpy"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_generator_must_be_a_torch_generator(model, entry, temperature, generator):
    with pytest.raises(ValueError, match="generator must be a torch.Generator"):
        ENTRY_POINTS[entry](model, [1, 2, 3], 5, temperature=temperature, generator=generator)


@pytest.mark.parametrize(
    "cfg", [SamplingConfig(temperature=0), SamplingConfig(temperature=0.8)], ids=["greedy", "t0.8"]
)
def test_next_token_checks_the_generator_even_when_greedy(cfg):
    with pytest.raises(ValueError, match="generator must be a torch.Generator"):
        next_token(torch.zeros(1, 5), cfg, generator=42)


# --- errors name the parameter the caller passed -----------------------------------------------------


@pytest.mark.parametrize(
    "prompt, msg",
    [
        (torch.ones(1, 4), "^prompt must hold integer token ids"),
        (torch.ones(2, 3, 4, dtype=torch.long), r"^prompt must have shape \(B, T\)"),
        (torch.tensor([[1, 2, 256]]), r"^prompt: token ids must be in \[0, 255\]"),
    ],
)
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_errors_name_the_prompt(model, entry, prompt, msg):
    with pytest.raises(ValueError, match=msg):
        ENTRY_POINTS[entry](model, prompt, 3)


def test_prefill_and_decode_one_token_name_their_parameters(model):
    cache = KVCache.for_model(model, max_seq_len=16)
    with pytest.raises(ValueError, match="^prompt must hold integer token ids"):
        prefill(model, torch.ones(1, 4), cache)
    with pytest.raises(ValueError, match=r"^prompt: token ids must be in \[0, 255\]"):
        prefill(model, torch.tensor([[1, 999]]), cache)
    with pytest.raises(ValueError, match="^token must be a torch.Tensor"):
        decode_one_token(model, [1], cache)
    with pytest.raises(ValueError, match="^token must hold integer token ids"):
        decode_one_token(model, torch.ones(1, 1), cache)
    with pytest.raises(ValueError, match="^cache was built for batch size 1; got a batch of 2"):
        prefill(model, torch.ones(2, 3, dtype=torch.long), cache)


# --- speculative decoding: the draft's context window ------------------------------------------------


def test_draft_context_window_is_checked_before_speculation(model):
    draft = random_model(replace(CFG, n_layers=1, max_seq_len=16))
    with pytest.raises(
        ValueError,
        match=r"max_new_tokens \(20\) exceeds the draft model's context window "
        r"max_seq_len=16: allowed max_new_tokens is 0\.\.13",
    ):
        speculative_generate(model, draft, [1, 2, 3], 20, gamma=4)
    with pytest.raises(ValueError, match=r"prompt has 20 tokens but the draft model's context window"):
        speculative_generate(model, draft, [1] * 20, 5)
    out, _ = speculative_generate(model, draft, [1, 2, 3], 13, gamma=4)  # exactly fills the draft's window
    assert torch.equal(out, generate(model, [1, 2, 3], 13))
