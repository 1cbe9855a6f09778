"""Exercise checks for chapter 09 (sampling). Worked solutions: notebooks/solutions/09_sampling_solutions.ipynb."""

from __future__ import annotations

import torch

from . import FROM_NOTEBOOK, exercise, prediction

SIX_LOGITS = (0.3, 0.8, 1.2, 0.5, 0.4, -0.1)  # the chapter's six-token example


def _logits():
    return torch.tensor(SIX_LOGITS, dtype=torch.float64)


def check_1(top_k_probs=FROM_NOTEBOOK):
    """top_k_probs(logits, k): the probabilities after top-k and renormalising, on the six tokens and random logits."""
    from ...sampling import top_k_filter

    gen = torch.Generator().manual_seed(9)
    cases = [(_logits(), 2), (_logits(), 6), (torch.tensor([2.0, 1.0, 1.0, 0.0], dtype=torch.float64), 2)]
    cases += [(torch.randn(50, generator=gen, dtype=torch.float64), k) for k in (1, 5, 20)]

    def is_right(fn):
        assert callable(fn), "top_k_probs is a function of (logits, k)"
        for logits, k in cases:
            got = torch.as_tensor(fn(logits.clone(), k), dtype=torch.float64)
            assert got.shape == logits.shape, (
                f"one probability per token: shape {tuple(logits.shape)}, got {tuple(got.shape)}"
            )
            want = top_k_filter(logits, k).softmax(-1)
            assert torch.allclose(got, want, atol=1e-6), (
                f"k={k} on {len(logits)} logits: keeps {int((got > 0).sum())} tokens with sum {got.sum().item():.3f}; "
                f"should keep {int((want > 0).sum())} summing to 1"
                + (" (ties with the k-th are kept)" if k == 2 and len(logits) == 4 else "")
            )
        return True

    hint = "the k-th largest value is a threshold; then softmax what is left"
    notice = "top-k keeps the same number of tokens whatever the model's confidence; top-p and min-p adapt"
    exercise("09.1", top_k_probs, is_right, hint=hint, name="top_k_probs", notice=notice)


def check_2(answer=FROM_NOTEBOOK):
    """The temperature at which the third token (index 2) gets 50%."""
    exercise(
        "09.2",
        answer,
        lambda t: 0 < float(t) and abs((_logits() / float(t)).softmax(-1)[2].item() - 0.5) < 1e-4,
        hint="its probability falls steadily as T rises, so bisection works",
        name="T_half",
    )


def check_3(answer=FROM_NOTEBOOK):
    """(min_p_low, min_p_high): every min_p in (low, high] keeps the same five tokens as top-p 0.9 at T = 0.7."""
    ranked = (_logits() / 0.7).softmax(-1).sort(descending=True).values
    low, high = (ranked[5] / ranked[0]).item(), (ranked[4] / ranked[0]).item()

    def is_right(a):
        lo, hi = a
        return abs(float(lo) - low) < 1e-4 and abs(float(hi) - high) < 1e-4

    exercise(
        "09.3", answer, is_right, hint="compare the 5th and 6th probabilities with the largest", name="min_p_range"
    )


def check_4(predicted=FROM_NOTEBOOK, measure=None):
    """A prediction of the top-p 0.9 nucleus size after the chapter's prompt at T = 1.2; `measure()` computes it,
    and runs only once a prediction is given."""
    prediction(
        "09.4",
        predicted,
        measure,
        ratio=2,
        unit=" tokens",
        name="predicted_nucleus_at_1_2",
        hint="count the tokens of softmax(logits / 1.2) needed to reach 0.9",
        notice=lambda n: (
            "the nucleus grows far faster than T: heating flattens the long tail, so many more "
            "small tokens are needed to reach 0.9"
        ),
    )
