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

A few rows (a speculative verify pass of 2-8 tokens, a short prefill) take the same loop across rows:
y[m] = (x[m] * W).sum(-1) for each of the M rows, M sums of one loop shape, which inductor runs as ONE loop
over W with M accumulators (the generated code loads each vector of W once and multiplies it into all M
rows), so W is streamed once for all M rows, where the library's few-row kernels were slow for these
shapes: the course model's compiled 4-token verify pass cost 1.28-1.54 one-token steps instead of
2.47-2.93, the 2-token one 1.08-1.29 instead of 2.35-3.07 (two runs, one thread, interleaved, 2-core AMD
Zen 5 VM shared with other jobs). A whole T-token forward through the library's kernels took 2.0-2.2x as long at
T = 6, 1.7x at 8, 1.3x at 12 and 1.06-1.09x at 16; above MAX_SUM_ROWS (8) the layer calls F.linear, as
the gain shrinks while the generated code (and its cold compile) grows with M: the M sums of every
product are unrolled, M x 25 of them in the course model's graph. The cold compile this adds, same VM
loaded: the 2- and 4-token graphs 33-34 s each against 23-24 s with the library's kernels, an 8-token
graph 68 s against 20 s (the one-token step: 52-55 s); from inductor's on-disk cache each loads in seconds.

RowSumLinear uses all this only while compiling. Eagerly the broadcast product would be materialized,
(N, K) floats, so there (and for more than MAX_SUM_ROWS rows: a long prefill, a big batch) it is
F.linear over the same weight: equal to float rounding, the sums adding in another order.
quantize/'s "fused_dequant" kernel is the one-row loop with a dequantization inside it; its layers are
not nn.Linear, so this module leaves them as they are (their several-row products keep their kernels).

Tried and not kept: a barrier inside the generated code in place of `materialized`'s extern call
(prims.inductor_force_stride_order realizes the layer's input as a buffer of the generated kernel, and
the step became one generated function with no extern call) made the course model's step 0.92x as
fast (0.79 against 0.86 ms, interleaved, same logits), the 4-token verify pass 0.97-1.03x.

Out of scope: GPUs (the graph becomes a Triton kernel there; FastGenerator keeps torch's kernel), and
many rows at once (torch's library kernels are faster once the weight is reused across many rows).
"""

from __future__ import annotations

import logging

import torch
import torch.nn as nn
import torch.nn.functional as F

ROW_SPLIT = 4  # output rows in this many blocks, one accumulator each (quantize/'s fused_dequant uses it too)
MAX_SUM_ROWS = 8  # compiled products of up to this many rows are generated sums (see RowSumLinear)


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
        M = x.numel() // K
        if M > MAX_SUM_ROWS or not torch.compiler.is_compiling():  # many rows, or eager: the library kernel
            return F.linear(x, self.weight)
        lead = x.shape[:-1]
        rows = materialized(x).reshape(M, K)  # (M, K): computed once, not once per output row
        if M > 1:  # one sum per row, one loop over W for all of them: M accumulators, no blocks needed
            return torch.stack([(rows[m] * self.weight).sum(-1) for m in range(M)]).reshape(*lead, N)  # (M, N)
        R = row_split(N)
        n = N // R
        blocks = [(rows * self.weight[r * n : (r + 1) * n]).sum(-1) for r in range(R)]  # R x (n,)
        return torch.cat(blocks).reshape(*lead, N)
