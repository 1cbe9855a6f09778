"""Checks for chapter 03's exercises (the causal mask). Worked solutions:
notebooks/solutions/03_causal_mask_solutions.ipynb. Each check prints one line and returns nothing."""
from __future__ import annotations

import math

import torch

from ...model import causal_mask
from . import FROM_NOTEBOOK, exercise


def check_1(visible_pairs=FROM_NOTEBOOK) -> None:
    """`visible_pairs(T)`: the number of (query, key) pairs a causal mask leaves visible."""
    exercise("03.1", visible_pairs,
             lambda f: all(int(f(n)) == int(causal_mask(n, n).sum()) for n in range(1, 50)),
             hint="count the visible entries of row i, then add the rows up (a function of T)", name="visible_pairs")


def check_2(sw=FROM_NOTEBOOK) -> None:
    """A (6, 6) float sliding-window mask, window 3: 0 where a query may look, -inf elsewhere."""
    def right(m):
        m = torch.as_tensor(m)
        assert m.shape == (6, 6), f"expected shape (6, 6), got {tuple(m.shape)}"
        only_0_or_neg_inf = bool(((m == 0) | (m == float("-inf"))).all())
        return only_0_or_neg_inf and torch.equal(m == 0, causal_mask(6, 6, window=3))
    exercise("03.2", sw, right, hint="query i sees keys j with j <= i and j > i - window", name="sw")


def check_3(row2=FROM_NOTEBOOK) -> None:
    """The masked softmax of the scores [0.5, 0.3, 0.1, 0.1] as query 2's row."""
    e = [math.exp(0.5), math.exp(0.3), math.exp(0.1)]
    expected = torch.tensor([e[0] / sum(e), e[1] / sum(e), e[2] / sum(e), 0.0])
    exercise("03.3", row2, lambda r: torch.allclose(torch.as_tensor(r, dtype=torch.float32), expected, atol=1e-6),
             hint="four numbers: the softmax over the keys query 2 may see, and 0 for the rest", name="row2")
