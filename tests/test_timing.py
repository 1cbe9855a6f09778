"""helpers.measure.timing: what the timers call, in which order, and what they return."""

import time

import pytest
import torch
from conftest import random_model

from helpers.measure.timing import (
    compiled_step_seconds,
    decode_step_seconds,
    median,
    spread,
    step_seconds,
    time_call,
    time_interleaved,
    timed,
)
from helpers.model import ModelConfig

CPU = torch.device("cpu")


def test_time_interleaved_calls_in_turn():
    calls = []
    fns = [lambda name=name: calls.append(name) for name in "abc"]
    times = time_interleaved(fns, CPU, repeats=3, warmup=2)
    assert calls == list("abc") * 5  # two warm-up turns, then three timed turns, never two of one in a row
    assert [len(t) for t in times] == [3, 3, 3]
    assert all(s >= 0 for t in times for s in t)


def test_time_interleaved_ratio_follows_the_work():
    short, long = (lambda: time.sleep(0.001)), (lambda: time.sleep(0.03))
    t_short, t_long = time_interleaved([short, long], CPU, repeats=5)
    # sleep never returns early: every timing of the long call is at least its 30 ms
    assert min(t_long) >= 0.03 and median(t_long) / median(t_short) > 2


def test_time_call_counts_repeats_not_warmup():
    calls = []
    times = time_call(lambda: calls.append(1), CPU, repeats=4, warmup=3)
    assert len(calls) == 7 and len(times) == 4


def test_time_interleaved_block_rewarms_then_averages():
    calls = []
    fns = [lambda name=name: calls.append(name) for name in "ab"]
    times = time_interleaved(fns, CPU, repeats=2, warmup=0, block=3)
    assert calls == list("aaaabbbb") * 2  # each turn: one untimed call, then three timed
    assert [len(t) for t in times] == [2, 2]


@pytest.mark.parametrize(
    "call",
    [
        lambda: time_interleaved([print], CPU, block=0),
        lambda: time_call(print, CPU, repeats=0),
        lambda: time_call(print, CPU, warmup=-1),
        lambda: step_seconds(print, 0, 0, CPU),
    ],
)
def test_bad_counts_are_refused(call):
    with pytest.raises(ValueError, match="block|repeats|warmup"):
        call()


def test_timed_returns_the_result_and_at_least_the_sleep():
    seconds, out = timed(lambda: time.sleep(0.01) or "done", CPU)
    assert out == "done" and seconds >= 0.01


def test_median_and_spread():
    assert median([3.0, 1.0, 2.0, 100.0, 2.5]) == 2.5  # an outlier moves the mean, not the median
    assert spread([3.0, 1.0, 2.0]) == (1.0, 3.0)


def test_step_seconds_times_the_step_and_advances_untimed():
    seen = []

    def step(x):
        seen.append(x)
        time.sleep(0.005)
        return x + 1

    def advance(x, out):
        time.sleep(0.05)  # slow, but not on the clock
        return out

    times = step_seconds(step, 10, 3, CPU, advance=advance, warmup=2)
    assert seen == [10, 11, 12, 13, 14]  # two warm-up steps, then three timed, each fed the last output
    assert len(times) == 3 and all(0.005 <= t < 0.05 for t in times)


@pytest.fixture(scope="module")
def tiny():
    return random_model(ModelConfig.from_preset("tiny"))


def test_decode_step_seconds_is_positive_and_seeded(tiny):
    assert 0 < decode_step_seconds(tiny, n_steps=4, context=8) < 5


class CountingGenerator:
    """What compiled_step_seconds needs from a FastGenerator, eager, counting the positions it is given."""

    def __init__(self, model, max_seq_len):
        from helpers.kv_cache import KVCache

        self.model = self.decode_model = model
        self.cache = KVCache.for_model(model, max_seq_len=max_seq_len)
        self.positions = []

    def step(self, token, input_pos):  # (1, 1), (1,) -> (1, V)
        self.positions.append(int(input_pos))
        return self.model(token, cache=self.cache, start_pos=int(input_pos), check=False)[:, -1]


def test_compiled_step_seconds_walks_positions_after_the_prompt(tiny):
    fast = CountingGenerator(tiny, max_seq_len=32)
    assert compiled_step_seconds(fast, n_steps=4, context=8, warmup=1) > 0
    assert fast.positions == [8, 9, 10, 11, 12]  # one warm-up step, then four, each one position later
