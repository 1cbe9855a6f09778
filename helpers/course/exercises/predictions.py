"""Exercises that ask for a prediction and then measure: the check times the thing predicted, calls the
prediction right when the measurement lies within a stated factor of it, and then says what was measured.

    check_prediction("04.2", predicted_s, measure=lambda: seconds_of_the_generation(), within=(0.5, 2),
                     what="a time in seconds", hint="...", notice=lambda value, ratio: f"measured {value:.3f} s")

The measurement runs only for an attempted answer of the right kind, so an exercise left at `...` costs nothing.
Left out: repeating a measurement until it is steady (the tolerance absorbs a loaded machine instead)."""
from __future__ import annotations

from typing import Callable

from . import exercise


def check_prediction(label: str, predicted, measure: Callable[[], float], within: tuple[float, float], what: str,
                     hint: str, notice: Callable[[float, float], str]) -> None:
    """Right when measure() / predicted lies strictly inside `within`; then prints "notice: " + notice(measured,
    measured / predicted) on one line."""
    low, high = within
    measured = {}

    def right(p):
        assert float(p) > 0, f"{what}, > 0"
        measured["value"] = measure()
        ratio = measured["value"] / float(p)
        assert low < ratio < high, f"the measurement is {ratio:.2f}x your prediction"
        return True

    exercise(label, predicted, right, hint=hint)
    if "value" in measured:
        print("notice: " + notice(measured["value"], measured["value"] / float(predicted)))
