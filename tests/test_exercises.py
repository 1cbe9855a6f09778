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


def test_chapter_08_checks_accept_the_worked_answers_and_refuse_wrong_ones(capsys):
    import math

    from helpers.course.exercises import ch08

    def window_tiles(T, block, W):  # the worked solution
        n = math.ceil(T / block)
        return {(i, j) for i in range(n) for j in range(n)
                if j * block <= min(T, (i + 1) * block) - 1 and (j + 1) * block - 1 >= i * block - W + 1}

    ch08.check_2(window_tiles)
    ch08.check_3(300, measure=lambda: 320 * 1024)
    assert capsys.readouterr().out.count("correct") == 2
    causal_only = lambda T, block, W: {(i, j) for i in range(math.ceil(T / block)) for j in range(i + 1)}
    with pytest.raises(ExerciseNotRight, match="are needed"):
        ch08.check_2(causal_only)
    with pytest.raises(ExerciseNotRight, match="measured peak is 320 KiB"):
        ch08.check_3(1000, measure=lambda: 320 * 1024)
    ch08.check_3(..., measure=lambda: 1 / 0)  # not attempted: nothing is measured
    assert "not attempted" in capsys.readouterr().out
