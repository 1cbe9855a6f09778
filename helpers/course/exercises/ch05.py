"""Checks for chapter 05's exercises (the KV cache). Worked solutions:
notebooks/solutions/05_kv_cache_solutions.ipynb. Each check prints one line and returns nothing."""
from __future__ import annotations

import torch

from ...measure.flops import kv_cache_bytes, parameter_count
from ...model import ModelConfig
from . import FROM_NOTEBOOK, exercise

MISTRAL_7B = ModelConfig(vocab_size=32000, max_seq_len=32768, n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8,
                         d_ff=14336)


def check_1(answer=FROM_NOTEBOOK) -> None:
    """(mistral_per_token, mistral_gib): Mistral-7B's bf16 cache per token, and for 32,768 tokens in GiB."""
    def right(a):
        per_token, gib = a
        return (int(per_token) == kv_cache_bytes(MISTRAL_7B, 1, dtype=torch.bfloat16)
                and abs(float(gib) - kv_cache_bytes(MISTRAL_7B, 32768, dtype=torch.bfloat16) / 2**30) < 1e-9)
    exercise("05.1", answer, right, hint="two numbers: 2 (K and V) x layers x kv_heads x head_dim x bytes, "
             "then x tokens / 2**30", name="mistral")


def check_2(answer=FROM_NOTEBOOK) -> None:
    """(max_batch, max_batch_mha): full-context Llama-3-8B sequences that fit next to its bf16 weights in 80 GB."""
    llama = ModelConfig.from_preset("llama3-8b")
    free = 80e9 - parameter_count(llama, tied_embeddings=False) * 2
    mha = ModelConfig.from_preset("llama3-8b", n_kv_heads=32)

    def right(a):
        gqa_batch, mha_batch = a
        return (int(gqa_batch) == int(free // kv_cache_bytes(llama, 8192, dtype=torch.bfloat16))
                and int(mha_batch) == int(free // kv_cache_bytes(mha, 8192, dtype=torch.bfloat16)))
    exercise("05.2", answer, right, hint="two whole numbers: the memory left after the weights, divided by one "
             "full-context sequence's cache", name="batches")


def check_3(per_token: int, max_seq_len: int, answer=FROM_NOTEBOOK) -> None:
    """(ring_bytes, ring_saving) for a 256-token, batch-8 RollingKVCache of a model with these sizes."""
    def right(a):
        ring_bytes, saving = a
        return int(ring_bytes) == 8 * 256 * per_token and abs(float(saving) - max_seq_len / 256) < 1e-9
    exercise("05.3", answer, right, hint="two numbers: the ring's nbytes, and the full-window KVCache's nbytes "
             "divided by it", name="ring")
