"""Checks for chapter 02's exercises (teacher forcing). Worked solutions:
notebooks/solutions/02_teacher_forcing_solutions.ipynb. Each check prints one line and returns nothing
(so a check cell shows only that line)."""
from __future__ import annotations

import math

from . import FROM_NOTEBOOK, exercise


def check_1(loss_confident_wrong=FROM_NOTEBOOK) -> None:
    """A model puts 0.9 on one wrong token and spreads 0.1 evenly over the other 2,047: its loss on
    a true token that is one of those 2,047."""
    exercise("02.1", loss_confident_wrong,
             lambda a: abs(float(a) - math.log(2047 / 0.1)) < 1e-6,
             hint="the loss is -ln p of the true token; what probability does it get?", name="loss_confident_wrong")


def check_2(record: dict, bpb=FROM_NOTEBOOK) -> None:
    """Bits per byte from the training record's nats per token and its token and byte counts."""
    expected = record["val_nats_per_token"] * record["val_tokens"] / math.log(2) / record["val_bytes"]
    exercise("02.2", bpb, lambda a: abs(float(a) - expected) < 1e-6,
             hint="total nats = nats/token x tokens; then nats -> bits, and divide by bytes", name="bpb")


def check_3(tokens_processed=FROM_NOTEBOOK) -> None:
    """`tokens_processed(p, n)`: positions a cache-free loop runs the model over for n new tokens."""
    def right(f):
        cases = {(1, 1): 1, (1, 32): 32 * 33 // 2, (64, 32): 32 * 64 + 32 * 31 // 2, (10, 0): 0}
        return all(f(p, n) == want for (p, n), want in cases.items())
    exercise("02.3", tokens_processed, right,
             hint="step k (from 0) runs over p + k tokens; a function of p and n returning an int",
             name="tokens_processed")


def check_4(n_params: int, static_bytes=FROM_NOTEBOOK) -> None:
    """fp32 parameters, gradients and AdamW state of a model with n_params parameters, in bytes."""
    exercise("02.4", static_bytes, lambda a: int(a) == 16 * n_params,
             hint="count the bytes per parameter of each of the three, then multiply", name="target_static_bytes")
