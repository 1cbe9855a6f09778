"""Chapter 14's exercise checks: the worked answers pass, typical wrong answers fail with one line. (The solutions
notebook runs every check on its worked answer under nbval; exercise 4's real measurement, a load test against a
server, runs there only.)"""

from __future__ import annotations

import pytest

from helpers.checkpoint import load_tokenizer
from helpers.course.exercises import ExerciseNotRight, ch14
from helpers.serving.chat_template import LLAMA3_TEMPLATE

LLAMA3_NO_TRIM = LLAMA3_TEMPLATE.replace(" | trim", "")
LLAMA3_ONE_NEWLINE = LLAMA3_TEMPLATE.replace("<|end_header_id|>\n\n", "<|end_header_id|>\n")


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message
    return message


def test_14_1_llama3_template(capsys):
    ch14.check_1(LLAMA3_TEMPLATE)
    assert "correct" in capsys.readouterr().out
    for wrong in (LLAMA3_NO_TRIM, LLAMA3_ONE_NEWLINE, "<|begin_of_text|>"):
        with pytest.raises(ExerciseNotRight, match="differs from character") as e:
            ch14.check_1(wrong)
        one_line(e)
    with pytest.raises(ExerciseNotRight, match="as a str"):
        ch14.check_1(["not", "a", "template"])


def test_14_2_overhead_of_markers_as_text(capsys):
    tok = load_tokenizer()
    right = ch14.chat_overhead(tok, 40, {})
    special = ch14.chat_overhead(tok, 40, None)
    per_exchange = ch14.chat_overhead(tok, 2, {}) - ch14.chat_overhead(tok, 1, {})
    assert right == ch14.chat_overhead(tok, 1, {}) + 39 * per_exchange
    assert right > 2 * special
    ch14.check_2(right)
    assert "correct" in capsys.readouterr().out
    for wrong in (special, right + 1, 40 * per_exchange):
        with pytest.raises(ExerciseNotRight) as e:
            ch14.check_2(wrong)
        one_line(e)
    with pytest.raises(ExerciseNotRight, match="an int"):
        ch14.check_2(float(right))


def test_14_3_littles_law(capsys):
    ch14.check_3(lambda C, X: C / X)
    assert "correct" in capsys.readouterr().out
    with pytest.raises(ExerciseNotRight):
        ch14.check_3(lambda C, X: X / C)
    ch14.check_3(lambda C, X: ...)  # the exercise cell as given
    assert "not attempted" in capsys.readouterr().out


def test_14_4_prediction_against_a_measurement(capsys):
    ch14.check_4(measure=lambda: 250.0, answer=300.0)
    out = capsys.readouterr().out
    assert "correct" in out and "measured 250 tokens/s" in out and "32.0 ms per token" in out
    with pytest.raises(ExerciseNotRight, match="this run measured 250 tokens/s") as e:
        ch14.check_4(measure=lambda: 250.0, answer=1000.0)
    one_line(e)
