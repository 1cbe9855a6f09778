"""helpers.device's timers: what they call, in which order, and what they return."""
import time

import pytest
import torch

from helpers.device import median, time_call, time_interleaved


def test_time_interleaved_calls_in_turn():
    calls = []
    fns = [lambda name=name: calls.append(name) for name in "abc"]
    times = time_interleaved(fns, torch.device("cpu"), repeats=3, warmup=2)
    assert calls == list("abc") * 5  # two warm-up turns, then three timed turns, never two of one in a row
    assert [len(t) for t in times] == [3, 3, 3]
    assert all(s >= 0 for t in times for s in t)


def test_time_interleaved_ratio_follows_the_work():
    short, long = (lambda: time.sleep(0.001)), (lambda: time.sleep(0.03))
    t_short, t_long = time_interleaved([short, long], torch.device("cpu"), repeats=5)
    # sleep never returns early: every timing of the long call is at least its 30 ms
    assert min(t_long) >= 0.03 and median(t_long) / median(t_short) > 2


def test_time_call_counts_repeats_not_warmup():
    calls = []
    times = time_call(lambda: calls.append(1), torch.device("cpu"), repeats=4, warmup=3)
    assert len(calls) == 7 and len(times) == 4


def test_time_interleaved_block_rewarms_then_averages():
    calls = []
    fns = [lambda name=name: calls.append(name) for name in "ab"]
    times = time_interleaved(fns, torch.device("cpu"), repeats=2, warmup=0, block=3)
    assert calls == list("aaaabbbb") * 2  # each turn: one untimed call, then three timed
    assert [len(t) for t in times] == [2, 2]
    with pytest.raises(ValueError, match="block"):
        time_interleaved(fns, torch.device("cpu"), block=0)
