"""Checks for chapter 04's exercises (the autoregressive loop). Worked solutions:
notebooks/solutions/04_autoregressive_loop_solutions.ipynb. Each check prints one line and returns nothing."""
from __future__ import annotations

from ...stopping import RepetitionStop
from . import FROM_NOTEBOOK, exercise


def check_1(answer=FROM_NOTEBOOK) -> None:
    """(pairs_uncached, pairs_cached, pair_ratio) for 500 generated tokens, full score squares."""
    def right(a):
        uncached, cached, ratio = a
        n = 500
        return (int(uncached) == n * (n + 1) * (2 * n + 1) // 6 and int(cached) == n * (n + 1) // 2
                and abs(float(ratio) - (2 * n + 1) / 3) < 1e-9)
    exercise("04.1", answer, right, hint="three numbers: step k compares k queries with k keys without a cache, "
             "one query with k keys with one", name="pairs")


def check_2(identical_run_class=FROM_NOTEBOOK) -> None:
    """`IdenticalRun(n)`: a stop criterion that fires when the last n generated ids are identical."""
    cases = [[1, 2, 3], [5, 5, 5, 5], [1, 5, 5, 5], [2, 2, 2, 2, 3], [7] * 10, [1, 2] * 6]

    def right(cls):
        return all(bool(cls(n)(c)) == RepetitionStop(max_period=1, min_repeats=n)(c)
                   for n in (2, 3, 4) for c in cases)
    exercise("04.2", identical_run_class, right, hint="a class: IdenticalRun(n)(generated_ids) -> bool",
             name="IdenticalRun")


def check_3(dense_ratio_after_prompt=FROM_NOTEBOOK) -> None:
    """Dense work (in positions) without / with a cache, for 100 tokens after a 400-token prompt."""
    expected = sum(400 + k for k in range(100)) / (400 + 99)
    exercise("04.3", dense_ratio_after_prompt, lambda a: abs(float(a) - expected) < 1e-9,
             hint="without a cache step k processes 400 + k positions; with one, a prefill then one per step",
             name="dense_ratio_after_prompt")
