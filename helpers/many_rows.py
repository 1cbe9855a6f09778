"""The product of many input rows by a weight on a CPU, through oneDNN's GEMM rather than the BLAS torch
calls by default.

On a CPU, F.linear (and so nn.Linear) calls MKL's sgemm. On AMD CPUs that library takes a path slower than
the CPU allows, while oneDNN (torch's other CPU math library, here through
`torch.ops.mkldnn._linear_pointwise`, the op inductor emits for a linear layer of a dynamic number of rows)
picks its code for the instruction set it finds. Measured on a 2-core AMD Zen 5 VM (AVX-512), one thread,
512 rows, the shapes of the bench's 149M config: 82-94 GFLOP/s through F.linear, 173-188 through oneDNN with
the weight handed over as it is on every call (plain tensors in and out, nothing converted); the model's
512-token prefill, 86% of it in these products, went from 2.14 s to 1.08-1.13 s in one process. For few rows
the library's own kernel is as fast or faster (8 rows of the course model's projections: 0.35-0.83x with
oneDNN), hence MIN_ROWS. The bench's prefill rows against llama.cpp (`python -m helpers.bench --rows
llama-cpp`) time it on the machine at hand.

`linear(x, weight)` takes oneDNN for float32 on a CPU with at least MIN_ROWS rows, eagerly (while
torch.compile traces, the generated graph makes its own choice), with no gradient to record (oneDNN's
product here has no backward) and no dispatch mode watching (a FLOP counter counts F.linear's matmul);
everything else is F.linear. The two add in different orders: equal to float32 rounding, not bit for bit.

Left out: CPUs other than x86 (an Arm build of torch multiplies through other libraries: not measured here),
keeping a weight in oneDNN's blocked layout between calls (a second copy to keep in step with the
parameter; handing it over plain cost 0-5% at these shapes), 16-bit dtypes, GPUs.
"""

from __future__ import annotations

import platform

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

MIN_ROWS = 128  # rows at which oneDNN's GEMM is taken (172-row products: 1.5-2.0x faster; 8 rows: slower)
X86 = platform.machine().lower() in ("x86_64", "amd64")  # where torch's default CPU library is MKL


def _onednn_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    # tensor attributes and shapes only (no torch calls, so call counts such as chapter 07's see none);
    # compiling first: dynamo then traces nothing of this (a test on the rows would guard a graph traced with a
    # dynamic number of rows, the serving step's, and recompile it); then the rows, where decode leaves
    if torch.compiler.is_compiling():
        return False
    shape = x.shape
    if len(shape) < 2 or shape.numel() < MIN_ROWS * shape[-1]:
        return False
    if not X86 or x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return False
    if len(weight.shape) != 2 or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        return False
    # a dispatch mode watching the aten ops (a FLOP counter) sees F.linear's matmul, which it knows how to count
    return _get_current_dispatch_mode() is None and torch.backends.mkldnn.is_available()


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (..., K) times weight (N, K) transposed -> (..., N), bias-free: F.linear, or oneDNN's GEMM for many
    float32 rows on a CPU (see the module docstring)."""
    if not _onednn_applies(x, weight):
        return F.linear(x, weight)
    lead, K = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, K).contiguous()  # (M, K)
    y = torch.ops.mkldnn._linear_pointwise(rows, weight.contiguous(), None, "none", [], "")  # (M, N), plain
    return y.reshape(*lead, weight.shape[0])
