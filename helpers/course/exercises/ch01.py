"""Exercise checks for chapter 01 (inside the model). Worked solutions:
notebooks/solutions/01_inside_the_model_solutions.ipynb."""
from __future__ import annotations

import math
from dataclasses import replace

import torch

from ...measure.flops import kv_cache_bytes
from ...model import ModelConfig
from . import FROM_NOTEBOOK, exercise

__all__ = ["check_1", "check_2", "check_3", "check_4"]

COURSE = ModelConfig.from_preset("target")


def check_1(answer=FROM_NOTEBOOK):
    """KV-cache bytes per token, float16, if the course model had as many key/value heads as query heads."""
    expected = kv_cache_bytes(replace(COURSE, n_kv_heads=COURSE.n_heads), 1, dtype=torch.float16)
    return exercise("01.1", answer, lambda a: a == expected,
                    hint="2 x layers x key/value heads x head_dim x 2 bytes, with 8 key/value heads",
                    name="mha_kv_bytes_per_token")


def check_2(answer=FROM_NOTEBOOK):
    """The SwiGLU width for d_model = 512: 8/3 * d_model rounded up to a multiple of 64."""
    expected = 64 * math.ceil(int(8 * 512 / 3) / 64)
    return exercise("01.2", answer, lambda a: a == expected, hint="an int, a multiple of 64", name="d_ff_for_512")


def check_3(answer=FROM_NOTEBOOK):
    """Sinusoidal encoding of position 3 at d_model = 4: [sin 3, cos 3, sin 0.03, cos 0.03]."""
    expected = [math.sin(3), math.cos(3), math.sin(3 / 100), math.cos(3 / 100)]

    def is_right(a):
        values = [float(v) for v in (a.tolist() if hasattr(a, "tolist") else a)]
        assert len(values) == 4, f"expected 4 numbers, got {len(values)}"
        return all(abs(v - e) < 1e-3 for v, e in zip(values, expected))

    return exercise("01.3", answer, is_right, hint="the second frequency is 1 / 10000^(2/4) = 1/100",
                    name="pe_position_3")


def check_4(answer=FROM_NOTEBOOK):
    """How many ids of the course vocabulary spell bytes that start with a space."""
    from ...checkpoint import load_tokenizer

    tok = load_tokenizer()
    expected = sum(1 for b in tok.vocab.values() if b.startswith(b" "))
    return exercise("01.4", answer, lambda a: a == expected, hint="count tok.vocab entries, special tokens excluded",
                    name="n_tokens_starting_with_space")
