"""The batch-1 matrix-vector product written as a sum that torch.compile fuses into one loop per product.

At batch 1 (one input row x, (1, K)) a projection's output is y[n] = sum_k x[k] W[n, k]. Written as
elementwise work and a reduction, inductor generates one vectorized C++ loop per product that streams the
weights once, accumulating in registers: no library call and nothing packed at compile time, so the
generated code is an ordinary cacheable graph (inductor's FX graph cache keeps it across processes).

How the sum is written decides how fast that loop runs. Over nn.Linear's own (out, in) weight,
`(x * W).sum(-1)`, each output is a sum along a row of W, 16 floats per register, closed by a sum across
the register. One row takes a copy of W in panels instead (`panel_copy`, (N / PANEL, K, PANEL), each
panel's K x 16 values contiguous), and the sum y[p, j] = sum_k x[k] Wp[p, k, j] puts 16 outputs in one
register: each step of the loop over K broadcasts x[k] and adds x[k] times the next 16 contiguous
weights. Two details:

- the panels are cut into PANEL_BLOCKS blocks, each its own sum: inductor runs sums of the same loop
  shape in one loop with one accumulator each, so the CPU keeps two independent chains of additions and
  two weight streams going instead of one;
- the input row is `realized` first, written to memory once inside the generated code: otherwise
  inductor inlines the computation of x (RMSNorm, SiLU, a residual add) into the loop and recomputes it
  once per panel. Unlike `materialized` below it is no call out of the generated code.

Where the time went, measured by taking the parts apart: not mostly the sums across registers (more
accumulators and shorter chains over W's rows bought nothing), but the weight streams and the extern
copy: panels with the extern copy were 0.98-1.07x the row sums, the row sums with `realized` 1.04-1.13x,
both together 1.13-1.24x.

Measured, one thread, interleaved, same greedy tokens (2-core AMD Zen 5 VM): the course model's compiled step
1.13-1.24x faster with the panels than with sums over W's rows (six runs; on par with inductor's autotuned
GEMM, 1.19-1.23x in two of them; 1.22x in a seventh, quiet), the 149M random config's 1.04-1.15x (1.11x
quiet). The cost is a second copy of every projection's weight (19 MB for the course model), read instead of
the first by the compiled few-row products. Where N is not a multiple of PANEL * PANEL_BLOCKS the layer sums
over W's rows, in ROW_SPLIT blocks of output rows, after `materialized` (an extern copy; `realized` there was
once measured 0.92x as fast, on another layout).

A few rows (a speculative verify pass of 2-8 tokens, a short prefill) take the same loop across rows, one sum
per row, M sums of one loop shape, which inductor runs as ONE loop over the weights with M accumulators (the
generated code loads each vector of weights once and multiplies it into all M rows), so the weights are
streamed once for all M rows. Over the panels the course model's 4-token verify pass took 0.85 ms where the
same sums over W's rows took 1.03 (1.44 against 1.68 one-token steps of each generator; quiet, interleaved).
Before both, the library's few-row kernels were slow for these shapes: the course model's compiled 4-token
verify pass cost 1.28-1.54 one-token steps instead of 2.47-2.93, the 2-token one 1.08-1.29 instead of
2.35-3.07 (two runs, one thread, interleaved, 2-core AMD Zen 5 VM shared with other jobs). A whole T-token
forward through the library's kernels took 2.0-2.2x as long at T = 6, 1.7x at 8, 1.3x at 12 and 1.06-1.09x at
16; above MAX_SUM_ROWS (8) the layer calls many_rows.linear (F.linear; oneDNN's GEMM from 128 rows), as the
gain shrinks while the generated code (and its cold compile) grows with M: the M sums of every product are
unrolled, M x 25 of them in the course model's graph. The cold compile this adds, same VM loaded: the 2- and
4-token graphs 33-34 s each against 23-24 s with the library's kernels, an 8-token graph 68 s against 20 s
(the one-token step: 52-55 s); from inductor's
on-disk cache each loads in seconds.

RowSumLinear uses all this only while compiling. Eagerly the broadcast product would be materialized,
(N, K) floats, so there (and for more than MAX_SUM_ROWS rows: a long prefill, a big batch) it is
many_rows.linear over the same weight: equal to float rounding, the sums adding in another order.
quantize/'s "fused_dequant" kernel is the one-row loop with a dequantization inside it; its layers are
not nn.Linear, so this module leaves them as they are (their several-row products keep their kernels).

Tried and not kept, for the one-row layout: sums over a plain transposed copy (K, N) (inductor vectorizes
along N, but each step of the loop over K jumps a whole row of the copy: 0.39-0.74x the row sums on four
of the course model's five product shapes), panels of 64, 4 or 8 blocks, and no barrier (0.99-1.02x).

Out of scope: GPUs (the graph becomes a Triton kernel there; FastGenerator keeps torch's kernel), and
many rows at once (torch's library kernels are faster once the weight is reused across many rows).
"""

