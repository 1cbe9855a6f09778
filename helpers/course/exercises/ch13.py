"""Chapter 13's exercise checks (batching and serving). Worked solutions are in
notebooks/solutions/13_batching_and_serving_solutions.ipynb. Each check prints one line; a wrong answer
says what is off, never the value."""

from __future__ import annotations

import math

import torch

from . import FROM_NOTEBOOK, exercise, prediction


def check_1(blocks_held=FROM_NOTEBOOK):
    return exercise(
        "13.1",
        blocks_held,
        lambda a: int(a) == a and a == math.ceil((37 + 20 - 1) / 16),
        hint="KV is stored for the prompt and every generated token but the last",
        name="blocks_held",
    )


def check_2(wasted_share=FROM_NOTEBOOK):
    lengths = [5, 40, 12, 40]
    right = 1 - sum(lengths) / (len(lengths) * max(lengths))
    return exercise(
        "13.2",
        wasted_share,
        lambda a: abs(float(a) - right) < 1e-9,
        hint="every row runs as many steps as the longest",
        name="wasted_share",
    )


def check_3(tokens_skipped=FROM_NOTEBOOK):
    from ...serving import prefix_hashes

    first, second = list(range(70)) + [1] * 30, list(range(70)) + [2] * 30  # 70 shared tokens, 100 each
    usable = (len(second) - 1) // 8  # the last prompt token is always computed (it yields the first logits)
    equal = sum(1 for a, b in zip(prefix_hashes(first, 8)[:usable], prefix_hashes(second, 8)) if a == b)
    return exercise(
        "13.3",
        tokens_skipped,
        lambda a: int(a) == a and a == 8 * equal,
        hint="only full blocks are cached, and a block's hash covers everything before it",
        name="tokens_skipped",
        notice="the 6 shared tokens of the 9th block are prefilled again: only whole blocks are shared",
    )


def _partial(q, k, v):
    """The block loop's state over keys k, values v (Hkv, S, D) for q (Hkv, G, D): (m, l, acc)."""
    s = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5  # (Hkv, G, S)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    return m, p.sum(-1, keepdim=True), p @ v


def check_4(merge_partials=FROM_NOTEBOOK):
    def right(fn):
        g = torch.Generator().manual_seed(13)
        for S, cut, scale in ((40, 7, 1.0), (100, 90, 8.0), (33, 1, 30.0)):  # scale: one half's max far above
            q = torch.randn(2, 4, 16, generator=g) * scale  # (Hkv, G, D)
            k, v = torch.randn(2, S, 16, generator=g), torch.randn(2, S, 16, generator=g)
            whole = torch.softmax(q @ k.transpose(1, 2) / 4.0, dim=-1) @ v  # (Hkv, G, D)
            merged = fn(_partial(q, k[:, :cut], v[:, :cut]), _partial(q, k[:, cut:], v[:, cut:]))
            assert isinstance(merged, tuple) and len(merged) == 3, "return a tuple (m, l, acc)"
            _, l, acc = merged
            assert torch.isfinite(acc / l).all(), "acc / l is not finite: rescale both parts to the larger max"
            assert (acc / l - whole).abs().max() < 1e-4, (
                "acc / l differs from attention over the whole context: each part must be rescaled by exp(m_part - m)"
            )
        return True

    return exercise(
        "13.4",
        merge_partials,
        right,
        name="merge_partials",
        hint="the merged max is the larger of the two; each part's l and acc scale by exp(its m - that max)",
        notice="the merge is associative, so any number of parts, on any number of cores, combine "
        "in any order: flash-decoding's second pass",
    )


def check_5(predicted_ratio=FROM_NOTEBOOK):
    """A prediction checked by a measurement: the in-place kernel over 8 requests of 1,024 tokens against 32 of
    256 (the same keys in all, so the same bytes and the same cache behaviour on any machine)."""
    from ...checkpoint import load_model
    from ...measure.timing import median, time_interleaved
    from ...serving.paged_attention import paged_decode_attention
    from ...serving.step_profile import scattered_decode_batch

    def measure():
        model = load_model("target")[0]
        H, D = model.cfg.n_heads, model.cfg.head_dim
        calls = []
        for batch, context in ((32, 256), (8, 1024)):
            pool, chunks = scattered_decode_batch(model, batch, context, 16)
            tables = pool.padded_tables([c.block_table for c in chunks])
            lengths = torch.full((batch,), context)
            q = torch.randn(batch, H, D)
            calls.append(lambda p=pool, t=tables, n=lengths, q=q: paged_decode_attention(q, p.k[0], p.v[0], t, n, 16))
        many_short, few_long = time_interleaved(calls, "cpu", repeats=41)
        return median(few_long) / median(many_short)

    return prediction(
        "13.5",
        predicted_ratio,
        measure,
        within=(0.6, 1.5),
        name="predicted_ratio",
        hint="what does the kernel do per cached key, and how many keys does each case read in all?",
        notice=lambda r: (
            "a decode step's attention costs what the batch's contexts add up to, "
            "however they are split: the scheduler's KV budget is also a time budget"
        ),
    )
