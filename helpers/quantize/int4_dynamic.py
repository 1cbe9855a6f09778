"""The "dynamic" int4 kernel: 4-bit weight codes times activations rounded to 8 bits per group, as llama.cpp's
q4_0 x q8_0 does, with AVX512-VNNI's byte dot products (cpu_kernels.cpp; native.py builds and loads it). On the
149M config's 52 matrices (AMD Zen 5 VM, one thread) it read the codes at about the read roof, where torch's
int4pack kernel, which widens every code to bf16, read them at about half of it. This module holds its layout
(`pack`), the calls, and the same arithmetic in plain torch (`reference_mm`) for the tests and for reading.

    rounded   x ~ d * a per group of g inputs: d = max|x| / 127, a = round(x / d) in -127..127
    product   y[n] = sum_g  s[n,g] * d_g * sum_k (q[n,k] - 8) a_k  +  z[n,g] * sum_k x_k

The zeros multiply the group's exact float sum of x, so only the scale term sees the rounding. Rounding the
activations adds error that weight-only int4 has not (the tests bound it; chapter 11 measures the same for
int8's "dynamic" kernel), so "auto" never picks it: it is the kernel to set beside llama.cpp's q4_0.
Left out: group sizes other than 64 and multiples of 128 (the loop reads 128 codes at a time), AVX2's
vpmaddubsw (it would need the pair-sum saturation guard of helpers.quantize.dynamic).
"""

from __future__ import annotations

import torch

from .. import many_rows
from .int4pack_cpu import workspace
from .native import deinterleave_rows, interleave_rows


def forward(layer, x2: torch.Tensor) -> torch.Tensor:
    """A "dynamic" int4 QuantizedLinear's product, (M, K) -> (M, N) float32: the kernel (rounded activations) up to
    layer.rounded_rows rows and while compiling, else one GEMM over the weight dequantized into a reused buffer
    (bf16 where many_rows.BF16_FAST; a fresh buffer when a gradient is to be recorded)."""
    g, N, K = layer.group_size, layer.out_features, layer.in_features
    if torch.compiler.is_compiling() or x2.shape[0] <= layer.rounded_rows:
        return torch.ops.course_quant.int4_dynamic_mm(
            x2.float().contiguous(), layer.qweight, layer.scales, layer.zeros, g, layer._vnni
        )
    dtype = torch.bfloat16 if many_rows.BF16_FAST else torch.float32
    fresh = torch.is_grad_enabled() and x2.requires_grad  # a backward would read a reused buffer
    w = torch.empty(N, K, dtype=dtype) if fresh else workspace(N * K, dtype).view(N, K)
    dequantize(layer.qweight, layer.scales, layer.zeros, g, w)  # (N, K)
    if dtype == torch.bfloat16:
        return torch.mm(x2.to(torch.bfloat16), w.t()).float()
    return many_rows.linear(x2.float(), w)


def check_group_size(group_size: int) -> None:
    """The kernel reads 128 codes at a time: a group of 64 is half of that, larger groups whole multiples."""
    if group_size != 64 and group_size % 128:
        raise ValueError(f"group_size must be 64 or a multiple of 128 for the int4 'dynamic' kernel; got {group_size}")


def dequantize(codes, scales, zeros, group_size: int, out: torch.Tensor) -> torch.Tensor:
    """The (N, K) weight in out's dtype (float32 or bfloat16), written into `out`."""
    torch.ops.course_quant.int4_dequantize(codes, scales, zeros, group_size, out)
    return out


def pack(q: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N, K) codes 0..15 -> the kernel's (N, G, g/2) uint8 layout (halves, then rows interleaved)."""
    from .arithmetic import pack_int4_halves

    return interleave_rows(pack_int4_halves(q, group_size)).contiguous()


def round_activations(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) float32 -> (a (M, K) int8-valued float32, d (M, G)): x ~ d * a per group, as the kernel rounds."""
    M, K = x.shape
    groups = x.reshape(M, K // group_size, group_size)  # (M, G, g)
    amax = groups.abs().amax(-1)  # (M, G)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    a = torch.round(groups * inv.unsqueeze(-1))  # ties to even, as the kernel's conversion
    return a.reshape(M, K), amax / 127.0


def reference_mm(x, codes, scales, zeros, group_size: int) -> torch.Tensor:
    """The kernel's arithmetic in plain torch (float64 sums): what tests compare both of its loops with. codes
    in the kernel's layout (pack)."""
    from .arithmetic import unpack_int4_halves

    M, K = x.shape
    N, G = scales.shape
    a, d = round_activations(x.float(), group_size)
    q = unpack_int4_halves(deinterleave_rows(codes)).double().reshape(N, G, group_size) - 8  # (N, G, g)
    dots = torch.einsum("mgk,ngk->mng", a.double().reshape(M, G, group_size), q)  # (M, N, G): exact integers
    sum_x = x.double().reshape(M, G, group_size).sum(-1)  # (M, G)
    y = (scales.double() * dots * d.double().unsqueeze(1)).sum(-1) + sum_x @ zeros.double().t()
    return y.float()  # (M, N)
