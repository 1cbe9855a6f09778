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

oneDNN wins only where it may use the CPU's wide vector instructions: with oneDNN held to SSE4.1 and torch's
kernels to its default capability (the course's restricted-CPU run), the same products ran at 30-38 GFLOP/s
through oneDNN against 74-94 through F.linear; held to AVX2, oneDNN was 1.1-1.3x F.linear. So ONEDNN_FAST, set
once at import, asks for an x86 CPU on which torch found AVX2 or AVX-512 and oneDNN is not held below AVX2.

`linear(x, weight)` takes oneDNN where ONEDNN_FAST, for float32 on a CPU with at least MIN_ROWS rows, eagerly (while
torch.compile traces, the generated graph makes its own choice), with no gradient to record (oneDNN's
product here has no backward) and no dispatch mode watching (a FLOP counter counts F.linear's matmul);
everything else is F.linear. The two add in different orders: equal to float32 rounding, not bit for bit.

BF16_FAST says where oneDNN multiplies bfloat16 in the CPU's own bf16 instructions: quantize/linear.py's int4
layers then run a prefill as one bf16 GEMM over their dequantized weight.

Left out: CPUs other than x86 (an Arm build of torch multiplies through other libraries: not measured here),
keeping a weight in oneDNN's blocked layout between calls (a second copy to keep in step with the
parameter; handing it over plain cost 0-5% at these shapes), 16-bit dtypes, GPUs.
"""

from __future__ import annotations

import os
import platform

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

MIN_ROWS = 128  # rows at which oneDNN's GEMM is taken (172-row products: 1.5-2.0x faster; 8 rows: slower)


def onednn_is_fast() -> bool:
    """True on an x86 CPU (where torch's default CPU library is MKL) with AVX2 or AVX-512 as torch sees it
    (`ATEN_CPU_CAPABILITY` can lower that), oneDNN not held below AVX2 (`ONEDNN_MAX_CPU_ISA`), oneDNN built in."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkldnn.is_available():
        return False
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    return os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper() not in ("SSE41", "AVX")


ONEDNN_FAST = onednn_is_fast()  # read once: the choice stays the same for the whole process


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()  # not Linux, or no such file: no claim


def bf16_is_fast() -> bool:
    """True where oneDNN multiplies bfloat16 in the CPU's own bf16 instructions (AVX512-BF16 or AMX, as
    Linux lists them), oneDNN not held to a lower ISA: there a bf16 GEMM ran at about twice float32's
    rate (512 x 1024 x 5632 on the Zen 5 VM: 13.5 against 28.7 ms). Elsewhere oneDNN emulates bf16."""
    if not ONEDNN_FAST or torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper() != "ALL":
        return False
    return bool(_cpu_flags() & {"avx512_bf16", "amx_bf16"})


BF16_FAST = bf16_is_fast()  # read once, like ONEDNN_FAST


def _onednn_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    # tensor attributes and shapes only (no torch calls, so call counts such as chapter 07's see none);
    # compiling first: dynamo then traces nothing of this (a test on the rows would guard a graph traced with a
    # dynamic number of rows, the serving step's, and recompile it); then the rows, where decode leaves
    if torch.compiler.is_compiling():
        return False
    shape = x.shape
    if len(shape) < 2 or shape.numel() < MIN_ROWS * shape[-1]:
        return False
    if not ONEDNN_FAST or x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return False
    if len(weight.shape) != 2 or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        return False
    # a dispatch mode watching the aten ops (a FLOP counter) sees F.linear's matmul, which it knows how to count
    return _get_current_dispatch_mode() is None


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (..., K) times weight (N, K) transposed -> (..., N), bias-free: F.linear, or oneDNN's GEMM for many
    float32 rows on a CPU (see the module docstring)."""
    if not _onednn_applies(x, weight):
        return F.linear(x, weight)
    lead, K = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, K).contiguous()  # (M, K)
    y = torch.ops.mkldnn._linear_pointwise(rows, weight.contiguous(), None, "none", [], "")  # (M, N), plain
    return y.reshape(*lead, weight.shape[0])
