"""Exercise checks for chapter 10 (beam search and structured output). Worked solutions:
notebooks/solutions/10_beam_search_and_structured_output_solutions.ipynb."""

from __future__ import annotations

import itertools
import json

from ...regex_automaton import compile_regex
from . import FROM_NOTEBOOK, exercise, prediction

__all__ = ["check_1", "check_2", "check_3", "check_4"]

# exercise 1: finished hypotheses as (summed log-probability, generated length)
HYPOTHESES = {"A": (-3.0, 3), "B": (-4.4, 5), "C": (-8.1, 9)}


def _winner(length_penalty: float) -> str:
    return max(HYPOTHESES, key=lambda h: HYPOTHESES[h][0] / HYPOTHESES[h][1] ** length_penalty)


def check_1(answer=FROM_NOTEBOOK):
    """The winning hypothesis at length_penalty 0, 1 and 2, as a tuple of three names."""
    expected = tuple(_winner(lp) for lp in (0.0, 1.0, 2.0))

    def is_right(a):
        assert len(a) == 3, f"expected three names (one per length penalty), got {len(a)}"
        return tuple(str(x).strip().upper() for x in a) == expected

    return exercise(
        "10.1", answer, is_right, hint="score = log-probability / length ** length_penalty; higher wins", name="winners"
    )


def check_2(answer=FROM_NOTEBOOK):
    """(P(output is 'b') under constrained sampling, the true P('b' | output in {'ab', 'b'})) for the
    context-free model p(a) = 0.5, p(b) = 0.3, p(end) = 0.2."""
    p_a, p_b, p_end = 0.5, 0.3, 0.2
    constrained = p_b / (p_a + p_b)  # step 1 may be a or b; after 'b' only the end is allowed
    true = p_b * p_end / (p_a * p_b * p_end + p_b * p_end)

    def is_right(a):
        assert len(a) == 2, f"expected two probabilities (constrained, true), got {len(a)}"
        return abs(float(a[0]) - constrained) < 1e-3 and abs(float(a[1]) - true) < 1e-3

    return exercise(
        "10.2",
        answer,
        is_right,
        hint="the masked sampler renormalises one step at a time; the true conditional weighs whole outputs",
        name="masked_and_true",
    )


def _bool_arrays(lengths, sep=", "):
    return ["[" + sep.join(v) + "]" for n in lengths for v in itertools.product(["true", "false"], repeat=n)]


def check_3(answer=FROM_NOTEBOOK):
    """A regular expression for a JSON array of one to three booleans, written like [true, false]."""
    good = _bool_arrays([1, 2, 3])
    bad = ["[]", "true", "[True]", "[null]", "[true, ]", "[true,false]", "[ true]", "[1]"] + _bool_arrays([4])

    def is_right(a):
        dfa = compile_regex(a)
        missed = [s for s in good if not dfa.matches(s)]
        assert not missed, f"it rejects {missed[0]!r}"
        wrong = [s for s in bad if dfa.matches(s)]
        assert not wrong, f"it accepts {wrong[0]!r}"
        for s in good:
            assert isinstance(json.loads(s), list)
        return True

    hint = "a group for one boolean, then (, boolean) repeated 0 to 2 times"
    return exercise("10.3", answer, is_right, hint=hint, name="bool_array_pattern")


def check_4(predicted=FROM_NOTEBOOK, measure=None):
    """A prediction of the share of "a" among masked samples of `a|bbbb` when "a" 0.3, "b" 0.1, end 0.6 at every
    step; `measure()` samples it, and runs only once a prediction is given."""
    prediction(
        "10.4",
        predicted,
        measure,
        distance=0.05,
        name="predicted_share_of_a",
        hint="masked sampling decides at the first step, between the allowed tokens",
        notice=lambda share: (
            "the first token decides, renormalised over 'a' and 'b' alone (0.3 / 0.4); how "
            "unlikely the forced 'bbb' after it is never enters"
        ),
    )
