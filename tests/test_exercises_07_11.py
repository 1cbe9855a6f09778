"""Chapters 07 and 11's exercise checks: the worked answers pass, typical wrong answers fail with one line.
(The solutions notebooks run every check on its worked answer under nbval; the predictions checked by a
measurement, 07.2 and 11.4, are exercised here with the measurement replaced, and for real there.)"""

from __future__ import annotations

import math

import pytest
import torch

from helpers.course.exercises import ExerciseNotRight, ch07, ch11
from helpers.measure.flops import forward_bytes
from helpers.model import ModelConfig
from helpers.nf4 import normal_float_codebook


def test_07_1_draft_calls(capsys):
    right = ch07.draft_step_calls()
    assert 50 < right < 200  # one layer's calls plus the embedding, norm and head: fewer than the target's 334
    ch07.check_1(right)
    assert "correct" in capsys.readouterr().out
    with pytest.raises(ExerciseNotRight):
        ch07.check_1(334)  # the target's count
    with pytest.raises(ExerciseNotRight, match="whole number"):
        ch07.check_1(float(right))


def test_07_2_prediction_within_15_percent(monkeypatch, capsys):
    monkeypatch.setattr(ch07, "prediction", _fixed_measurement(ch07.prediction, 231.0))
    ch07.check_2("cpu", 237)  # the draft's calls times the target's operators per call
    out = capsys.readouterr().out
    assert "correct" in out and "measured 231 operators" in out
    with pytest.raises(ExerciseNotRight, match="you predicted 1,146"):
        ch07.check_2("cpu", 1146)  # the target's count
    with pytest.raises(ExerciseNotRight, match="you predicted 191"):
        ch07.check_2("cpu", 191)  # a sixth of the target's: forgets the embedding, final norm and head


def test_07_2_counts_the_draft_operators():
    ops = ch07.draft_step_operators("cpu")
    assert 2 * ch07.draft_step_calls() < ops < 1146  # each call dispatches several operators; fewer than the target


def test_07_3_read_roof(capsys):
    cfg = ModelConfig.from_preset("bench-150m")
    right = forward_bytes(cfg, 1, n_past=16, bytes_per_weight=2, bytes_per_kv=2) / 20e9 * 1e3
    ch07.check_3(right)
    assert "correct" in capsys.readouterr().out
    with pytest.raises(ExerciseNotRight):
        ch07.check_3(2 * right)  # float32 weights
    with pytest.raises(ExerciseNotRight):
        ch07.check_3(right / 1e3)  # seconds, not milliseconds


def test_07_4_bf16_spacing(capsys):
    ch07.check_4((2.0, 2.0**-8))
    assert "correct" in capsys.readouterr().out
    with pytest.raises(ExerciseNotRight, match="gap"):
        ch07.check_4((2.0**-7, 2.0**-8))  # the gap at 1.0, not at 256
    with pytest.raises(ExerciseNotRight, match="relative"):
        ch07.check_4((2.0, 2.0**-7))  # the spacing, not the rounding error (the review's T10)


def test_11_1_and_11_2(capsys):
    ch11.check_1((4 + 32 / 128, 8 + 16 / 4096))
    q = [round(w / (1.234 / 7)) for w in ch11.FOUR_WEIGHTS]
    largest = max(abs(c * 1.234 / 7 - w) for c, w in zip(q, ch11.FOUR_WEIGHTS))
    ch11.check_2((q, largest))
    assert capsys.readouterr().out.count("correct") == 2
    with pytest.raises(ExerciseNotRight):
        ch11.check_1((4.0, 8.0))  # the codes alone
    with pytest.raises(ExerciseNotRight):
        ch11.check_2(([2, -7, 10, -5], largest))  # step = max|w| / 8


def test_11_3_nf3(capsys):
    ch11.check_3(normal_float_codebook(3).tolist())
    assert "correct" in capsys.readouterr().out
    uniform = torch.linspace(-1, 1, 8)  # no exact zero
    with pytest.raises(ExerciseNotRight, match="exact 0"):
        ch11.check_3(uniform)
    with pytest.raises(ExerciseNotRight, match="8 levels"):
        ch11.check_3(normal_float_codebook(4))
    wrong_offset = normal_float_codebook(3) * 0.99
    wrong_offset[0], wrong_offset[-1] = -1.0, 1.0
    with pytest.raises(ExerciseNotRight, match="off"):
        ch11.check_3(wrong_offset)


def test_11_4_prediction(monkeypatch, capsys):
    monkeypatch.setattr(ch11, "prediction", _fixed_measurement(ch11.prediction, 0.03))
    ch11.check_4(None, None, "cpu", 0.025)
    assert "correct" in capsys.readouterr().out
    with pytest.raises(ExerciseNotRight):
        ch11.check_4(None, None, "cpu", 0.005)  # the 4-bit rise


def test_11_5_prefill_ridge(capsys):
    ridge = 989.4e12 / 3.35e12
    t_int4 = math.floor(ridge * 4.5 / 8 / 2) + 1
    ch11.check_5((t_int4, math.floor(2 * ridge * 1.0 / 2) + 1))
    assert "correct" in capsys.readouterr().out
    assert t_int4 == 84
    with pytest.raises(ExerciseNotRight, match="FP8"):
        ch11.check_5((t_int4, t_int4))
    with pytest.raises(ExerciseNotRight, match="int4"):
        ch11.check_5((2, 296))  # the old exercise's CPU answer


def test_11_4_measures_nf3_on_the_course_model():
    from helpers import load_model

    model, tok = load_model("target", dtype=torch.float32)
    rise = ch11.nf3_bits_per_byte_rise(model, tok)
    assert 0.005 < rise < 0.2  # 3 bits cost something, far less than 2 bits' uniform rounding


def _fixed_measurement(prediction, value):
    """prediction() with its measurement replaced by a constant (the real one times a model on this machine)."""

    def wrapped(label, predicted, measure, **kw):
        return prediction(label, predicted, lambda: value, **kw)

    return wrapped