from __future__ import annotations

import logging

import torch
import torch.nn as nn

from . import many_rows

ROW_SPLIT = 4  # output rows in this many blocks, one accumulator each (quantize/'s fused_dequant uses it too)
MAX_SUM_ROWS = 8  # compiled products of up to this many rows are generated sums (see RowSumLinear)
PANEL = 16  # output rows per panel of the one-row layout: one AVX-512 register of float32
PANEL_BLOCKS = 2  # the panels in this many blocks, one sum each: two weight streams, two accumulators


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


def panel_copy(weight: torch.Tensor) -> torch.Tensor:
    """W (N, K) as panels of PANEL output rows, (N // PANEL, K, PANEL), each panel's K x PANEL values
    contiguous: panel p, row k holds W[p * PANEL : (p + 1) * PANEL, k]. A copy, cut from the graph."""
    N, K = weight.shape
    return weight.detach().t().reshape(K, N // PANEL, PANEL).permute(1, 0, 2).contiguous()


def realized(rows: torch.Tensor) -> torch.Tensor:
    """The input rows (M, K) as a buffer of the generated code: computed once, like `materialized`, but
    with no call out of the generated code (prims.inductor_force_stride_order, a layout constraint that
    inductor meets by writing the rows to memory)."""
    return torch.ops.prims.inductor_force_stride_order(rows, (rows.shape[-1], 1))


class RowSumLinear(nn.Module):
    """nn.Linear(W) without bias whose compiled products of one to MAX_SUM_ROWS rows are sums inductor
    generates (see the module docstring), over a panel copy of W (`panels`, when N is a multiple of
    PANEL * PANEL_BLOCKS; else over W itself); more rows and eager calls take F.linear over the (out, in)
    weight, nn.Linear's own parameter, shared."""

    def __init__(self, weight: torch.Tensor, panels: bool = True):
        super().__init__()
        if weight.dim() != 2:
            raise ValueError(f"weight must be (out_features, in_features); got shape {tuple(weight.shape)}")
        self.weight = weight  # (N, K)
        N, K = weight.shape
        self.panels = None  # (N // PANEL, K, PANEL) or None
        if panels and N % (PANEL * PANEL_BLOCKS) == 0:  # a parameter so that freezing makes it a constant
            self.panels = nn.Parameter(panel_copy(weight), requires_grad=False)

    def forward(self, x):  # (..., K) -> (..., N)
        N, K = self.weight.shape
        M = x.numel() // K
        if M > MAX_SUM_ROWS or not torch.compiler.is_compiling():  # many rows, or eager: a library's kernel
            return many_rows.linear(x, self.weight)  # F.linear, or oneDNN's GEMM for many rows (many_rows.py)
        lead = x.shape[:-1]
        if self.panels is not None:
            # y[p, j] = sum_k x[k] Wp[p, k, j]: PANEL outputs in one vector register, x[k] broadcast, so no
            # sum across a register per output; one row: the panels in PANEL_BLOCKS blocks, one stream each;
            # M rows: one sum per row, all M in one loop over the panels (each weight vector read once)
            rows = realized(x.reshape(M, K))  # (M, K): computed once
            if M > 1:
                sums = [(rows[m].reshape(1, K, 1) * self.panels).sum(1).reshape(N) for m in range(M)]
                return torch.stack(sums).reshape(*lead, N)  # (..., N)
            row = rows.reshape(1, K, 1)
            P = N // PANEL
            p = P // PANEL_BLOCKS
            blocks = [(row * self.panels[b * p : (b + 1) * p]).sum(1) for b in range(PANEL_BLOCKS)]  # (p, PANEL)
            return torch.cat(blocks).reshape(*lead, N)
        rows = materialized(x).reshape(M, K)  # (M, K): computed once, not once per output row
        if M > 1:  # one sum per row, one loop over W for all of them: M accumulators, no blocks needed
            return torch.stack([(rows[m] * self.weight).sum(-1) for m in range(M)]).reshape(*lead, N)  # (M, N)
        R = row_split(N)
        n = N // R
        blocks = [(rows * self.weight[r * n : (r + 1) * n]).sum(-1) for r in range(R)]  # R x (n,)
        return torch.cat(blocks).reshape(*lead, N)
