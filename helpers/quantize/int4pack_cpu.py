"""torch's CPU int4 kernel's packed codes read back, dequantized in reused buffers: what QuantizedLinear's int4
layers use to multiply a prefill as one bf16 GEMM (see its docstring), and the workspaces the int4 "dynamic"
layers dequantize into for the same reason.

Left out: the CUDA kernel's tile layout (no path reads it back), and freeing the workspaces (they live as long as
the thread that grew them).
"""

from __future__ import annotations

import threading

import torch

# The CPU int4 kernel's packed layout where torch runs its AVX-512 kernels (torch 2.13's
# _convert_weight_to_int4pack_for_cpu blocks the rows by four float vectors: 64 there, 32 under AVX2 and the
# portable kernels, which also lay the bytes out otherwise): the rows in blocks of 64; within a block, for each
# k, 32 bytes whose low nibbles are rows 0..31 and high nibbles rows 32..63 (a last block of fewer rows is packed
# otherwise, hence N % 64). QuantizedLinear checks the layout on its own codes before reading it.
INT4PACK_CPU_BLOCK = 64
# From this many rows, dequantizing the whole weight to bf16 and one bf16 GEMM beat the int4 kernel: one
# 1024 x 5632 weight on the Zen 5 VM, one thread: the kernel 0.076 ms a row, the GEMM 0.026 ms a row after a
# 7.2 ms dequantization (even at 144 rows; 1.4x at 256, 1.9x at 512)
INT4_DEQUANTIZE_MIN_ROWS = 256


def unpack_int4pack_cpu(packed: torch.Tensor, N: int) -> torch.Tensor:
    """The (K, N) uint8 codes (0..15, transposed) held in the CPU int4 kernel's layout (see INT4PACK_CPU_BLOCK);
    N a multiple of 64."""
    K = packed.numel() * 2 // N
    blocks = packed.view(N // INT4PACK_CPU_BLOCK, K, INT4PACK_CPU_BLOCK // 2)  # (N/64, K, 32)
    codes = torch.cat([blocks & 15, blocks >> 4], -1)  # (N/64, K, 64): rows 0..31, then 32..63 of each block
    return codes.permute(1, 0, 2).reshape(K, N)  # (K, N)


# reused between calls (grown to the largest weight; one set per thread, so that a server's engine thread and
# the caller's never share one): fresh buffers of this size are faulted in page by page on first touch, which
# cost more than the arithmetic (the same dequantization took 27-34 ms with new buffers)
_WORKSPACES = threading.local()


def workspace(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A buffer of `numel` elements of `dtype`, this thread's own, reused by the next call (any caller)."""
    buffers = _WORKSPACES.__dict__.setdefault("by_dtype", {})  # this thread's {dtype: buffer}
    buffer = buffers.get(dtype)
    if buffer is None or buffer.numel() < numel:
        buffer = buffers[dtype] = torch.empty(numel, dtype=dtype)
    return buffer[:numel]


def dequantize_int4pack_cpu(packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """W transposed, (K, N) bf16, from the CPU int4 kernel's packed codes and its (G, N, 2) scales and zeros:
    (code - 8) * scale + zero in float32, rounded once to bf16. Returns a workspace that the next call
    overwrites: use it before calling again (QuantizedLinear multiplies by it at once). About 7 ms for
    1024 x 5632 on the Zen 5 VM, one thread; a compiled version of the same expression, with dynamic
    shapes, ran 10x slower."""
    G, N, _ = scales_and_zeros.shape
    K = G * group_size
    w = workspace(K * N, torch.float32).view(G, group_size, N)  # (G, g, N)
    w.copy_(unpack_int4pack_cpu(packed, N).view(G, group_size, N))
    w.sub_(8).mul_(scales_and_zeros[..., 0].unsqueeze(1)).add_(scales_and_zeros[..., 1].unsqueeze(1))
    return workspace(K * N, torch.bfloat16).view(K, N).copy_(w.view(K, N))  # (K, N)
