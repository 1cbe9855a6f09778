"""helpers/nf4.py: the NormalFloat codebook against QLoRA's published values, and the round trip's bounds."""

from __future__ import annotations

import pytest
import torch

from helpers.nf4 import dequantize_nf4, nearest_level, normal_float_codebook, quantize_nf4
from helpers.quantize import dequantize_groupwise, quantize_groupwise

# NF4 as listed in the QLoRA paper's appendix (Dettmers et al. 2023) and shipped by bitsandbytes
PUBLISHED_NF4 = [
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
]


def test_codebook_matches_the_published_nf4():
    levels = normal_float_codebook(4)
    assert levels.dtype == torch.float32 and levels.shape == (16,)
    assert (levels - torch.tensor(PUBLISHED_NF4)).abs().max() < 1e-6


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_codebook_shape(bits):
    levels = normal_float_codebook(bits)
    assert levels.numel() == 2**bits
    assert bool((levels.diff() > 0).all())
    assert levels[0] == -1.0 and levels[-1] == 1.0 and int((levels == 0).sum()) == 1
    assert int((levels > 0).sum()) == int((levels < 0).sum()) + 1  # one more positive level buys the exact zero


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="bits"):
        normal_float_codebook(1)
    with pytest.raises(ValueError, match="block_size"):
        quantize_nf4(torch.randn(4, 100), block_size=64)
    with pytest.raises(ValueError, match="w must be"):
        quantize_nf4(torch.randn(64))
    codes, absmax = quantize_nf4(torch.randn(4, 128), 64)
    with pytest.raises(ValueError, match="absmax"):
        dequantize_nf4(codes, absmax, block_size=32)


def test_round_trip_is_the_nearest_level():
    torch.manual_seed(0)
    w = torch.randn(32, 256)
    codes, absmax = quantize_nf4(w, 64)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15 and absmax.shape == (32, 4)
    w_hat = dequantize_nf4(codes, absmax, 64)
    levels = normal_float_codebook(4)
    scale = absmax.float().repeat_interleave(64, dim=1)  # (32, 256)
    # no other level is nearer to w / absmax than the chosen one
    dist = (w / scale).unsqueeze(-1) - levels  # (32, 256, 16)
    assert torch.equal(codes.long(), dist.abs().argmin(-1))
    # each block's largest |w| is exact (up to its bf16 scale's rounding); zeros stay exactly zero
    assert torch.allclose(w_hat.abs().reshape(32, 4, 64).amax(-1), absmax.float())
    z = torch.zeros(2, 64)
    assert torch.equal(dequantize_nf4(*quantize_nf4(z, 64), 64), z)


def test_nearest_level_ties_and_edges():
    levels = torch.tensor([-1.0, 0.0, 1.0])
    assert nearest_level(torch.tensor([-2.0, -0.6, -0.4, 0.4, 0.6, 2.0]), levels).tolist() == [0, 0, 1, 1, 2, 2]


def test_nf4_beats_uniform_absmax_on_normal_weights():
    # the format's reason to exist: on normally distributed weights, at the same bits, its error is smaller
    torch.manual_seed(1)
    w = torch.randn(256, 512)
    nf4 = dequantize_nf4(*quantize_nf4(w, 64), 64)
    q, s, _ = quantize_groupwise(w, bits=4, group_size=64, symmetric=True, scale_dtype=torch.bfloat16)
    uniform = dequantize_groupwise(q, s, None, 64)
    assert (nf4 - w).norm() < 0.9 * (uniform - w).norm()
