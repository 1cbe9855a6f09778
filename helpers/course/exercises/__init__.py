"""Exercise checks: one module per chapter (`ch05.py` holds chapter 05's), kept out of the notebooks so a
chapter never shows its own answers. Worked solutions are in `notebooks/solutions/`.

In a chapter, an exercise is a cell the learner fills in, followed by a check cell:

    mistral_per_token = ...        # exercise cell: replace the ... with your answer

    from helpers.course.exercises import ch05
    ch05.check_1(mistral_per_token)  # prints "not attempted yet" while the answer is still ...

A chapter module defines each `check_N` with `exercise`:

    def check_1(answer):
        return exercise("05.1", answer, lambda a: a == kv_cache_bytes(MISTRAL, 1, dtype=torch.bfloat16))

Left out: hints and partial credit; a wrong answer says what was expected only in kind (type, shape),
never the value.
"""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["NOT_ATTEMPTED", "ExerciseNotRight", "exercise"]

NOT_ATTEMPTED = ...  # the placeholder an exercise cell starts with


class ExerciseNotRight(AssertionError):
    """The learner's answer was checked and is wrong (an AssertionError, so nbval reports it as a failure)."""


def exercise(label: str, answer: Any, is_right: Callable[[Any], Any], hint: str = "",
             notice: str | Callable[[], str] = "") -> None:
    """Check one answer. `is_right(answer)` returns a truthy value for a right answer (it may also raise
    AssertionError with its own message). Prints one line when right or not attempted (and returns None,
    so a check cell shows only that line), and after a right answer `notice`, what to see in it (a callable
    is called only then, so it may use the answer); a wrong answer raises ExerciseNotRight with `hint`."""
    if answer is NOT_ATTEMPTED or (isinstance(answer, tuple) and any(a is NOT_ATTEMPTED for a in answer)):
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
    said = notice() if callable(notice) else notice
    if said:
        print(f"  {said}")
