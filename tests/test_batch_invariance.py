"""Engine(batch_invariant=True): a request's logits are bit for bit the same alone and in a busy batch.

Each request of a small workload runs alone in its own engine, then all of them together in one engine
with few KV blocks (so requests are preempted and recompute), and every step's logits row of every
request (recorded by a logits processor) must be equal bit for bit, and so its greedy tokens. The same
comparison outside the mode is printed, not asserted: whether the BLAS's blocking changes a row's sum with
the number of rows depends on the machine (on x86 with MKL or oneDNN it usually does).
"""

from __future__ import annotations

import pytest
import torch
from conftest import LogitRecorder

from helpers import load_model, many_rows
from helpers.serving import Engine
from helpers.serving.params import InvalidParameter
from helpers.serving.row_tiles import invariant_widths, smallest_invariant_rows, tiled
from helpers.serving.workload import make_workload

MAX_SEQS = 8
BUSY_BLOCKS = 24  # 384 token slots for 8 running requests of up to 152 tokens: some are preempted


@pytest.fixture(scope="module")
def model_and_workload():
    model, tok = load_model("target")
    return model, make_workload(tok, 16, prompt_len=(16, 128), output_len=(8, 24), seed=3)


def run(model, workload, alone: bool, **engine_args):
    """(outputs, recorders, preemptions): every request alone in a fresh engine, or all in one engine."""
    outputs, recorders, rids, preemptions = [], [], [], 0
    engine = None
    for w in workload:
        if alone or engine is None:
            engine = Engine(model, num_blocks=512 if alone else BUSY_BLOCKS, max_num_seqs=MAX_SEQS, **engine_args)
        rec = LogitRecorder()
        rid = engine.submit(w.prompt, w.max_tokens, logits_processors=[rec])
        recorders.append(rec)
        rids.append(rid)
        if alone:
            engine.run()
            outputs.append(engine.get(rid).output)
    if not alone:
        engine.run()
        outputs = [engine.get(rid).output for rid in rids]
        preemptions = engine.scheduler.num_preemptions
    return outputs, recorders, preemptions


def count_differing(a, b):
    """(requests whose tokens differ, requests with any logits row not bitwise equal)."""
    tokens = sum(x != y for x, y in zip(a[0], b[0]))
    logits = sum(
        len(x.rows) != len(y.rows) or any(not torch.equal(p, q) for p, q in zip(x.rows, y.rows))
        for x, y in zip(a[1], b[1])
    )
    return tokens, logits


@pytest.mark.parametrize("decode_attention", [None, "gather"])
def test_alone_equals_busy_bitwise(model_and_workload, decode_attention):
    model, wl = model_and_workload
    alone = run(model, wl, True, batch_invariant=True, decode_attention=decode_attention)
    busy = run(model, wl, False, batch_invariant=True, decode_attention=decode_attention)
    assert busy[2] > 0, "the busy run was meant to preempt (its replay is part of the guarantee)"
    assert [len(r.rows) for r in busy[1]] == [w.max_tokens for w in wl]
    tokens, logits = count_differing(alone, busy)
    assert (tokens, logits) == (0, 0), f"in the mode {tokens} outputs and {logits} logit traces of {len(wl)} differ"
    if decode_attention is None:  # the same comparison outside the mode, for the record
        plain = count_differing(
            run(model, wl, True, decode_attention=decode_attention),
            run(model, wl, False, decode_attention=decode_attention),
        )
        print(f"\noutside the mode: {plain[0]} outputs and {plain[1]} logit traces of {len(wl)} differ (alone vs busy)")


def test_bad_arguments_name_the_parameter(model_and_workload):
    model, _ = model_and_workload
    cases = [
        (dict(batch_invariant="yes"), "batch_invariant"),
        (dict(batch_invariant=True, enable_prefix_caching=True), "batch_invariant"),
        (dict(batch_invariant=True, policy="static"), "batch_invariant"),
        (dict(batch_invariant=True, max_num_seqs=32, max_num_batched_tokens=32), "max_num_batched_tokens"),
    ]
    for kwargs, param in cases:
        with pytest.raises(InvalidParameter) as err:
            Engine(model, num_blocks=64, **kwargs)
        assert err.value.param == param, kwargs


class ChangesBelow(torch.nn.Module):
    """A row-wise function whose rows change when it sees fewer than `m` rows at once,
    as a BLAS's small-M kernel can (there in the last bits): the probe must find m."""

    def __init__(self, m: int):
        super().__init__()
        self.m = m

    def forward(self, x):
        return x * 3.0 if x.shape[0] >= self.m else x * 3.0 + 1e-3


def test_probe_finds_where_rows_change(model_and_workload):
    model, _ = model_and_workload
    for m in (1, 5, 31):
        assert smallest_invariant_rows((ChangesBelow(m),), width=16, hi=32) == m
    x = torch.randn(35, 16)
    rows = tiled((ChangesBelow(5),), x, (5, 16))  # tiles of 16, 16 and 5 rows: the last 3 padded to 5
    assert torch.equal(rows, x * 3.0) and not torch.equal(tiled((ChangesBelow(5),), x[:3], None), x[:3] * 3.0)
    lo, hi = invariant_widths(model, max_rows=256, fallback=MAX_SEQS)
    assert 1 <= lo <= hi and hi >= MAX_SEQS
    # a range found below the rows where the projections switch library (many_rows.py), or the fixed tile
    assert lo == hi == MAX_SEQS or hi == many_rows.MIN_ROWS - 1, (lo, hi)
