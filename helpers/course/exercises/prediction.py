"""Prediction exercises: the learner writes down a number first, then the check measures it and says how close.

    predicted_english_bpb = 2.0       # the exercise cell: a guess, written before measuring
    ch00.check_2(model, tok)          # reads the guess by name, measures, then: how close, and what to notice

A chapter module builds such a check with `check_prediction`, giving it a function that measures the real
value on this machine. A prediction counts as right when it lies within `rel_tol` of the measurement
(relative): a band wide enough that a reasoned guess passes on any machine, where the measured value moves
only in its last digits. A wrong guess is told the measurement, because after a guess seeing the number is
the lesson.

Left out: partial credit, and exercises whose measured value depends on the machine's speed (a timing is
a prediction the checker could not hold to one band on every machine).
"""
from __future__ import annotations

from typing import Callable

from . import FROM_NOTEBOOK, NOT_ATTEMPTED, exercise, notebook_answer

__all__ = ["check_prediction"]


def check_prediction(label: str, predicted, measure: Callable[[], float], *, unit: str, name: str,
                     rel_tol: float = 0.25, notice: str | Callable[[float], str] = "") -> None:
    """Measure, then compare `predicted` (FROM_NOTEBOOK: the notebook variable `name`) with the measurement.
    Prints "correct" and one line with the measured value and `notice` (what to see in it) when the guess is
    within `rel_tol`; raises ExerciseNotRight with the measured value otherwise. A guess not written yet
    (still `...`, or its cell not run) is not measured."""
    if predicted is FROM_NOTEBOOK:
        predicted, missing = notebook_answer(name)
        if missing:
            exercise(label, FROM_NOTEBOOK, lambda a: True, name=name)  # prints "run the answer cell above first"
            return
    if predicted is NOT_ATTEMPTED:
        exercise(label, predicted, lambda a: True)  # prints "not attempted yet"
        return
    measured = float(measure())

    def is_right(guess) -> bool:
        guess = float(guess)
        off = guess / measured - 1
        assert abs(off) <= rel_tol, (f"you predicted {guess:.3g} {unit}; this run measured {measured:.3g} {unit}, "
                                     f"so your guess is {off:+.0%} off (within {rel_tol:.0%} counts)")
        return True

    def what_to_notice(_guess) -> str:
        said = notice(measured) if callable(notice) else notice
        return (f"measured {measured:.3g} {unit}; you predicted {float(predicted):.3g} "
                f"({float(predicted) / measured - 1:+.0%}). {said}".rstrip())

    exercise(label, predicted, is_right, notice=what_to_notice)
