"""Quantization arithmetic by hand: absmax and groupwise codes, their inverses, and int4 packing.

Pure functions on a weight matrix `w` of shape (N, K) = (out_features, in_features), as nn.Linear stores
it. No kernels here (helpers.quantize.linear runs them); no model (helpers.quantize.quantize_model).
"""

from __future__ import annotations

import torch

from ..row_sums import ROW_SPLIT  # noqa: F401 (fused_dequant: output rows in this many blocks, one sum each)

FLOAT_FORMATS = {"bf16": torch.bfloat16, "fp16": torch.float16}  # 16-bit weights, no scales (see the docstring)
METHODS = ("int8", "int4", *FLOAT_FORMATS)
KERNELS = ("auto", "reference", "int8pack", "int4pack", "dynamic", "linear_then_scale", "fused_dequant", "cpu_rows")
KERNEL_GROUP_SIZES = (32, 64, 128, 256)  # what torch's int4 kernels accept
STORAGE_DTYPE = torch.bfloat16  # scales and zeros
TINY_SCALE = 1e-10  # smallest scale: an all-zero row or group quantizes to zeros instead of dividing by 0


def check_weight(w, name: str = "w") -> None:
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise ValueError(f"{name} must be a floating-point torch.Tensor; got {getattr(w, 'dtype', type(w).__name__)}")
    if w.dim() != 2:
        raise ValueError(f"{name} must be 2-D (out_features, in_features); got shape {tuple(w.shape)}")


def check_finite(reduced: torch.Tensor) -> None:
    """NaN and inf survive max/min reductions, so checking the (small) reduced tensor is enough."""
    if not torch.isfinite(reduced).all():
        raise ValueError("w must contain only finite values (no NaN or inf)")


def check_bits(bits, allowed) -> None:
    if not isinstance(bits, int) or isinstance(bits, bool) or bits not in allowed:
        raise ValueError(f"bits must be an int in [{min(allowed)}, {max(allowed)}]; got {bits!r}")


