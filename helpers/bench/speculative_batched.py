"""Rows for chapter 12's Going deeper H: how speculative decoding's gain changes with the batch size, the
batched greedy loop (helpers.speculative.batched, rows accepting in lockstep) against plain batched greedy
decoding of the same B prompts, and the two reasons the gain shrinks: the round's cost in batch-B steps, and
the tokens a lockstep round commits."""

from __future__ import annotations

from functools import partial

import torch

from ..measure.timing import median, time_interleaved, timed
from .rows import Row


def equal_length_prompts(tok, n_prompts: int, length: int) -> torch.Tensor:
    """(n_prompts, length) ids: the first `length` tokens of the first validation files long enough."""
    from ..data import validation_documents

    rows = [ids[:length] for ids in (tok.encode(d[:2000], bos=True) for d in validation_documents())]
    rows = [r for r in rows if len(r) == length][:n_prompts]
    if len(rows) < n_prompts:
        raise ValueError(f"n_prompts: only {len(rows)} validation files have {length} tokens; asked for {n_prompts}")
    return torch.tensor(rows)


@torch.inference_mode()
def round_costs(target, draft, prompts: torch.Tensor, gamma: int, repeats: int) -> tuple[float, float]:
    """(v, c) at batch B = len(prompts): a target pass over gamma + 1 tokens per row, and a draft step, each
    over a target step of one token per row, all at batch B after the prompts (timed interleaved, in blocks)."""
    from ..kv_cache import KVCache

    B, T = prompts.shape
    caches = {m: KVCache.for_model(m, B, T + gamma + 1) for m in (target, draft)}
    for m, cache in caches.items():
        m(prompts, cache=cache, last_only=True, check=False)
    nxt = torch.zeros(B, gamma + 1, dtype=torch.long, device=prompts.device)  # (B, gamma + 1)

    def step(m, n):
        def run():
            caches[m].truncate(T)
            m(nxt[:, :n], cache=caches[m], check=False)

        return run

    tv, td, t1 = time_interleaved(
        [step(target, gamma + 1), step(draft, 1), step(target, 1)], prompts.device, repeats, warmup=2, block=3
    )
    return median(tv) / median(t1), median(td) / median(t1)


def rows_speculative_batched(
    target, draft, tok, n_new: int, repeats: int, progress, batches=(1, 8, 32), gamma: int = 3, prompt_len: int = 64
) -> list[Row]:
    """Per batch size B: greedy speculative decoding of B prompts at once (lockstep acceptance) against plain
    batched greedy `generate` of the same prompts, interleaved, same tokens checked. The note gives what
    explains the ratio: tokens committed per round in lockstep and per row (the same rounds), the round's
    cost v (verify) and c (draft step) in batch-B target steps, and the bound E / (v + gamma c) they allow, with E
    the lockstep tokens per round and with E per row (what ragged per-row acceptance could reach)."""
    from ..generate import generate
    from ..speculative.batched import batched_speculative_generate

    prompts = equal_length_prompts(tok, max(batches), prompt_len).to(target.device)
    rows = []
    for B in batches:
        p = prompts[:B]
        plain = partial(generate, target, p, n_new)
        spec = partial(batched_speculative_generate, target, draft, p, n_new, gamma=gamma)
        tb, tc, same, st = [], [], True, None
        spec()  # warm: the first batched call allocates
        for _ in range(repeats):
            seconds, out_b = timed(plain, target.device)
            tb.append(seconds)
            seconds, (out_c, st) = timed(spec, target.device)
            tc.append(seconds)
            same &= torch.equal(out_b, out_c)
        v, c = round_costs(target, draft, p, gamma, 10 * repeats)
        e = st.lockstep_tokens_per_round
        bound, row_bound = e / (v + gamma * c), st.per_row_tokens_per_round / (v + gamma * c)
        progress()
        rows.append(
            Row(
                f"speculative batched, B={B} vs plain batched",
                f"plain batched generate, B={B}",
                "batched speculative (lockstep)",
                [b / c_ for b, c_ in zip(tb, tc)],
                f"{B * n_new / median(tb):.0f} tok/s",
                f"{B * n_new / median(tc):.0f} tok/s",
                same_output=same,
                note=(
                    f"gamma {gamma}, {e:.2f} tokens/round in lockstep ({st.per_row_tokens_per_round:.2f} per row, "
                    f"same rounds); verify v {v:.2f}, draft c {c:.2f} batch-{B} steps: allow {bound:.2f}x "
                    f"({row_bound:.2f}x accepting per row)"
                ),
                extra={
                    "batch_size": B,
                    "gamma": gamma,
                    "lockstep_tokens_per_round": e,
                    "per_row_tokens_per_round": st.per_row_tokens_per_round,
                    "verify_over_step": v,
                    "draft_over_step": c,
                    "cost_model_bound": bound,
                    "per_row_bound": row_bound,
                },
            )
        )
    return rows


def main(argv=None) -> None:
    """python -m helpers.bench.speculative_batched [--batches 1,2,4,8,16,32] [--new 128] [--repeats 3]: these rows
    alone, on the course models, one torch thread."""
    import argparse

    from ..checkpoint import load_model
    from ..course.notebook import setup

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--batches", default="1,2,4,8,16,32", help="comma-separated batch sizes (at most 32)")
    parser.add_argument("--new", type=int, default=128, help="new tokens per row")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats per batch size")
    parser.add_argument("--gamma", type=int, default=3, help="draft tokens per round")
    args = parser.parse_args(argv)
    device = setup(threads=1)
    target, tok = load_model("target", device=device, dtype=torch.float32)
    draft, _ = load_model("draft", device=device, dtype=torch.float32)
    batches = tuple(int(b) for b in args.batches.split(","))
    for row in rows_speculative_batched(
        target, draft, tok, args.new, args.repeats, lambda: None, batches=batches, gamma=args.gamma
    ):
        print(row.line(), flush=True)


if __name__ == "__main__":
    main()
