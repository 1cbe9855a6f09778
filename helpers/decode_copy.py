"""The copy of a model that FastGenerator's compiled step runs: the same tensors, with each bias-free
nn.Linear swapped for a layer that multiplies one row faster (fast_decode.py's docstring says why each).

    "sums"     RowSumLinear (row_sums.py): sums inductor generates, over a panel copy of the weight;
    "library"  torch's kernel; on a CPU over a transposed copy, (in, out) (InputMajorLinear).

Embeddings, norms, RoPE tables and layers that are not nn.Linear (quantize/'s) are shared, not copied;
the model itself is not changed. Left out: the generator (fast_decode.py), the compile options (compiling.py).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from . import many_rows
from .model import Attention, Linear
from .row_sums import RowSumLinear

GEMVS = ("sums", "library")  # how a compiled batch-1 step multiplies one row by a projection (see the docstring)


class InputMajorLinear(nn.Module):
    """nn.Linear(W) without bias, that multiplies a single row by a transposed copy of W.

    One row (a batch-1 decode step): y = x @ weight_t, weight_t = W.T stored contiguous, (in, out): on a
    CPU torch's matrix-vector kernel over this layout is the faster one (see the module docstring).
    Several rows (a verify pass over a few tokens, a batch, a prefill): y = x @ W.T over nn.Linear's own
    (out, in) weight, shared, not copied: for 2 to 8 rows MKL's kernels over (out, in) ran 1.2x to 2.4x
    faster than over (in, out) for the course model's projections with AVX-512 (2 and 4 rows with AVX2:
    1.5x to 1.7x; with SSE4.2 only, 1.3x to 1.6x slower). Either way the same product as nn.Linear(W),
    summed in another order, so equal to float rounding."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = weight  # (out, in): nn.Linear's parameter itself, for several rows
        self.weight_t = nn.Parameter(weight.detach().t().contiguous(), requires_grad=False)  # (in, out)

    def forward(self, x):  # (..., in) -> (..., out)
        K = x.shape[-1]
        if x.numel() != K:  # several rows (many: oneDNN's GEMM, many_rows.py)
            return many_rows.linear(x, self.weight)
        if torch.compiler.is_compiling() and x.is_contiguous():
            # inductor hands a (1, in) activation to the matmul with stride 0 on its size-1 dimension, and
            # the CPU BLAS path copies such an input before multiplying (19 copies a step for the course
            # model); the same row with plain strides is not copied (~3% of the step, interleaved)
            row = x.as_strided((1, K), (K, 1))  # (1, in): x's own memory, plain strides
            return (row @ self.weight_t).view(*x.shape[:-1], self.weight_t.shape[1])  # (..., out)
        return x @ self.weight_t


def float_weights_only(model: nn.Module) -> bool:
    """True when every parameter and buffer is in the model's own float dtype: no int8/int4 codes and no
    16-bit weights of an fp32 model from quantize/ (freezing would fold their conversion into fp32)."""
    return all(t.dtype == model.dtype for t in [*model.parameters(), *model.buffers()])


def _share_tree(module: nn.Module) -> nn.Module:
    """A copy of the module tree that shares every parameter and buffer (no tensor is copied), so that
    submodules can be swapped in the copy without touching the original."""
    twin = object.__new__(type(module))
    twin.__dict__ = dict(module.__dict__)
    twin._parameters, twin._buffers = dict(module._parameters), dict(module._buffers)
    twin._modules = {name: _share_tree(child) for name, child in module._modules.items()}
    return twin


def decode_copy(model: nn.Module, *, input_major: bool, static_attention: str, gemv: str = "library") -> nn.Module:
    """The model FastGenerator decodes with: a tree sharing `model`'s tensors, whose bias-free nn.Linear
    layers multiply one row as `gemv` says ("sums": RowSumLinear, over a panel copy; "library": torch's
    kernel, over a transposed copy if input_major) and whose attention modules attend with
    `static_attention` on the static path ("sdpa" or "sums", see model.attention_as_sums). `model` itself
    is not changed."""
    if static_attention not in ("sdpa", "sums"):
        raise ValueError(f"static_attention must be 'sdpa' or 'sums'; got {static_attention!r}")
    if gemv not in GEMVS:
        raise ValueError(f"gemv must be one of {GEMVS}; got {gemv!r}")
    if gemv == "sums" and input_major:
        raise ValueError(
            "input_major is a layout for torch's kernel (gemv='library'); gemv='sums' reads "
            "nn.Linear's own (out, in) weight"
        )
    if gemv == "sums":
        twin = row_sums_copy(model)
    else:
        twin = input_major_copy(model) if input_major else _share_tree(model)
    for module in twin.modules():
        if isinstance(module, Attention):
            module.static_attention = static_attention
    return twin


def _with_linears_as(model: nn.Module, layer) -> nn.Module:
    """The model with every bias-free nn.Linear replaced by layer(its weight); the rest is shared."""
    twin = _share_tree(model)
    for parent in twin.modules():
        for name, child in parent._modules.items():
            if type(child) in (nn.Linear, Linear) and child.bias is None:
                parent._modules[name] = layer(child.weight)
    return twin


def input_major_copy(model: nn.Module) -> nn.Module:
    """The model with every nn.Linear replaced by an InputMajorLinear of the same weight; embeddings,
    norms and RoPE tables are shared with `model`, the projections are copied (transposed). Layers that
    are not nn.Linear (quantized ones, for example) are kept as they are."""
    return _with_linears_as(model, InputMajorLinear)


def row_sums_copy(model: nn.Module) -> nn.Module:
    """The model with every nn.Linear replaced by a RowSumLinear of the same weight (row_sums.py; it adds
    a panel copy for one row). Layers that are not nn.Linear (quantized ones, say) are kept as they are."""
    return _with_linears_as(model, RowSumLinear)
