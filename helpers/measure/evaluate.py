"""Measuring a language model: cross-entropy in bits per byte on held-out text.

Bits per byte (bpb) = total negative log-likelihood of the text, in bits, divided by its length in
UTF-8 bytes. Unlike loss per token it does not depend on the tokenizer, so models with different
vocabularies (or a byte-level model) compare directly; 8.0 would be a uniform guess over bytes.

The token stream is cut into windows of the context length; every token except the very first is
predicted exactly once, from the tokens before it in its window.

Out of scope: sliding-window (strided) evaluation with overlapping contexts.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


def token_byte_lengths(tokenizer) -> np.ndarray:
    """UTF-8 bytes each token id stands for (special tokens: 0)."""
    lengths = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    for i, b in tokenizer.vocab.items():
        lengths[i] = len(b)
    return lengths


def windows(ids: np.ndarray, seq_len: int, max_windows: int | None = None) -> list[np.ndarray]:
    """Windows of seq_len + 1 ids overlapping by one: inputs w[:-1], targets w[1:].

    With max_windows, that many windows spread evenly over the whole stream (the first few files
    alone would be a biased sample).
    """
    out = []
    for start in range(0, len(ids) - 1, seq_len):
        w = ids[start : start + seq_len + 1]
        if len(w) < 2:
            break
        out.append(w)
    if max_windows is not None and max_windows < len(out):
        picks = np.linspace(0, len(out) - 1, max_windows).round().astype(int)
        out = [out[i] for i in picks]
    return out


@torch.no_grad()
def bits_per_byte(
    model,
    tokenizer,
    ids: np.ndarray,
    seq_len: int | None = None,
    max_windows: int | None = None,
    batch_size: int = 8,
    attn_window: int | None = None,
    progress: bool = False,
) -> dict:
    """Cross-entropy of `model` on the token stream `ids`; returns bits/byte, nats/token and counts."""
    seq_len = seq_len or model.cfg.max_seq_len
    lengths = token_byte_lengths(tokenizer)
    ws = windows(np.asarray(ids), seq_len, max_windows)
    # full windows go in batches; a shorter last window goes alone
    batches = [ws[b : b + batch_size] for b in range(0, len(ws), batch_size) if len(ws[b]) == seq_len + 1]
    batches = [[w for w in g if len(w) == seq_len + 1] for g in batches]
    batches += [[w] for w in ws if len(w) != seq_len + 1]
    was_training = model.training
    model.eval()
    total_nll, total_tokens, total_bytes = 0.0, 0, 0
    if progress:
        from ..progress import progress_bar

        batches = progress_bar(batches, desc="evaluating", unit="batch", leave=False)
    for group in batches:
        arr = np.stack(group).astype(np.int64)  # (B, T+1)
        x = torch.from_numpy(arr[:, :-1]).to(model.device)  # (B, T)
        y = torch.from_numpy(arr[:, 1:]).to(model.device)  # (B, T)
        logits = model(x, attn_window=attn_window).float()  # (B, T, V)
        total_nll += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        total_tokens += y.numel()
        total_bytes += int(lengths[arr[:, 1:]].sum())
    model.train(was_training)
    return {
        "bits_per_byte": total_nll / math.log(2) / total_bytes,
        "nats_per_token": total_nll / total_tokens,
        "nll_nats": total_nll,
        "tokens": total_tokens,
        "bytes": total_bytes,
    }
