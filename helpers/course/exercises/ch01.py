"""Checks for chapter 01's exercises (inside the model). Worked solutions:
notebooks/solutions/01_inside_the_model_solutions.ipynb. Each check prints one line when right (and what to
notice), or raises with one line saying what is off."""

from __future__ import annotations

import copy
import math

import numpy as np

from . import FROM_NOTEBOOK, exercise, on_every, prediction

__all__ = ["check_1", "check_2", "check_3"]


def _code_sample(n_chars: int = 20_000) -> str:
    from ...data import validation_text

    return validation_text()[:n_chars]  # section 1.2's held-out code sample


def tab_token_ratio(tok) -> float:
    """Tokens of section 1.2's code sample with its 4-space indents made tabs, over its tokens as it is."""
    code = _code_sample()
    return len(tok.encode(code.replace("    ", "\t"))) / len(tok.encode(code))


def check_1(predicted_tab_ratio=FROM_NOTEBOOK) -> None:
    """A guess at tokens(code with tabs) / tokens(code with 4-space indents), measured."""
    from ...checkpoint import load_tokenizer

    tok = load_tokenizer()
    code = _code_sample()
    byte_ratio = len(code.replace("    ", "\t").encode()) / len(code.encode())
    prediction(
        "01.1",
        predicted_tab_ratio,
        lambda: tab_token_ratio(tok),
        unit="x the tokens",
        rel_tol=0.1,
        name="predicted_tab_ratio",
        notice=lambda m: (
            f"The text got {1 - byte_ratio:.0%} shorter in bytes but {m - 1:.0%} longer in tokens: the "
            "merges were learned on 4-space indents ('\\n   ' + ' return'), and the tab merged with "
            "neither neighbour: '\\n', '\\t', 'return' come out as three tokens."
        ),
    )


TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "    squares = [i ** 2 for i in range(10)]  # comment",
    "class Stack:\n\tpass\n\n\n",
    "héllo, 世界!",
]


def check_2(encode_with_merges=FROM_NOTEBOOK) -> None:
    """`encode_with_merges(text)`: the course tokenizer's ids, by applying its merges by hand."""
    from ...checkpoint import load_tokenizer

    tok = load_tokenizer()

    def right_on(f, text):
        got = list(f(text))
        assert got == tok.encode(text), (
            f"on {text!r} you get {len(got)} ids, tok.encode gives {len(tok.encode(text))}"
            + (" (same count, different ids)" if len(got) == len(tok.encode(text)) else "")
        )

    exercise(
        "01.2",
        encode_with_merges,
        on_every(TEXTS, right_on),
        hint="split with SPLIT_PATTERN, list each chunk's UTF-8 bytes, apply every merge in learned order",
        notice=(
            f"{len(tok.merges):,} merges, applied in the order they were learned, reproduce the tokenizer: "
            "encoding is training replayed, with no counting left to do"
        ),
        name="encode_with_merges",
    )


def rope_off_ratio(model, tok) -> float:
    """Bits per byte on the first 5,000 characters of the code sample with RoPE off, over with RoPE on."""
    from ...measure.evaluate import bits_per_byte

    ids = np.array(tok.encode(_code_sample(5_000), bos=True))
    no_rope = copy.deepcopy(model)
    no_rope.rope_cos.fill_(1.0)  # every rotation angle 0: cos 1, sin 0, so q and k carry no position
    no_rope.rope_sin.fill_(0.0)
    on = bits_per_byte(model, tok, ids, seq_len=1024)["bits_per_byte"]
    return bits_per_byte(no_rope, tok, ids, seq_len=1024)["bits_per_byte"] / on


def check_3(model, tok, predicted_rope_off_ratio=FROM_NOTEBOOK) -> None:
    """A guess at how many times more bits per byte the model needs with RoPE switched off, measured."""
    code = _code_sample(5_000)
    n_tokens = len(tok.encode(code))
    uniform = math.log2(tok.vocab_size) * n_tokens / len(code.encode())
    prediction(
        "01.3",
        predicted_rope_off_ratio,
        lambda: rope_off_ratio(model, tok),
        unit="x the bits per byte",
        name="predicted_rope_off_ratio",
        rel_tol=0.25,
        notice=(
            f"Worse, but far from a uniform guess ({uniform:.1f} bits/byte on this text): which tokens came "
            "before still says a lot, even when nothing says in what order."
        ),
    )
