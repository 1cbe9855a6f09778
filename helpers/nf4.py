"""NormalFloat (NF4), the 4-bit format of QLoRA, by hand: a codebook from normal quantiles, blockwise absmax.

    levels = normal_float_codebook(4)              # (16,) sorted, from -1.0 to 1.0, with an exact 0.0
    codes, absmax = quantize_nf4(w, block_size=64) # codes (N, K) uint8 in 0..15, absmax (N, K // block_size)
    w_hat = dequantize_nf4(codes, absmax, block_size=64)

Uniform int4 (helpers.quantize) spaces its 16 levels evenly over a group's range. Trained weights are roughly
normally distributed, so most of them sit near zero where evenly spaced levels are sparse relative to where the
weights are. NF4 instead puts the levels at quantiles of a standard normal, so each level stands for about the
same share of the weights, then scales the codebook by each block's largest |w| (absmax). The construction
follows Dettmers et al., "QLoRA: Efficient Finetuning of Quantized LLMs" (2023), as bitsandbytes implements it:
2^(k-1) positive levels at the normal quantiles of `linspace(offset, 0.5, 2^(k-1) + 1)` (the last, 0.5, is
zero), 2^(k-1) - 1 negative ones at those of `linspace(offset, 0.5, 2^(k-1))`, the value 0 itself, all divided
by the largest. `offset` is the mean of 1 - 1/(2(2^k - 1)) and 1 - 1/(2 * 2^k) (0.9677 for k = 4), which keeps
the outermost quantile finite. The asymmetry (one more positive level) buys an exact zero.

Left out: QLoRA's double quantization (its absmax values themselves quantized to 8 bits in blocks of 256, which
brings the scale's cost from 0.5 to about 0.127 bits per weight), a packed two-codes-per-byte layout, and any
fast kernel: this module is for measuring the format's error and quality, not its speed.
"""

from __future__ import annotations

import torch

__all__ = ["normal_float_codebook", "quantize_nf4", "dequantize_nf4", "nearest_level"]


def normal_float_codebook(bits: int = 4) -> torch.Tensor:
    """The 2**bits NormalFloat levels in [-1, 1], sorted, float32 (bits 2..8)."""
    if not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int from 2 to 8; got {bits!r}")
    n = 2**bits
    offset = ((1 - 1 / (2 * (n - 1))) + (1 - 1 / (2 * n))) / 2
    half = n // 2
    # float64 quantiles, so the codebook is the same to the last float32 bit on every machine
    positive = torch.special.ndtri(torch.linspace(offset, 0.5, half + 1, dtype=torch.float64)[:-1])  # (half,)
    negative = -torch.special.ndtri(torch.linspace(offset, 0.5, half, dtype=torch.float64)[:-1])  # (half - 1,)
    levels = torch.cat([positive, torch.zeros(1, dtype=torch.float64), negative]).sort().values  # (n,)
    return (levels / levels.abs().max()).float()


def nearest_level(x: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Index of the nearest entry of the sorted 1-D `levels` for each element of x (ties to the lower one)."""
    mids = (levels[1:] + levels[:-1]) / 2  # (n - 1,): decision boundaries between neighbours
    return torch.bucketize(x, mids.to(x.dtype), right=False)


def _check(w: torch.Tensor, block_size: int) -> None:
    if w.dim() != 2:
        raise ValueError(f"w must be a 2-D (out_features, in_features) matrix; got shape {tuple(w.shape)}")
    if not isinstance(block_size, int) or block_size < 1 or w.shape[1] % block_size:
        raise ValueError(f"block_size must be a positive int dividing in_features={w.shape[1]}; got {block_size!r}")


def quantize_nf4(
    w: torch.Tensor, block_size: int = 64, scale_dtype: torch.dtype = torch.bfloat16, bits: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise NormalFloat codes of an (N, K) matrix: (codes (N, K) uint8, absmax (N, K // block_size)).
    Each block of `block_size` consecutive weights along K is divided by its largest |w| (stored in
    scale_dtype, and rounded to it before dividing, so dequantizing reproduces what was encoded), then each
    weight gets the index of its nearest level."""
    _check(w, block_size)
    N, K = w.shape
    blocks = w.float().reshape(N, K // block_size, block_size)  # (N, G, g)
    absmax = blocks.abs().amax(-1).to(scale_dtype)  # (N, G)
    safe = absmax.float().clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)  # an all-zero block -> code of 0
    codes = nearest_level(blocks / safe, normal_float_codebook(bits))  # (N, G, g)
    return codes.reshape(N, K).to(torch.uint8), absmax


def dequantize_nf4(
    codes: torch.Tensor, absmax: torch.Tensor, block_size: int = 64, bits: int = 4, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """codes (N, K) and absmax (N, K // block_size) -> the (N, K) matrix they stand for."""
    N, K = codes.shape
    if absmax.shape != (N, K // block_size):
        raise ValueError(
            f"absmax must have shape {(N, K // block_size)} for block_size={block_size}; got {tuple(absmax.shape)}"
        )
    levels = normal_float_codebook(bits).to(codes.device)
    w = levels[codes.long()].reshape(N, K // block_size, block_size) * absmax.float().unsqueeze(-1)  # (N, G, g)
    return w.reshape(N, K).to(dtype)
