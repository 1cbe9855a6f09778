"""The exercise check: not attempted, not run yet, right, wrong, and an answer of the wrong kind; and how a
wrong answer looks in a notebook (one line, still an error)."""

import sys

import nbformat
import pytest
from nbclient import NotebookClient

from helpers.course.exercises import FROM_NOTEBOOK, ExerciseNotRight, exercise
from helpers.paths import REPO


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


def test_answer_read_by_name_from_the_notebook(monkeypatch, capsys):
    main = sys.modules["__main__"]  # a notebook's cells run in __main__
    exercise("0.1", FROM_NOTEBOOK, lambda a: a == 3, name="house_answer")
    assert "run the answer cell above first (it defines house_answer)" in capsys.readouterr().out
    monkeypatch.setattr(main, "house_answer", 3, raising=False)
    exercise("0.1", FROM_NOTEBOOK, lambda a: a == 3, name="house_answer")
    assert "correct" in capsys.readouterr().out
    monkeypatch.setattr(main, "house_tiles", 136, raising=False)
    exercise("0.2", FROM_NOTEBOOK, lambda a: a == (136, 0.53), name=("house_tiles", "house_share"))
    assert "(it defines house_share)" in capsys.readouterr().out  # names only what is missing
    monkeypatch.setattr(main, "house_share", ..., raising=False)
    exercise("0.2", FROM_NOTEBOOK, lambda a: a == (136, 0.53), name=("house_tiles", "house_share"))
    assert "not attempted yet" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no name"):
        exercise("0.3", FROM_NOTEBOOK, lambda a: True)


def test_a_stub_function_is_not_attempted_yet(monkeypatch, capsys):
    def per_client_itl(C, X):
        return ...

    monkeypatch.setattr(sys.modules["__main__"], "per_client_itl", per_client_itl, raising=False)
    from helpers.course.exercises import ch14

    ch14.check_3()
    assert "not attempted yet" in capsys.readouterr().out
    with pytest.raises(ExerciseNotRight):
        ch14.check_3(lambda C, X: X / C)


def test_in_a_notebook_a_wrong_answer_is_one_line_and_still_an_error():
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("from helpers.course.exercises import ch13\nblocks_held = 5"),
            nbformat.v4.new_code_cell("ch13.check_1()", metadata={"tags": ["raises-exception"]}),
            nbformat.v4.new_code_cell("ch13.check_2()"),
        ]
    )
    NotebookClient(
        nb, timeout=120, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(REPO)}}
    ).execute()
    [error] = nb.cells[1].outputs
    assert error.output_type == "error" and error.ename == "ExerciseNotRight"  # nbval still sees the error
    assert error.evalue.startswith("Exercise 13.1: not right yet") and "hint:" in error.evalue
    assert error.traceback == [error.evalue]  # the message alone: no frames, no checker source
    [line] = nb.cells[2].outputs
    assert line.text == "Exercise 13.2: run the answer cell above first (it defines wasted_share)\n"


def test_chapter_08_checks_accept_the_worked_answers_and_refuse_wrong_ones(capsys):
    import math

    from helpers.course.exercises import ch08

    def window_tiles(T, block, W):  # the worked solution
        n = math.ceil(T / block)
        return {
            (i, j)
            for i in range(n)
            for j in range(n)
            if j * block <= min(T, (i + 1) * block) - 1 and (j + 1) * block - 1 >= i * block - W + 1
        }

    ch08.check_2(window_tiles)
    ch08.check_3(300, measure=lambda: 320 * 1024)
    assert capsys.readouterr().out.count("correct") == 2
    causal_only = lambda T, block, W: {(i, j) for i in range(math.ceil(T / block)) for j in range(i + 1)}
    with pytest.raises(ExerciseNotRight, match="are needed"):
        ch08.check_2(causal_only)
    with pytest.raises(ExerciseNotRight, match="this run measured 320 KiB"):
        ch08.check_3(1000, measure=lambda: 320 * 1024)
    ch08.check_3(..., measure=lambda: 1 / 0)  # not attempted: nothing is measured
    assert "not attempted" in capsys.readouterr().out


def test_prediction_checks_measure_only_once_predicted_and_say_how_far_off(capsys):
    from helpers.course.exercises import ch09, ch10, ch15

    # (check, a close prediction, a far one, what the measurement returns: tokens, a share, seconds)
    for check, good, bad, value in [
        (ch09.check_4, 100, 1000, 60),
        (ch10.check_4, 0.74, 0.99, 0.75),
        (ch15.check_5, 40.0, 400.0, 0.05),
    ]:
        check(..., measure=lambda: 1 / 0)  # not attempted: nothing is measured
        check(good, measure=lambda v=value: v)
        with pytest.raises(ExerciseNotRight, match="you predicted"):
            check(bad, measure=lambda v=value: v)
    out = capsys.readouterr().out
    assert out.count("not attempted") == 3 and out.count("correct") == 3


def test_chapter_15_mlp_partial_check():
    import torch.nn.functional as F

    from helpers.course.exercises import ch15

    def mlp_partial(x, mlp, rank, tp):
        d_ff = mlp.w_down.weight.shape[1]
        gate, up = mlp.w_gate_up.weight.split(d_ff)
        units = slice(rank * d_ff // tp, (rank + 1) * d_ff // tp)
        return (F.silu(x @ gate[units].T) * (x @ up[units].T)) @ mlp.w_down.weight[:, units].T

    ch15.check_4(mlp_partial)
    with pytest.raises(ExerciseNotRight, match="rank 0's partial"):
        ch15.check_4(lambda x, mlp, rank, tp: mlp(x) / tp)  # sums right, but no rank owns its units
