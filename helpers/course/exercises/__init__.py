"""Exercise checks: one module per chapter (`ch05.py` holds chapter 05's), kept out of the notebooks so a
chapter never shows its own answers. Worked solutions are in `notebooks/solutions/`.

In a chapter, an exercise is a cell the learner fills in, followed by a check cell:

    mistral = ...        # exercise cell: replace the ... with your answer

    from helpers.course.exercises import ch05
    ch05.check_1()       # checks `mistral`; prints "not attempted yet" while it is still ...

A check reads its answer by name from the notebook's namespace (`__main__`, where a notebook's cells run),
so a check run before its exercise cell says "run the answer cell above first" instead of failing with a
NameError; a test passes the answer itself (`ch05.check_1(value)`). A wrong answer raises ExerciseNotRight,
which a notebook shows as its one-line message, without a traceback through the checker's source (whose
lines would show the answer). A chapter module defines each `check_N` with `exercise` (and `on_every` where an
answer is tried on several cases):

    def check_1(answer=FROM_NOTEBOOK):
        return exercise("05.1", answer, lambda a: a == kv_cache_bytes(MISTRAL, 1, dtype=torch.bfloat16),
                        hint="...", name="mistral")

Left out: partial credit; a wrong answer says what was expected only in kind (type, shape), never the value.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

__all__ = [
    "FROM_NOTEBOOK",
    "NOT_ATTEMPTED",
    "ExerciseNotRight",
    "exercise",
    "notebook_answer",
    "on_every",
    "prediction",
]

NOT_ATTEMPTED = ...  # the placeholder an exercise cell starts with


class _FromNotebook:
    def __repr__(self) -> str:
        return "FROM_NOTEBOOK"


FROM_NOTEBOOK = _FromNotebook()  # a check's default answer: read it from the notebook by name


class ExerciseNotRight(AssertionError):
    """The learner's answer was checked and is wrong (an AssertionError, so nbval reports it as a failure)."""

    def _render_traceback_(self) -> list[str]:
        # IPython's hook for how an exception is shown: the message alone, no traceback through the checker
        return [str(self)]


def notebook_answer(name: str | tuple[str, ...], namespace: dict | None = None):
    """The value of `name` in the notebook (a tuple of values for a tuple of names), or None and the names
    not defined yet. namespace: where to look (default: `__main__`'s globals, a notebook's namespace)."""
    names = (name,) if isinstance(name, str) else tuple(name)
    namespace = vars(sys.modules["__main__"]) if namespace is None else namespace
    missing = [n for n in names if n not in namespace]
    if missing:
        return None, missing
    values = tuple(namespace[n] for n in names)
    return (values[0] if len(values) == 1 else values), []


def on_every(cases, check: Callable[[Any, Any], None]) -> Callable[[Any], bool]:
    """An `is_right` for `exercise` that tries the answer on several cases: it calls check(answer, case) for
    each case, in order, and is right when none raises (check's AssertionError says what went wrong)."""

    def is_right(answer) -> bool:
        for case in cases:
            check(answer, case)
        return True

    return is_right


def exercise(
    label: str,
    answer: Any,
    is_right: Callable[[Any], Any],
    hint: str = "",
    name: str | tuple[str, ...] = "",
    stub: Callable[[Any], bool] | None = None,
    notice: str | Callable[[Any], str] = "",
) -> None:
    """Check one answer. `is_right(answer)` returns a truthy value for a right answer (it may also raise
    AssertionError with its own message). answer=FROM_NOTEBOOK reads it from the notebook variable(s) `name`.
    stub(answer): True while the answer is still the exercise cell's placeholder in another form than `...`
    (a function whose body is still `return ...`). Prints one line when right, not attempted or not run yet
    (and returns None, so a check cell shows only that line), and after a right answer `notice`, what to see
    in it (a callable is called only then, with the answer); a wrong answer raises ExerciseNotRight
    with `hint`."""
    if answer is FROM_NOTEBOOK:
        if not name:
            raise ValueError(f"exercise {label}: no answer given and no name to read it from")
        answer, missing = notebook_answer(name)
        if missing:
            print(f"Exercise {label}: run the answer cell above first (it defines {', '.join(missing)})")
            return None
    if (
        answer is NOT_ATTEMPTED
        or (isinstance(answer, tuple) and any(a is NOT_ATTEMPTED for a in answer))
        or (stub is not None and stub(answer))
    ):
        print(f"Exercise {label}: not attempted yet (replace the ... in the cell above, then re-run this check)")
        return None
    try:
        ok = bool(is_right(answer))
        reason = ""
    except AssertionError as e:  # a check that explains itself
        ok, reason = False, str(e)
    except Exception as e:  # an answer of the wrong kind (a string where a number was asked, a bad shape)
        ok, reason = False, f"{type(e).__name__}: {e}"
    if not ok:
        message = f"Exercise {label}: not right yet"
        if reason:
            message += f": {reason}"
        if hint:
            message += f" (hint: {hint})"
        raise ExerciseNotRight(message)
    print(f"Exercise {label}: correct")
    said = notice(answer) if callable(notice) else notice
    if said:
        print(f"  notice: {said}")


def prediction(
    label: str,
    predicted: Any,
    measure: Callable[[], float],
    *,
    unit: str = "",
    name: str | tuple[str, ...] = "",
    rel_tol: float | None = None,
    ratio: float | None = None,
    distance: float | None = None,
    within: tuple[float, float] | None = None,
    hint: str = "",
    notice: str | Callable[[float], str] = "",
) -> None:
    """Check a prediction against a measurement. `measure()` runs only once a prediction is written (a guess
    still at `...`, or whose cell has not run, measures nothing). The guess is right within one tolerance:
    `rel_tol` (relative: |guess / measured - 1| <= rel_tol), `ratio` (within a factor of the measurement),
    `within=(low, high)` (low < measured / guess < high: for a bound a measurement may exceed far more than
    undershoot) or `distance` (absolute). Either way the learner sees the measured value: after a guess, the
    number is the lesson. `notice(measured)`: what to see in it, after a right guess. Choose a tolerance that a reasoned
    guess meets on any machine (a measured time moves with the CPU; a bits-per-byte only in its last digits)."""
    if sum(t is not None for t in (rel_tol, ratio, distance, within)) != 1:
        raise ValueError(f"prediction {label}: give exactly one of rel_tol, ratio, distance, within")
    unit = f" {unit.strip()}" if unit.strip() else ""
    measured: list[float] = []

    def is_right(guess) -> bool:
        guess = float(guess)
        assert guess > 0 or distance is not None, f"a prediction here is a number > 0{unit}; got {guess:,.4g}"
        measured.append(float(measure()))
        value = measured[0]
        if rel_tol is not None:
            close = value != 0 and abs(guess / value - 1) <= rel_tol
        elif ratio is not None:
            close = guess > 0 and value / ratio <= guess <= value * ratio
        elif within is not None:
            close = guess > 0 and within[0] < value / guess < within[1]
        else:
            close = abs(guess - value) <= distance
        off = f", {guess / value - 1:+.0%} off" if value else ""
        assert close, f"you predicted {guess:,.4g}{unit}; this run measured {value:,.4g}{unit}{off}"
        return True

    def what_to_notice(guess) -> str:
        said = notice(measured[0]) if callable(notice) else notice
        times = f" ({measured[0] / float(guess):.2f}x your prediction)" if float(guess) else ""
        return f"measured {measured[0]:,.4g}{unit}{times}" + (f"; {said}" if said else "")

    exercise(label, predicted, is_right, hint=hint, name=name, notice=what_to_notice)
