"""Exercise checks for chapter 12 (speculative decoding). Worked solutions:
notebooks/solutions/12_speculative_decoding_solutions.ipynb."""
from __future__ import annotations

from . import FROM_NOTEBOOK, exercise

# the toy tables of the chapter's section 3
P_TARGET_TOY = (0.40, 0.10, 0.25, 0.20, 0.05)
P_DRAFT_TOY = (0.60, 0.25, 0.05, 0.10, 0.00)


def _predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """E / (gamma c + 1): expected tokens per target pass over the cost of a round, verification free."""
    return (1 - alpha ** (gamma + 1)) / (1 - alpha) / (gamma * c + 1)


def check_1(answer=FROM_NOTEBOOK):
    """(tokens committed when the 3rd of 5 proposals is rejected, tokens committed when all 5 are accepted)."""
    exercise("12.1", answer, lambda a: tuple(a) == (3, 6),
                    hint="count the accepted prefix, then the one token the target adds", name="answer_round")


def check_2(answer=FROM_NOTEBOOK):
    """The chance that one proposal of the toy tables is accepted."""
    alpha = sum(min(t, d) for t, d in zip(P_TARGET_TOY, P_DRAFT_TOY))
    exercise("12.2", answer, lambda a: abs(float(a) - alpha) < 1e-9,
                    hint="a number between 0 and 1, summed over the five tokens", name="answer_alpha")


def check_3(answer=FROM_NOTEBOOK):
    """(best gamma in 1..16, its predicted speedup) for alpha 0.6 and a draft step costing 0.1 target steps."""
    speedups = {g: _predicted_speedup(0.6, g, 0.1) for g in range(1, 17)}
    best = max(speedups, key=speedups.get)

    def is_right(a):
        gamma, speedup = a
        assert int(gamma) == gamma and 1 <= gamma <= 16, "gamma is a whole number from 1 to 16"
        return gamma == best and abs(float(speedup) - speedups[best]) < 1e-3

    exercise("12.3", answer, is_right, hint="evaluate E / (gamma c + 1) for every gamma and take the largest",
             name="answer_best")
