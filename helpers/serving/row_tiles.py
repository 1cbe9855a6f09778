"""Batch-invariant matmuls: the numbers of rows for which every row comes out the same, found by trying them.

A row of `x @ W.T` is a sum over the inner dimension, and the BLAS picks its kernel, and so the order of
that sum, by the shape of the call: the number of rows M included. So the same row, alone (M = 1) or
among 31 others (M = 32), can come out different in the last bits, and a near-tie then flips a greedy
token. The engine's batch-invariant mode therefore never lets M vary over a range the library treats
differently. Which range that is depends on the library, its version and the CPU, so it is measured:

    lo, hi = invariant_widths(model, max_rows=256, fallback=32)

runs each row-wise function the engine applies to a step's rows (norm + fused QKV, output projection,
norm + MLP, final norm + head; once per distinct module type and weight shape) on random rows for every
M from hi down to 1, and keeps the smallest lo such that for every M in [lo, hi] each row equals, bit for
bit, the same row computed among hi rows. A row's output depends only on that row's input and the order
of the sums, and random inputs make any change of order show in the last bits, so trying every M in the
range checks every shape a step can call. `tiled` then runs a step's rows in tiles of at most hi rows,
zero-padded to at least lo (with MKL on x86, lo is a few rows: the smallest M take other kernels). Where no
lo <= fallback works, it returns (fallback, fallback): every call gets exactly `fallback` rows, the same
shape whatever the step holds (the fixed tile, which costs the padding of every small step).

Left out: another thread count or process (the probe's result is kept per process and thread count;
a library that chose its kernel by something other than the shapes, e.g. by the inputs' alignment, is
assumed not to: torch's allocations are all aligned the same way), and non-row-wise layers.
"""

from __future__ import annotations

import torch

from .. import many_rows

MAX_PROBE_ROWS = 256  # tiles are at most this many rows: the probe tries every M up to it
_found: dict[tuple, int] = {}  # signature of a row-wise function -> its smallest invariant M


def row_functions(model) -> list[tuple[tuple, int]]:
    """The row-wise functions a step applies, as (modules applied in order, input width), head last."""
    out = []
    for layer in model.layers:
        attn = layer.attn
        out += [
            ((layer.attn_norm, attn.wqkv), model.cfg.d_model),
            ((attn.wo,), attn.n_heads * attn.head_dim),
            ((layer.mlp_norm, layer.mlp), model.cfg.d_model),
        ]
    return out + [((model.norm, model.head), model.cfg.d_model)]


def apply(fns, x: torch.Tensor) -> torch.Tensor:
    for fn in fns:
        x = fn(x)
    return x


@torch.no_grad()
def smallest_invariant_rows(fns, width: int, hi: int, device=None, dtype=torch.float32) -> int:
    """The smallest lo such that for every M in [lo, hi], fns applied to M random rows gives each row bit
    for bit what it gives that row among hi rows. hi when even M = hi - 1 differs."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(hi, width, generator=g).to(device=device, dtype=dtype)  # (hi, width)
    ref = apply(fns, x)  # (hi, out)
    for m in range(hi - 1, 0, -1):
        if not torch.equal(apply(fns, x[:m]), ref[:m]):
            return m + 1
    return 1


def _signature(fns, width: int, hi: int) -> tuple:
    params = tuple(
        (type(fn).__name__, tuple((tuple(p.shape), p.dtype, p.stride(), str(p.device)) for p in fn.parameters()))
        for fn in fns
    )
    return params, width, hi, torch.get_num_threads()


def invariant_widths(model, max_rows: int, fallback: int) -> tuple[int, int]:
    """(lo, hi) for `tiled`: hi = max(fallback, min(max_rows, MAX_PROBE_ROWS, many_rows.MIN_ROWS - 1)), lo the
    smallest M from which every row-wise function of the step is invariant up to hi (the head up to
    `fallback` rows, the most it sees: one per request); (fallback, fallback) when that lo would exceed
    fallback. Measured once per process, thread count and function signature (about a second for the course
    model)."""
    for name, value in (("max_rows", max_rows), ("fallback", fallback)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1; got {value!r}")
    # tiles stay under many_rows.MIN_ROWS: from there the projections multiply through oneDNN, whose sums add
    # in another order, so a range crossing it is never invariant (probed: it sent every step to the fallback)
    hi = max(fallback, min(max_rows, MAX_PROBE_ROWS, many_rows.MIN_ROWS - 1))
    funcs = row_functions(model)
    lo = 1
    for i, (fns, width) in enumerate(funcs):
        top = fallback if i == len(funcs) - 1 else hi  # the head sees at most one row per request
        key = _signature(fns, width, top)
        if key not in _found:
            _found[key] = smallest_invariant_rows(fns, width, top, model.device, model.dtype)
        lo = max(lo, _found[key])
        if lo > fallback:
            return fallback, fallback
    return lo, hi


def padding(n: int, widths: tuple[int, int]) -> int:
    """Zero rows to add to n rows so that cut into tiles of hi rows, every tile has at least lo."""
    lo, hi = widths
    r = n % hi
    return lo - r if 0 < r < lo else 0


def tiled(fns, x: torch.Tensor, widths: tuple[int, int] | None) -> torch.Tensor:
    """The row-wise modules fns applied in order to x (N, C_in), on tiles of lo to hi rows (x zero-padded
    as `padding` says; the padding rows are dropped); widths None: to x at once. A zero row is harmless:
    RMSNorm of 0 is 0 (its eps keeps the division finite)."""
    N = x.shape[0]
    if widths is None or widths[0] <= N <= widths[1]:  # one tile: no copies
        return apply(fns, x)
    pad = padding(N, widths)
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])  # (N + pad, C_in)
    return torch.cat([apply(fns, t) for t in x.split(widths[1])])[:N]  # (N, C_out)
