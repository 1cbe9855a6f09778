"""Chapter 13's exercise checks: each accepts the worked answer and refuses a plausible wrong one in one line."""

from __future__ import annotations

import pytest
import torch

from helpers.course.exercises import ExerciseNotRight, ch13


def merge(a, b):
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.maximum(m_a, m_b)
    scale_a, scale_b = torch.exp(m_a - m), torch.exp(m_b - m)
    return m, l_a * scale_a + l_b * scale_b, acc_a * scale_a + acc_b * scale_b


def test_worked_answers_pass(capsys):
    ch13.check_1(4)
    ch13.check_2(1 - 97 / 160)
    ch13.check_3(64)
    ch13.check_4(merge)
    ch13.check_5(1.0)  # a measurement: the same keys read in both cases, so about the same time
    assert capsys.readouterr().out.count("correct") == 5


@pytest.mark.parametrize(
    "check,wrong",
    [
        (ch13.check_1, 3),  # the last token counted as stored
        (ch13.check_2, 0.5),
        (ch13.check_3, 72),  # the partly shared 9th block counted
        (ch13.check_4, lambda a, b: (a[0], a[1] + b[1], a[2] + b[2])),  # parts added without rescaling
        (ch13.check_5, 4.0),  # as if the time followed each request's length
    ],
)
def test_wrong_answers_are_refused_in_one_line(check, wrong):
    with pytest.raises(ExerciseNotRight) as e:
        check(wrong)
    assert "\n" not in str(e.value)
