"""The exercise check: not attempted, right, wrong, and an answer of the wrong kind."""
import pytest

from helpers.course.exercises import ExerciseNotRight, exercise


def test_not_attempted_prints_and_does_not_fail(capsys):
    assert exercise("0.1", ..., lambda a: a == 3) is None
    assert "not attempted yet" in capsys.readouterr().out
    exercise("0.2", (1, ...), lambda a: 1 / 0)  # never called


def test_right_answer(capsys):
    exercise("0.1", 3, lambda a: a == 3)
    assert "correct" in capsys.readouterr().out


def test_wrong_answer_raises_with_hint():
    with pytest.raises(ExerciseNotRight, match="not right yet.*hint: count both K and V"):
        exercise("0.1", 4, lambda a: a == 3, hint="count both K and V")


def test_wrong_kind_of_answer_is_a_clear_failure():
    with pytest.raises(ExerciseNotRight, match="TypeError"):
        exercise("0.1", "three", lambda a: a + 1 == 4)
