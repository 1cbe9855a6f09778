"""Checks for chapter 03's exercises (the causal mask). Worked solutions:
notebooks/solutions/03_causal_mask_solutions.ipynb. Each check prints one line when right (and what to
notice), or raises with one line saying what is off."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...model import causal_mask
from . import FROM_NOTEBOOK, exercise, prediction

__all__ = ["check_1", "check_2", "check_3"]


def check_1(sw=FROM_NOTEBOOK) -> None:
    """A (6, 6) float sliding-window mask, window 3: 0 where a query may look, -inf elsewhere."""

    def right(m):
        m = torch.as_tensor(m)
        assert m.shape == (6, 6), f"expected shape (6, 6), got {tuple(m.shape)}"
        assert bool(((m == 0) | (m == float("-inf"))).all()), "every entry should be 0 or -inf"
        return torch.equal(m == 0, causal_mask(6, 6, window=3))

    exercise(
        "03.1",
        sw,
        right,
        hint="query i sees keys j with j <= i and j > i - window",
        notice="every row sees at most 3 keys, so a cache of the last 3 positions is all a decode step needs",
        name="sw",
    )


def reference_masked_softmax(scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Softmax over the visible entries, exactly 0 elsewhere, and an all-zero row where nothing is visible."""
    weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.where(visible.any(-1, keepdim=True), weights, torch.zeros_like(weights))


def check_2(safe_masked_softmax=FROM_NOTEBOOK) -> None:
    """`safe_masked_softmax(scores, visible)`: never NaN, zeros for a row with nothing visible."""
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 5, 5, generator=g)  # (B, T, T)
    lengths = torch.tensor([3, 5])  # the first sequence is left-padded by 2
    real = torch.arange(5)[None, :] >= (5 - lengths)[:, None]  # (B, T)
    visible = causal_mask(5, 5)[None] & real[:, None, :]  # (B, T, T): two rows of the first see nothing
    cases = [
        (scores, visible),
        (scores[1], causal_mask(5, 5)),
        (torch.tensor([0.5, 0.3, 0.1]), torch.tensor([True, True, False])),
    ]

    def right(f):
        for s, v in cases:
            got = torch.as_tensor(f(s.clone(), v.clone()))
            assert got.shape == s.shape, f"expected shape {tuple(s.shape)}, got {tuple(got.shape)}"
            assert not got.isnan().any(), "your result has NaN in it: what does a row with nothing visible give?"
            want = reference_masked_softmax(s, v)
            assert torch.allclose(got.float(), want, atol=1e-6), (
                "NaN-free, but not the masked softmax: visible entries should sum to 1 in each row that has one, "
                "hidden entries and empty rows should be exactly 0"
            )
        return True

    exercise(
        "03.2",
        safe_masked_softmax,
        right,
        hint="mask with -inf and softmax, then put zeros in the rows where nothing is visible (torch.where)",
        notice=(
            "a padded batch can now run with -inf: the empty rows of the padding give zeros, not NaN, "
            "as PyTorch's scaled_dot_product_attention does"
        ),
        name="safe_masked_softmax",
    )


def last_position_loss(model, batch: torch.Tensor) -> float:
    """Mean loss at the last position of each window of `batch` (B, T+1), the model run without the mask."""
    with torch.no_grad():
        logits = model(batch[:, :-1], causal=False)[:, -1]  # (B, V): the last input position of each window
    return F.cross_entropy(logits.float(), batch[:, -1]).item()


def check_3(peeking_twin, eval_batch, predicted_last_loss=FROM_NOTEBOOK) -> None:
    """A guess at the peeking twin's loss at the last position of each window, run without the mask."""
    vocab = peeking_twin.cfg.vocab_size

    def measure():
        return last_position_loss(peeking_twin, eval_batch)

    def notice(measured):
        return (
            f"A uniform guess costs ln {vocab} = {math.log(vocab):.2f}. At the last position the answer "
            "is not in the input, so there is nothing to copy, and the twin never learned anything "
            "else: its 'held out, unmasked' average was low only because the other positions copy."
        )

    prediction(
        "03.3", predicted_last_loss, measure, unit="nats/token", name="predicted_last_loss", rel_tol=0.25, notice=notice
    )
