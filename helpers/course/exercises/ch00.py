"""Checks for chapter 00's exercises (the tour). Worked solutions: notebooks/solutions/00_tour_solutions.ipynb.
Each check prints one line when right (and what to notice), or raises with one line saying what is off."""

from __future__ import annotations

import numpy as np
import torch

from ...model import ModelConfig
from . import FROM_NOTEBOOK, exercise, on_every, prediction

__all__ = ["ENGLISH", "check_1", "check_2", "check_3"]

# The English paragraph of exercise 2 (chapter 01 counts its tokens too): prose the model never trained on.
ENGLISH = (
    "The museum opens at nine, but the queue starts long before that. Visitors come for the old "
    "maps on the second floor, drawn by hand when most of the coast was still a guess. A guide "
    "explains how each one was made, and why some rivers on them never existed."
)


def block_parameters(cfg: ModelConfig) -> int:
    """Parameters of one block: two RMSNorm weights, the fused wqkv, wo, the fused w_gate_up and w_down."""
    C, D, F = cfg.d_model, cfg.head_dim, cfg.d_ff
    return 2 * C + (cfg.n_heads + 2 * cfg.n_kv_heads) * D * C + cfg.n_heads * D * C + 2 * F * C + F * C


def check_1(block_params=FROM_NOTEBOOK) -> None:
    """`block_params(cfg)`: the parameter count of one transformer block, from the config alone."""
    presets = ["target", "draft", "tiny", "llama3-8b"]

    def right_on(f, name):
        cfg = ModelConfig.from_preset(name)
        got = f(cfg)
        assert int(got) == block_parameters(cfg), (
            f"for the {name!r} preset your function gives {int(got):,}, which is not one block's count"
        )

    cfg = ModelConfig.from_preset("target")
    total = cfg.vocab_size * cfg.d_model + cfg.n_layers * block_parameters(cfg) + cfg.d_model
    exercise(
        "00.1",
        block_params,
        on_every(presets, right_on),
        hint="no biases; wqkv is ((n_heads + 2 n_kv_heads) x head_dim, d_model), w_gate_up is (2 d_ff, d_model)",
        notice=(
            f"one block holds {block_parameters(cfg):,} parameters; {cfg.n_layers} blocks are "
            f"{cfg.n_layers * block_parameters(cfg) / total:.0%} of the model, the embedding table most of "
            "the rest"
        ),
        name="block_params",
    )


def measure_bits_per_byte(model, tok, text: str) -> float:
    """Bits per byte of `model` on `text`, every byte predicted (the text starts after <|bos|>)."""
    from ...measure.evaluate import bits_per_byte

    ids = np.array(tok.encode(text, bos=True))
    return bits_per_byte(model, tok, ids, seq_len=len(ids) - 1)["bits_per_byte"]


def check_2(model, tok, predicted_english_bpb=FROM_NOTEBOOK) -> None:
    """A guess at the course model's bits per byte on the English paragraph ENGLISH, measured."""
    code_bpb = model.training_record["val_bits_per_byte"]
    prediction(
        "00.2",
        predicted_english_bpb,
        lambda: measure_bits_per_byte(model, tok, ENGLISH),
        unit="bits/byte",
        name="predicted_english_bpb",
        rel_tol=0.3,
        notice=lambda m: (
            f"That is {m / code_bpb:.1f}x its {code_bpb:.3f} on held-out Python: a model is good at "
            "the kind of text it was trained on, and prose was only its comments and docstrings."
        ),
    )


PROMPTS = ["import os\nimport", "def fibonacci(n):", "for i in range(", "class Stack:\n    def", "return self."]


def check_3(model, tok, greedy_next=FROM_NOTEBOOK) -> None:
    """`greedy_next(text)`: the text of the single most likely next token after `text`, from one forward pass."""

    def expected(prompt):
        with torch.no_grad():
            logits = model(torch.tensor([tok.encode(prompt, bos=True)], device=model.device))  # (1, T, V)
        return tok.decode([int(logits[0, -1].argmax())])

    def right_on(f, prompt):
        got = f(prompt)
        assert isinstance(got, str), f"greedy_next should return the token's text (a str), got {type(got).__name__}"
        assert got == expected(prompt), f"after {prompt!r} your function returns {got!r}, not the model's favourite"

    exercise(
        "00.3",
        greedy_next,
        on_every(PROMPTS, right_on),
        hint="encode with bos=True, run model(...) once, take argmax of the last position's logits, decode it",
        notice=(
            f"on {len(PROMPTS)} prompts your function picks what generate() would write first: "
            "generation is this step in a loop, each new token appended to the input (chapter 04)"
        ),
        name="greedy_next",
    )
