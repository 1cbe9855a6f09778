"""Bad input gives a ValueError that names the parameter and the allowed range, never a deep torch error."""
from __future__ import annotations

import pytest
import torch
from conftest import random_model

from helpers.generate import generate, generate_without_cache
from helpers.kv_cache import KVCache
from helpers.model import ModelConfig
from helpers.sampling import SamplingConfig

CFG = ModelConfig.from_preset("tiny")


@pytest.fixture(scope="module")
def model():
    return random_model(CFG)


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


@pytest.mark.parametrize("idx, msg", [
    (torch.ones(1, 4), "integer token ids"),
    (torch.ones(2, 3, 4, dtype=torch.long), r"shape \(B, T\)"),
    (torch.tensor([[1, 2, 256]]), r"token ids must be in \[0, 255\]"),
    (torch.tensor([[-1, 2]]), r"token ids must be in \[0, 255\]"),
    ([[1, 2]], "torch.Tensor"),
])
def test_forward_rejects_bad_idx(model, idx, msg):
    with pytest.raises(ValueError, match=msg):
        model(idx)


@pytest.mark.parametrize("prompt, msg", [
    ([1.5, 2], "list of int token ids"),
    (["a"], "list of int token ids"),
    ("hello", "list of token ids or a tensor"),
    ([1, 999], r"token ids must be in \[0, 255\]"),
])
def test_generate_rejects_bad_prompt(model, prompt, msg):
    with pytest.raises(ValueError, match=msg):
        generate(model, prompt, 3)


def test_cache_misuse(model):
    cache = KVCache.for_model(model, max_seq_len=8)
    with pytest.raises(ValueError, match=r"do not fit the cache \(max_seq_len=8\)"):
        model(torch.ones(1, 9, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"start_pos must be in \[0, 0\]"):
        model(torch.ones(1, 2, dtype=torch.long), cache=cache, start_pos=3)
    with pytest.raises(ValueError, match="batch size 2 but the cache was built for 1"):
        model(torch.ones(2, 2, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"max_seq_len must be in \[1, 128\]"):
        KVCache.for_model(model, max_seq_len=500)


@pytest.mark.parametrize("kwargs, name", [
    (dict(temperature=-0.5), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_k=-1), "top_k"), (dict(top_k=2.0), "top_k"),
    (dict(min_p=-0.1), "min_p"), (dict(repetition_penalty=0), "repetition_penalty"),
])
def test_bad_sampling_settings(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingConfig(**kwargs)


def test_stop_conditions(model):
    greedy = generate(model, [1, 2, 3], 40)[0, 3:].tolist()
    eos = greedy[5]
    out = generate(model, [1, 2, 3], 40, eos_id=eos)[0, 3:].tolist()
    assert out == greedy[:greedy.index(eos) + 1]  # stops at the first end-of-text, which is kept
    stop = greedy[10:12]
    out = generate(model, [1, 2, 3], 40, stop_sequences=[stop])[0, 3:].tolist()
    first = next(i for i in range(len(greedy) - 1) if greedy[i:i + 2] == stop)
    assert out == greedy[:first + 2]
    assert generate_without_cache(model, [1, 2, 3], 40, stop_sequences=[stop])[0, 3:].tolist() == out


def test_bad_config():
    with pytest.raises(ValueError, match="n_heads .* divisible by n_kv_heads"):
        ModelConfig.from_preset("tiny", n_kv_heads=3)
    with pytest.raises(ValueError, match="unknown preset"):
        ModelConfig.from_preset("huge")
