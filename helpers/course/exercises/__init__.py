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
lines would show the answer). A chapter module defines each `check_N` with `exercise`:

    def check_1(answer=FROM_NOTEBOOK):
        return exercise("05.1", answer, lambda a: a == kv_cache_bytes(MISTRAL, 1, dtype=torch.bfloat16),
                        hint="...", name="mistral")

Left out: partial credit; a wrong answer says what was expected only in kind (type, shape), never the value.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

__all__ = ["FROM_NOTEBOOK", "NOT_ATTEMPTED", "ExerciseNotRight", "exercise", "notebook_answer"]

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


def exercise(label: str, answer: Any, is_right: Callable[[Any], Any], hint: str = "",
             name: str | tuple[str, ...] = "", stub: Callable[[Any], bool] | None = None) -> None:
    """Check one answer. `is_right(answer)` returns a truthy value for a right answer (it may also raise
    AssertionError with its own message). answer=FROM_NOTEBOOK reads it from the notebook variable(s) `name`.
    stub(answer): True while the answer is still the exercise cell's placeholder in another form than `...`
    (a function whose body is still `return ...`). Prints one line when right, not attempted or not run yet
    (and returns None, so a check cell shows only that line); a wrong answer raises ExerciseNotRight with
    `hint`."""
    if answer is FROM_NOTEBOOK:
        if not name:
            raise ValueError(f"exercise {label}: no answer given and no name to read it from")
        answer, missing = notebook_answer(name)
        if missing:
            print(f"Exercise {label}: run the answer cell above first (it defines {', '.join(missing)})")
            return None
    if (answer is NOT_ATTEMPTED or (isinstance(answer, tuple) and any(a is NOT_ATTEMPTED for a in answer))
            or (stub is not None and stub(answer))):
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
