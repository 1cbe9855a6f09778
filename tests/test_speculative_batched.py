"""Batched greedy speculative decoding (helpers.speculative.batched): every row is the target's greedy output,
the rows accept in lockstep, and bad input is refused with the parameter named."""

from __future__ import annotations

import pytest
import torch
from conftest import random_model

from helpers.generate import generate
from helpers.model import ModelConfig
from helpers.speculative.batched import batched_speculative_generate

TEXTS = [
    "import os\nimport sys\n\n\ndef main(",
    "class Queue:\n    def __init__(self",
    '"""Utilities for reading files',
    "def parse_args(argv):\n    parser =",
]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("batch", [1, 4])
def test_each_row_equals_target_greedy(shipped, batch):
    target, draft, tok = shipped
    L = min(len(tok.encode(t, bos=True)) for t in TEXTS)
    prompts = torch.tensor([tok.encode(t, bos=True)[:L] for t in TEXTS[:batch]])  # (B, L)
    out, stats = batched_speculative_generate(target, draft, prompts, 48, gamma=3)
    assert out.shape == (batch, L + 48)
    for b in range(batch):
        assert torch.equal(out[b], generate(target, prompts[b : b + 1], 48)[0]), b
    # every round commits the lockstep minimum + 1 tokens in every row
    assert stats.new_tokens == 48 == sum(stats.accepted) + stats.rounds
    assert all(k == min(rows) for k, rows in zip(stats.accepted, stats.row_accepted))
    assert all(len(rows) == batch for rows in stats.row_accepted)
    if batch == 1:
        assert stats.lockstep_tokens_per_round == stats.per_row_tokens_per_round
    else:  # the four code prompts' drafts do not agree with the target in the same rounds
        assert stats.lockstep_tokens_per_round < stats.per_row_tokens_per_round


TINY_T = ModelConfig.from_preset("tiny", vocab_size=5, max_seq_len=64)
TINY_D = ModelConfig.from_preset("tiny", vocab_size=5, max_seq_len=64, n_layers=1, d_model=32, d_ff=64)


def test_edge_lengths_on_tiny_models():
    target, draft = random_model(TINY_T, seed=3, std=0.3), random_model(TINY_D, seed=4, std=0.3)
    for prompts in (
        [[0], [3]],
        [[1, 2], [2, 1]],
        [[4, 0, 3, 3, 1, 2, 0], [0, 0, 0, 1, 1, 1, 2], [2, 3, 4, 0, 1, 2, 3]],
    ):
        for n in (0, 1, 2, 7, 40):
            for gamma in (1, 4, 16):
                out, stats = batched_speculative_generate(target, draft, prompts, n, gamma=gamma)
                for b, p in enumerate(prompts):
                    assert torch.equal(out[b], generate(target, p, n)[0]), (prompts, n, gamma, b)
                assert stats.new_tokens == n and all(g <= gamma for g in stats.proposed)


def test_bad_input_names_the_parameter():
    target, draft = random_model(TINY_T, seed=3, std=0.3), random_model(TINY_D, seed=4, std=0.3)
    with pytest.raises(ValueError, match="same length"):
        batched_speculative_generate(target, draft, [[1, 2], [3]], 4)
    with pytest.raises(ValueError, match="gamma"):
        batched_speculative_generate(target, draft, [[1, 2]], 4, gamma=0)
    with pytest.raises(ValueError, match="prompts"):
        batched_speculative_generate(target, draft, torch.tensor([1, 2]), 4)
    with pytest.raises(ValueError, match="prompts"):
        batched_speculative_generate(target, draft, [[1, 5]], 4)  # id 5 outside vocab_size 5
    with pytest.raises(ValueError, match="max_new_tokens"):
        batched_speculative_generate(target, draft, [[1, 2]], 63)
    with pytest.raises(ValueError, match="max_new_tokens"):
        batched_speculative_generate(target, draft, [[1, 2]], -1)
    other = random_model(ModelConfig.from_preset("tiny", vocab_size=7, max_seq_len=64, n_layers=1), seed=5)
    with pytest.raises(ValueError, match="vocab"):
        batched_speculative_generate(target, other, [[1, 2]], 4)


def test_bench_rows_time_the_same_tokens(shipped):
    from helpers.bench.speculative_batched import rows_speculative_batched

    target, draft, tok = shipped
    ticks = []
    rows = rows_speculative_batched(target, draft, tok, 6, 1, lambda: ticks.append(1), batches=(1, 2), prompt_len=16)
    assert [r.extra["batch_size"] for r in rows] == [1, 2] and len(ticks) == 2
    assert all(r.same_output for r in rows)  # speculation changed no token of any row
    one, two = (r.extra for r in rows)
    assert one["lockstep_tokens_per_round"] == one["per_row_tokens_per_round"]
    assert two["lockstep_tokens_per_round"] <= two["per_row_tokens_per_round"]