def quantize_absmax(
    w: torch.Tensor, bits: int = 8, per_channel: bool = False, scale_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric absmax quantization: scale = max|w| / (2^(bits-1) - 1), q = round(w / scale).

    per_channel=False: one scale for the whole tensor (shape ()); True: one per output row (N, 1).
    Returns int8 codes in [-(2^(bits-1) - 1), 2^(bits-1) - 1] and the scale, stored as `scale_dtype`.
    """
    check_weight(w)
    check_bits(bits, range(2, 9))
    qmax = 2 ** (bits - 1) - 1
    w32 = w.float()
    absmax = w32.abs().amax(dim=1, keepdim=True) if per_channel else w32.abs().amax()  # (N, 1) or ()
    check_finite(absmax)
    scale = (absmax / qmax).clamp(min=TINY_SCALE).to(scale_dtype)  # stored, possibly rounded
    q = (w32 / scale.float()).round_().clamp_(-qmax, qmax).to(torch.int8)  # (N, K)
    return q, scale


def dequantize_absmax(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    w = q.float()  # (N, K) float32: one new buffer, scaled in place (a second one cost more than the product)
    return w.mul_(scale.float()).to(dtype)


def check_group_size(group_size, K: int) -> None:
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2:
        raise ValueError(f"group_size must be an int >= 2; got {group_size!r}")
    if K % group_size:
        raise ValueError(
            f"group_size ({group_size}) must divide in_features ({K}); allowed: divisors of {K} that are >= 2"
        )


def quantize_groupwise(
    w: torch.Tensor,
    bits: int = 4,
    group_size: int = 64,
    symmetric: bool = False,
    scale_dtype: torch.dtype = torch.float32,
):
    """Group-wise quantization along K: one scale (and zero) per `group_size` consecutive weights of a row.

    asymmetric: scale = (max - min) / (2^bits - 1), zero = min + 2^(bits-1) * scale,
                q = round((w - zero) / scale) + 2^(bits-1), clamped to [0, 2^bits - 1] (uint8);
                w ~ (q - 2^(bits-1)) * scale + zero.
    symmetric:  scale = max|w| / (2^(bits-1) - 1), q = round(w / scale) (int8), zeros is None.
    Returns q (N, K), scales (N, K // group_size), zeros (N, K // group_size) or None.
    """
    check_weight(w)
    check_bits(bits, range(2, 9))
    N, K = w.shape
    check_group_size(group_size, K)
    groups = w.float().reshape(N, K // group_size, group_size)  # (N, G, g)
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        absmax = groups.abs().amax(-1)  # (N, G)
        check_finite(absmax)
        scales = (absmax / qmax).clamp(min=TINY_SCALE).to(scale_dtype)  # (N, G)
        q = (groups / scales.float().unsqueeze(-1)).round_().clamp_(-qmax, qmax).to(torch.int8)
        return q.reshape(N, K), scales, None
    mid, top = 2 ** (bits - 1), 2**bits - 1
    lo, hi = torch.aminmax(groups, dim=-1)  # (N, G) each
    check_finite(hi - lo)
    scales = ((hi - lo) / top).clamp(min=TINY_SCALE).to(scale_dtype)  # (N, G)
    zeros = (lo + mid * scales.float()).to(scale_dtype)  # (N, G): the value of code `mid`
    q = (groups - zeros.float().unsqueeze(-1)).div_(scales.float().unsqueeze(-1)).round_().add_(mid)
    return q.clamp_(0, top).to(torch.uint8).reshape(N, K), scales, zeros


def dequantize_groupwise(
    q: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group_size: int,
    bits: int = 4,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    N, K = q.shape
    check_group_size(group_size, K)
    codes = q.float().reshape(N, K // group_size, group_size)  # (N, G, g)
    if zeros is None:
        w = codes * scales.float().unsqueeze(-1)
    else:
        w = (codes - 2 ** (bits - 1)) * scales.float().unsqueeze(-1) + zeros.float().unsqueeze(-1)
    return w.reshape(N, K).to(dtype)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes (0..15) per byte: (N, K) uint8 -> (N, K/2) uint8, even k in the low nibble."""
    if q.dtype != torch.uint8 or q.dim() != 2 or q.shape[1] % 2:
        raise ValueError(f"q must be a 2-D uint8 tensor with an even number of columns; got {q.dtype} {tuple(q.shape)}")
    if int(q.max()) > 15:
        raise ValueError(f"q must hold 4-bit codes in [0, 15]; got max {int(q.max())}")
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4: (N, K/2) uint8 -> (N, K) uint8 codes."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)  # (N, K)


def pack_int4_halves(q: torch.Tensor, group_size: int) -> torch.Tensor:
    """The "fused_dequant" layout: (N, K) uint8 codes (0..15) -> (N, G, g/2) uint8, where byte j of a group
    holds code j in its low nibble and code j + g/2 in its high nibble. Unpacking is then `& 15` and
    `>> 4` with no interleave, which a compiled loop does in registers."""
    if q.dtype != torch.uint8 or q.dim() != 2:
        raise ValueError(f"q must be a 2-D uint8 tensor; got {q.dtype} {tuple(q.shape)}")
    N, K = q.shape
    check_group_size(group_size, K)
    if group_size % 2:
        raise ValueError(f"group_size must be even to pack two codes per byte; got {group_size}")
    if int(q.max()) > 15:
        raise ValueError(f"q must hold 4-bit codes in [0, 15]; got max {int(q.max())}")
    halves = q.reshape(N, K // group_size, 2, group_size // 2)  # (N, G, 2, g/2)
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).contiguous()


def unpack_int4_halves(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4_halves: (N, G, g/2) uint8 -> (N, K) uint8 codes."""
    N = packed.shape[0]
    return torch.stack([packed & 0x0F, packed >> 4], dim=2).reshape(N, -1)  # (N, G, 2, g/2) -> (N, K)
