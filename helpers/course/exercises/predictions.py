"""Exercises that ask for a prediction and then measure: the check times the thing predicted, calls the
prediction right when the measurement lies within a stated factor of it, and then says what was measured.

    check_prediction("04.2", answer, measure=lambda: seconds_of_the_generation(), within=(0.5, 2),
                     what="a time in seconds", hint="...", notice=lambda value, ratio: f"measured {value:.3f} s",
                     name="predicted_s")      # answer=FROM_NOTEBOOK reads predicted_s from the notebook

The measurement runs only for an attempted answer of the right kind, so an exercise left at `...` costs nothing.
Left out: repeating a measurement until it is steady (the tolerance absorbs a loaded machine instead)."""
from __future__ import annotations

from typing import Callable

from . import FROM_NOTEBOOK, exercise, notebook_answer


def check_prediction(label: str, predicted, measure: Callable[[], float], within: tuple[float, float], what: str,
                     hint: str, notice: Callable[[float, float], str], name: str) -> None:
    """Right when measure() / predicted lies strictly inside `within`; then prints "notice: " + notice(measured,
    measured / predicted) on one line. predicted=FROM_NOTEBOOK reads the notebook variable `name`."""
    low, high = within
    measured = {}
    if predicted is FROM_NOTEBOOK:
        predicted, missing = notebook_answer(name)
        if missing:
            predicted = FROM_NOTEBOOK  # exercise() says which cell to run first

    def right(p):
        assert float(p) > 0, f"{what}, > 0"
        measured["value"] = measure()
        ratio = measured["value"] / float(p)
        assert low < ratio < high, f"the measurement is {ratio:.2f}x your prediction"
        return True

    exercise(label, predicted, right, hint=hint, name=name)
    if "value" in measured:
        print("notice: " + notice(measured["value"], measured["value"] / float(predicted)))
