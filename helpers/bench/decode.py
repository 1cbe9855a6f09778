"""Rows for chapters 04-05: the KV cache against recomputing, and our loops against transformers' generate."""

from __future__ import annotations

import torch

from ..measure.timing import median, step_seconds, time_interleaved, timed
from .rows import Row, ratios


@torch.no_grad()
def per_token_times(model, prompt_ids, n_new: int, use_cache: bool) -> list[float]:
    """Seconds for each generated token (greedy), with or without the KV cache: the first is the prefill (the
    whole prompt; recomputed or cached), each later one a step over the sequence so far (recomputed) or one
    token (cached)."""
    from ..generate import as_prompt_tensor, decode_one_token, prefill
    from ..kv_cache import KVCache

    device = model.device
    seq = as_prompt_tensor(prompt_ids, model)  # (1, T)
    if use_cache:
        cache = KVCache.for_model(model, max_seq_len=seq.shape[1] + n_new)
        first, logits = timed(lambda: prefill(model, seq, cache), device)  # (1, V)
        token = logits.argmax(-1, keepdim=True)  # (1, 1)
        later = step_seconds(lambda t: decode_one_token(model, t, cache), token, n_new - 1, device) if n_new > 1 else []
        return [first] + later

    def append_greedy(s, logits):  # (1, T), (1, V) -> (1, T + 1)
        return torch.cat([s, logits.argmax(-1, keepdim=True)], dim=1)

    return step_seconds(
        lambda s: model(s, last_only=True, check=False)[:, -1], seq, n_new, device, advance=append_greedy
    )


def row_cache_vs_recompute(model, tok, n_new: int, repeats: int, progress) -> tuple[Row, dict]:
    prompt = tok.encode("import os\n", bos=True)
    n_new = min(n_new, model.cfg.max_seq_len - len(prompt))  # the whole context window at most
    cached_runs, uncached_runs = [], []
    for _ in range(repeats):
        uncached_runs.append(per_token_times(model, prompt, n_new, use_cache=False))
        cached_runs.append(per_token_times(model, prompt, n_new, use_cache=True))
        progress()
    tb = [sum(r) for r in uncached_runs]
    tc = [sum(r) for r in cached_runs]
    k = min(64, n_new // 4)
    cached_med = [median(x) for x in zip(*cached_runs)]
    growth = median(cached_med[-k:]) / median(cached_med[1 : k + 1])
    row = Row(
        f"KV cache vs recompute, {n_new} tokens",
        "recompute",
        "KV cache",
        ratios(tb, tc),
        f"{n_new / median(tb):.0f} tok/s",
        f"{n_new / median(tc):.0f} tok/s",
        target=15.0 if n_new >= 1000 else None,
        note=f"cached per-token time, last {k} / first {k}: {growth:.2f}x (goal <= 1.5)",
        extra={"cached_growth": growth},
    )
    curves = {"cached": cached_med, "uncached": [median(x) for x in zip(*uncached_runs)]}
    return row, curves


def row_vs_transformers(model, tok, n_new: int, repeats: int, fast, progress) -> list[Row]:
    from ..generate import generate
    from ..hf import to_hf_llama

    hf = to_hf_llama(model)
    prompt = torch.tensor([tok.encode("def main():\n", bos=True)], device=model.device)

    def theirs():
        return hf.generate(prompt, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False)

    def ours():
        return generate(model, prompt, n_new)

    ref = theirs()
    rows = []
    candidates = [("helpers eager loop", ours)]
    if fast is not None:
        candidates.append(("helpers compiled step", lambda: fast.generate(prompt, n_new)))
    for label, fn in candidates:
        same = torch.equal(fn(), ref)
        tb, tc = time_interleaved([theirs, fn], model.device, repeats)
        progress()
        rows.append(
            Row(
                f"{label} vs transformers generate",
                "HF generate",
                label,
                ratios(tb, tc),
                f"{n_new / median(tb):.0f} tok/s",
                f"{n_new / median(tc):.0f} tok/s",
                target=3.0,
                same_output=same,
                note=f"{n_new} greedy tokens",
            )
        )
    return rows
