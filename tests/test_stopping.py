"""Stop criteria (stopping.py) on their own and inside generate / generate_without_cache."""

from __future__ import annotations

import pytest
import torch
from conftest import random_model

from helpers import load_tokenizer
from helpers.generate import generate, generate_without_cache
from helpers.model import ModelConfig
from helpers.stopping import RepetitionStop, TextStop, cut_at_stop_string, ends_in_loop, find_loop

CFG = ModelConfig.from_preset("tiny")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_ends_in_loop():
    assert ends_in_loop([9, 1, 2, 3, 1, 2, 3, 1, 2, 3], 3, 3)
    assert not ends_in_loop([9, 1, 2, 3, 1, 2, 3, 1, 2, 4], 3, 3)
    assert not ends_in_loop([1, 2, 3, 1, 2, 3], 3, 3)  # only two copies
    assert ends_in_loop([5, 5, 5, 5], 1, 4)
    assert not ends_in_loop([5, 5, 5], 1, 4)


def test_repetition_stop_finds_the_period():
    stop = RepetitionStop(max_period=8, min_repeats=3)
    seq = [7, 8, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    assert not stop(seq)
    assert stop(seq + [4])
    assert stop.period == 4 and stop.at == 14


def test_repetition_stop_period_one_is_identical_tokens_in_a_row():
    run = RepetitionStop(max_period=1, min_repeats=4)
    assert not run([1, 2, 1, 2, 1, 2, 1, 2])  # a period-2 loop is invisible to the "N identical tokens" rule
    assert run([3, 5, 5, 5, 5]) and run.period == 1


def test_repetition_stop_ignores_loops_longer_than_max_period():
    seq = list(range(10)) * 3
    assert not RepetitionStop(max_period=9, min_repeats=3)(seq)
    assert RepetitionStop(max_period=10, min_repeats=3)(seq)


@pytest.mark.parametrize(
    "kwargs, msg",
    [({"max_period": 0}, "max_period"), ({"min_repeats": 1}, "min_repeats"), ({"max_period": 2.0}, "max_period")],
)
def test_repetition_stop_rejects_bad_parameters(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        RepetitionStop(**kwargs)


def test_text_stop_catches_a_string_the_tokenizer_merged(tok):
    ids = tok.encode("x = 1\n\n    def f(self):")
    merged = tok.encode("\n\n")
    # the blank line is merged with the indentation, so the id-level sequence never occurs ...
    assert all(ids[i : i + len(merged)] != merged for i in range(len(ids)))
    # ... but the text-level stop fires, at the token that completes it
    stop = TextStop(tok, ["\n\n"])
    fired = [k for k in range(1, len(ids) + 1) if stop(ids[:k])]
    assert fired and "\n\n" in tok.decode(ids[: fired[0]]) and "\n\n" not in tok.decode(ids[: fired[0] - 1])
    assert stop.matched == "\n\n"


@pytest.mark.parametrize("bad", [[], [""], "", [3]])
def test_text_stop_rejects_bad_stops(tok, bad):
    with pytest.raises(ValueError, match="stops must be"):
        TextStop(tok, bad)


def test_cut_at_stop_string():
    assert cut_at_stop_string("a = 1\n\nb = 2", ["\n\n"]) == "a = 1"
    assert cut_at_stop_string("a = 1; b = 2; c", [";", "b"]) == "a = 1"
    assert cut_at_stop_string("no stop here", "\n") == "no stop here"


def test_find_loop():
    assert find_loop([4, 9, 1, 2, 1, 2, 1, 2, 1]) == (2, 2)
    assert find_loop([1, 2, 3, 4, 5, 6]) is None
    assert find_loop([8, 8, 8, 8, 8]) == (0, 1)
    assert find_loop(torch.tensor([5, 1, 2, 3] * 4)) == (0, 4)  # tensors are accepted


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, seed=0)  # its greedy output falls into a loop


@pytest.mark.parametrize("gen", [generate, generate_without_cache])
def test_generate_stops_where_the_criterion_first_fires(model, gen):
    prompt = [1, 2, 3]
    full = gen(model, prompt, 100)[0, 3:].tolist()
    assert find_loop(full) is not None  # random greedy models loop, which is what this test needs
    stop = RepetitionStop(max_period=16, min_repeats=3)
    out = gen(model, prompt, 100, stop_criteria=[stop])[0, 3:].tolist()
    assert out == full[: len(out)] and len(out) < 100
    assert stop.at == len(out) and ends_in_loop(out, stop.period, 3)
    fresh = RepetitionStop(max_period=16, min_repeats=3)
    assert not any(fresh(out[:k]) for k in range(1, len(out)))  # it did not miss an earlier stop


def test_criterion_sees_only_generated_tokens_and_eos_wins(model):
    seen = []

    def after_five(generated):
        seen.append(list(generated))
        return len(generated) == 5

    out = generate(model, [1, 2, 3], 50, stop_criteria=[after_five])
    assert out.shape == (1, 8) and seen[0] == out[0, 3:4].tolist()
    first = int(out[0, 3])
    out = generate(model, [1, 2, 3], 50, eos_id=first, stop_criteria=[after_five])
    assert out.shape == (1, 4)


def test_stop_criteria_need_batch_one_and_callables(model):
    with pytest.raises(ValueError, match="batch size 1"):
        generate(model, torch.ones(2, 3, dtype=torch.long), 5, stop_criteria=[RepetitionStop()])
    with pytest.raises(ValueError, match="callables"):
        generate(model, [1, 2, 3], 5, stop_criteria=["\n"])
