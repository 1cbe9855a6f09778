"""Checks for chapter 02's exercises (teacher forcing). Worked solutions:
notebooks/solutions/02_teacher_forcing_solutions.ipynb. Each check prints one line when right (and what to
notice), or raises with one line saying what is off."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import FROM_NOTEBOOK, exercise, prediction

__all__ = ["check_1", "check_2", "check_3", "check_4"]


def check_1(loss_confident_wrong=FROM_NOTEBOOK) -> None:
    """A model puts 0.9 on one wrong token and spreads 0.1 evenly over the other 2,047: its loss on
    a true token that is one of those 2,047."""
    exercise(
        "02.1",
        loss_confident_wrong,
        lambda a: abs(float(a) - math.log(2047 / 0.1)) < 1e-6,
        hint="the loss is -ln p of the true token; what probability does it get?",
        notice=lambda loss: (
            f"{float(loss):.2f} nats, {float(loss) - math.log(2048):.2f} more than a uniform "
            "guess: confidence in the wrong token costs more than knowing nothing"
        ),
        name="loss_confident_wrong",
    )


def bits_per_byte_with_context(model, tok, batch: torch.Tensor, context: int) -> float:
    """Bits per byte on the targets batch[:, 1:], each predicted from at most `context` tokens: the inputs
    batch[:, :-1] cut into windows of `context` tokens (which must divide their length)."""
    from ...measure.evaluate import token_byte_lengths

    x, y = batch[:, :-1], batch[:, 1:]  # (B, T) each
    if x.shape[1] % context:
        raise ValueError(f"context {context} must divide the window length {x.shape[1]}")
    with torch.no_grad():
        logits = model(x.reshape(-1, context))  # (B * T / context, context, V)
    nll = F.cross_entropy(logits.flatten(0, 1).float(), y.reshape(-1), reduction="sum").item()
    n_bytes = int(torch.as_tensor(token_byte_lengths(tok))[y.cpu()].sum())
    return nll / math.log(2) / n_bytes


def check_2(model, tok, eval_batch, predicted_bpb_one_token=FROM_NOTEBOOK) -> None:
    """A guess at the course model's bits per byte when each prediction sees only the token before it."""
    full = bits_per_byte_with_context(model, tok, eval_batch, eval_batch.shape[1] - 1)
    prediction(
        "02.2",
        predicted_bpb_one_token,
        lambda: bits_per_byte_with_context(model, tok, eval_batch, 1),
        unit="bits/byte",
        name="predicted_bpb_one_token",
        rel_tol=0.2,
        notice=lambda m: (
            f"{m / full:.1f}x the {full:.3f} it scores on the same tokens with up to "
            f"{eval_batch.shape[1] - 2} tokens before each: most of what it knows about the next "
            "token comes from the context, which is why chapters 05 and 08 work so hard to keep it."
        ),
    )


def check_3(tokens_processed=FROM_NOTEBOOK) -> None:
    """`tokens_processed(p, n)`: positions a cache-free loop runs the model over for n new tokens."""

    def right(f):
        cases = {(1, 1): 1, (1, 32): 32 * 33 // 2, (64, 32): 32 * 64 + 32 * 31 // 2, (10, 0): 0}
        for (p, n), want in cases.items():
            got = f(p, n)
            assert got == want, f"tokens_processed({p}, {n}) gives {got}; count the positions of every pass"
        return True

    exercise(
        "02.3",
        tokens_processed,
        right,
        hint="step k (from 0) runs over p + k tokens; a function of p and n returning an int",
        notice=lambda f: (
            f"64 prompt tokens and 32 new ones: {f(64, 32):,} positions without a cache, "
            f"against {64 + 32 - 1} for one teacher-forced pass over the same text"
        ),
        name="tokens_processed",
    )


def check_4(n_params: int, static_bytes=FROM_NOTEBOOK) -> None:
    """fp32 parameters, gradients and AdamW state of a model with n_params parameters, in bytes."""
    exercise(
        "02.4",
        static_bytes,
        lambda a: int(a) == 16 * n_params,
        hint="count the bytes per parameter of each of the three, then multiply",
        name="target_static_bytes",
    )
