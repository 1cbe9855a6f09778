"""Exercise checks for chapter 09 (sampling). Worked solutions: notebooks/solutions/09_sampling_solutions.ipynb."""
from __future__ import annotations

import torch

from . import FROM_NOTEBOOK, exercise

SIX_LOGITS = (0.3, 0.8, 1.2, 0.5, 0.4, -0.1)  # the chapter's six-token example


def _logits():
    return torch.tensor(SIX_LOGITS, dtype=torch.float64)


def check_1(answer=FROM_NOTEBOOK):
    """The six-token example at T = 1 after top-k with k = 2: a length-6 tensor of probabilities."""
    from ...sampling import top_k_filter

    want = top_k_filter(_logits(), 2).softmax(-1)

    def is_right(a):
        a = torch.as_tensor(a, dtype=torch.float64)
        assert a.shape == (6,), f"a length-6 tensor, one probability per token; got shape {tuple(a.shape)}"
        return torch.allclose(a, want, atol=1e-6)

    exercise("09.1", answer, is_right, hint="keep the two largest, then divide by their sum", name="top2")


def check_2(answer=FROM_NOTEBOOK):
    """The temperature at which the third token (index 2) gets 50%."""
    exercise("09.2", answer, lambda t: 0 < float(t) and abs((_logits() / float(t)).softmax(-1)[2].item() - 0.5) < 1e-4,
             hint="its probability falls steadily as T rises, so bisection works", name="T_half")


def check_3(answer=FROM_NOTEBOOK):
    """(min_p_low, min_p_high): every min_p in (low, high] keeps the same five tokens as top-p 0.9 at T = 0.7."""
    ranked = (_logits() / 0.7).softmax(-1).sort(descending=True).values
    low, high = (ranked[5] / ranked[0]).item(), (ranked[4] / ranked[0]).item()

    def is_right(a):
        lo, hi = a
        return abs(float(lo) - low) < 1e-4 and abs(float(hi) - high) < 1e-4

    exercise("09.3", answer, is_right, hint="compare the 5th and 6th probabilities with the largest",
             name="min_p_range")
