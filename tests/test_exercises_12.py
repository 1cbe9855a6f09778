"""Chapter 12's exercise checks: the worked answers pass, typical wrong answers fail with one line.
(The solutions notebook runs every check on its worked answer under nbval; the prediction checked by a
measurement, 12.3, is exercised here on random-weight models, whose greedy rounds take milliseconds.)"""

from __future__ import annotations

import pytest
from conftest import random_model

from helpers import ModelConfig
from helpers import speculative as spec
from helpers.course.exercises import ExerciseNotRight, ch12


def lookup_rule(p_target, x):
    """The worked answer to 12.1."""
    residual = p_target.clone()
    residual[x] = 0.0
    return p_target[x], residual / residual.sum()


def lookup_rule_unnormalised(p_target, x):
    """Wrong: the residual is max(0, p_target - one_hot) without the normalisation."""
    residual = p_target.clone()
    residual[x] = 0.0
    return p_target[x], residual


def lookup_rule_always(p_target, x):
    """Wrong: treats the one-hot draft like a draft that proposes x with probability p_target(x)."""
    return 1.0, p_target.clone()


def test_12_1_lookup_rule(capsys):
    ch12.check_1(lookup_rule)
    assert "correct" in capsys.readouterr().out
    with pytest.raises(ExerciseNotRight, match="summing to 1"):
        ch12.check_1(lookup_rule_unnormalised)
    with pytest.raises(ExerciseNotRight, match="accept_probability"):
        ch12.check_1(lookup_rule_always)
    with pytest.raises(ExerciseNotRight, match="tuple"):
        ch12.check_1(lambda p, x: p)


def test_12_2_alpha_needed(capsys):
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if spec.expected_tokens_per_target_call(mid, 4) < 3 else (lo, mid)
    ch12.check_2(lo)
    ch12.check_2(round(lo, 3))  # three decimals are enough
    assert capsys.readouterr().out.count("correct") == 2
    with pytest.raises(ExerciseNotRight, match="not 3"):
        ch12.check_2(2 / 3)  # 1 - 1/E: the alpha whose 1/(1 - alpha) ceiling is 3, not E at gamma 4
    with pytest.raises(ExerciseNotRight, match="between 0 and 1"):
        ch12.check_2(3.0)


def test_12_4_best_gamma(capsys):
    def predicted(g):
        return spec.expected_tokens_per_target_call(0.8, g) / (0.1 * g + 1 + 0.1 * g)

    best = max(range(1, 17), key=predicted)
    ch12.check_4((best, predicted(best)))
    assert "correct" in capsys.readouterr().out
    free = max(range(1, 17), key=lambda g: spec.expected_tokens_per_target_call(0.8, g) / (0.1 * g + 1))
    assert free != best  # the exercise's verify cost changes the answer
    with pytest.raises(ExerciseNotRight):
        ch12.check_4((free, predicted(free)))  # free verification's optimum, priced right: still the wrong gamma
    with pytest.raises(ExerciseNotRight, match="whole number"):
        ch12.check_4((0, 1.0))


def test_12_3_prediction_measures_tokens_per_pass(capsys):
    cfg = ModelConfig.from_preset("tiny")
    target, draft = random_model(cfg, seed=0), random_model(cfg, seed=1)
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    stats = [spec.speculative_generate(target, draft, p, 12, gamma=8)[1] for p in prompts]
    measured = sum(s.new_tokens for s in stats) / sum(s.target_calls for s in stats)
    ch12.check_3(target, draft, prompts, 12, measured)
    out = capsys.readouterr().out
    assert "correct" in out and f"measured {measured:,.4g}" in out
    with pytest.raises(ExerciseNotRight, match="this run measured"):
        ch12.check_3(target, draft, prompts, 12, 9.0 if measured < 6 else 1.0)


def test_wrong_answers_print_one_line():
    try:
        ch12.check_2(0.5)
    except ExerciseNotRight as e:
        assert len(e._render_traceback_()) == 1 and "\n" not in str(e)
    else:
        raise AssertionError("a wrong answer must raise ExerciseNotRight")


def test_12_3_notebook_placeholder_measures_nothing(capsys):
    ch12.check_3(None, None, [], 0, ...)  # still `...`: no measurement runs, so no model is needed
    assert "not attempted yet" in capsys.readouterr().out
    with pytest.raises(ExerciseNotRight, match="> 0"):
        ch12.check_3(None, None, [], 0, -1.0)
