"""helpers.measure.profiling: torch calls counted from Python, and the profiler's operator counts and times."""

from __future__ import annotations

import pytest
import torch
from conftest import random_model

from helpers.generate import decode_one_token, prefill
from helpers.kv_cache import KVCache
from helpers.measure.profiling import count_torch_calls, profile_step
from helpers.model import ModelConfig


def _step(n_layers):
    model = random_model(ModelConfig.from_preset("tiny", n_layers=n_layers), seed=0)
    cache = KVCache.for_model(model, max_seq_len=16)
    token = prefill(model, torch.tensor([[1, 2, 3]]), cache).argmax(-1, keepdim=True)  # (1, 1)

    def step():
        decode_one_token(model, token, cache)
        cache.truncate(cache.length - 1)

    return step


def test_calls_grow_by_the_same_amount_per_layer():
    counts = [sum(count_torch_calls(_step(n)).values()) for n in (1, 2, 3)]
    assert counts[1] - counts[0] == counts[2] - counts[1] > 0  # each layer makes the same calls
    assert counts == [sum(count_torch_calls(_step(n)).values()) for n in (1, 2, 3)]  # and the count is exact


def test_attribute_reads_are_not_counted():
    x = torch.ones(3)
    calls = count_torch_calls(lambda: (x.shape, x.dtype, x + 1))
    assert dict(calls) == {"add": 1}


def test_profile_step_counts_matmuls_and_more():
    prof = profile_step(_step(2), steps=5)
    assert prof.ops["aten::mm"][0] == 5 * (2 * 4 + 1)  # per layer: W_qkv, W_o, gate|up, down; plus the head
    assert prof.aten_ops_per_step > sum(count_torch_calls(_step(2)).values())
    assert 0 < prof.matmul_share < 1
    assert "aten::mm" in prof.table(3)
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        profile_step(_step(1), steps=0)
