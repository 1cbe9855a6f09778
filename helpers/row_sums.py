"""The batch-1 matrix-vector product written as a sum that torch.compile fuses into one loop per product.

At batch 1 (one input row x, (1, K)) a projection's output is y[n] = sum_k x[k] W[n, k]. Written as
elementwise work and a reduction, `(x * W).sum(-1)`, inductor generates one vectorized C++ loop that
streams W once, row by row, accumulating in registers: no library call, no packed or transposed copy
of the weights, so the generated code is an ordinary cacheable graph (inductor's FX graph cache keeps
it across processes). Two details make that loop run at the speed of a plain sum over the weights:

- the output rows are cut into ROW_SPLIT blocks, each its own sum: inductor runs sums of the same loop
  shape in one loop with one accumulator each, so the CPU keeps ROW_SPLIT independent chains of
  additions going instead of waiting on one;
- the input row is `materialized` first (a copy inductor does not see into): otherwise inductor inlines
  the computation of x (RMSNorm, SiLU, a residual add) into the loop and recomputes it once per output row.

RowSumLinear uses this only while compiling and only for one row. Eagerly the broadcast product would be
materialized, (N, K) floats, so there (and for several rows: a prefill, a verify pass, a batch) it is
F.linear over the same weight: equal to float rounding, the sums adding in another order.
quantize/'s "fused_dequant" kernel is the same loop with a dequantization inside it.

Out of scope: GPUs (the graph becomes a Triton kernel there; FastGenerator keeps torch's kernel), and
several rows at once (torch's library kernels are faster once the weight is reused across rows).
"""

from __future__ import annotations

import logging

import torch
import torch.nn as nn
import torch.nn.functional as F

ROW_SPLIT = 4  # output rows in this many blocks, one accumulator each (quantize/'s fused_dequant uses it too)


class _KnownFallback(logging.Filter):
    """Drops inductor's warning that aten.detach_copy (see materialized) has no C shim: with the C++ wrapper
    it is called through the proxy executor instead, as intended, and a cold compile would otherwise print
    the warning once per product."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "aten.detach_copy" not in record.getMessage()


logging.getLogger("torch._inductor.ir").addFilter(_KnownFallback())


def materialized(x: torch.Tensor) -> torch.Tensor:
    """A copy that inductor does not see into. Without it, inductor inlines the computation of a layer's
    input (embedding lookup, RMSNorm, residual add, SiLU) into the row-sum loop, and so recomputes it once
    per *output* row: the whole-model int8 step then ran 1.4x slower than torch's int8 kernel.
    aten.detach_copy has no inductor lowering (torch 2.13), so it runs as a call into ATen from the
    generated code (a few microseconds); a Python custom op did the same at ~85 us a call."""
    return torch.ops.aten.detach_copy(x)


def row_split(n_out: int) -> int:
    """How many blocks of output rows (independent sums) a product of n_out outputs is cut into."""
    return ROW_SPLIT if n_out % ROW_SPLIT == 0 else 1


class RowSumLinear(nn.Module):
    """nn.Linear(W) without bias whose one-row product, compiled, is ROW_SPLIT sums over K (see the module
    docstring). The weight is nn.Linear's own (out, in) parameter, shared, not copied."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        if weight.dim() != 2:
            raise ValueError(f"weight must be (out_features, in_features); got shape {tuple(weight.shape)}")
        self.weight = weight  # (N, K)

    def forward(self, x):  # (..., K) -> (..., N)
        N, K = self.weight.shape
        if x.numel() != K or not torch.compiler.is_compiling():  # several rows, or eager: the library kernel
            return F.linear(x, self.weight)
        lead = x.shape[:-1]
        row = materialized(x).reshape(1, K)  # (1, K): computed once, not once per output row
        R = row_split(N)
        n = N // R
        blocks = [(row * self.weight[r * n : (r + 1) * n]).sum(-1) for r in range(R)]  # R x (n,)
        return torch.cat(blocks).reshape(*lead, N)
