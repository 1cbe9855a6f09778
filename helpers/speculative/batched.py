"""Greedy speculative decoding over a batch of B prompts, the rows accepting in lockstep.

    ids, stats = batched_speculative_generate(target, draft, prompts, max_new_tokens=64, gamma=3)
    # prompts: (B, T) ids, every row the same length; ids: (B, T + 64), each row target-greedy

One round, for all B rows at once, on dense batched KVCaches (one per model, one shared length):

1. the draft proposes gamma tokens for every row (gamma batched (B, 1) steps, argmax each);
2. the target scores the B x (gamma + 1) positions in ONE forward pass;
3. row b would accept a_b proposals (the prefix where the draft's argmax equals the target's); the batch
   accepts k = min_b a_b in every row, plus the target's own token at position k;
4. both caches roll back to the committed length, one `truncate` each: every row has the same length.

Each row's output is exactly the target's greedy continuation of its prompt: the k accepted proposals
equal the target's argmax in every row (k <= a_b), and the extra token is the target's argmax after them.
The price of lockstep is acceptance: one row whose draft guessed wrong early ends the round for all B, so
the committed tokens per round fall as B grows (stats.lockstep_tokens_per_round against
stats.per_row_tokens_per_round, what each row alone would have committed in the same rounds).

Out of scope: per-row acceptance (rows of different lengths: a ragged cache, or the paged engine of
chapter 13, which this loop does not use), temperature > 0 sampling (the rule of helpers.speculative.rule
per row, with per-row rollback), prompts of unequal length (pad them yourself: there is no attention mask
here), eos and stop sequences, and compiled steps (the model calls are eager).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..generate import check_generation_length
from ..kv_cache import KVCache
from .rule import check_gamma


@dataclass
class BatchedStats:
    """What happened in one batched generation. accepted[r]: the proposals every row accepted in round r
    (the lockstep minimum); row_accepted[r]: what each row's own draft/target agreement would have accepted
    in that round (B ints); proposed[r]: gamma, or fewer in a last round cut at max_new_tokens."""

    batch_size: int
    proposed: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    row_accepted: list[list[int]] = field(default_factory=list)
    new_tokens: int = 0  # per row

    @property
    def rounds(self) -> int:
        return len(self.proposed)

    @property
    def lockstep_tokens_per_round(self) -> float:
        """Tokens each row committed per target pass: mean of accepted + 1."""
        return sum(k + 1 for k in self.accepted) / self.rounds if self.rounds else float("nan")

    @property
    def per_row_tokens_per_round(self) -> float:
        """The same if every row had kept its own accepted prefix in the same rounds (mean over rows and
        rounds of a_b + 1): what per-row acceptance would commit, round for round."""
        n = sum(len(r) for r in self.row_accepted)
        return sum(a + 1 for r in self.row_accepted for a in r) / n if n else float("nan")


def check_prompts(prompts, model) -> torch.Tensor:
    """(B, T) long ids on the model's device, T >= 1, every id below vocab_size."""
    if isinstance(prompts, (list, tuple)):
        lengths = {len(p) for p in prompts}
        if len(lengths) > 1:
            raise ValueError(f"prompts must all have the same length (no padding here); got lengths {sorted(lengths)}")
        prompts = torch.tensor(prompts, dtype=torch.long)
    if not isinstance(prompts, torch.Tensor) or prompts.dim() != 2 or prompts.shape[0] < 1 or prompts.shape[1] < 1:
        shape = tuple(prompts.shape) if isinstance(prompts, torch.Tensor) else type(prompts).__name__
        raise ValueError(f"prompts must be a (B, T) tensor of ids with B, T >= 1 or a list of equal lists; got {shape}")
    if prompts.dtype != torch.long:
        raise ValueError(f"prompts must hold int64 ids; got dtype {prompts.dtype}")
    V = model.cfg.vocab_size
    if prompts.numel() and not (0 <= int(prompts.min()) and int(prompts.max()) < V):
        raise ValueError(f"prompts must hold ids in [0, {V}); got {int(prompts.min())}..{int(prompts.max())}")
    return prompts.to(model.device)


@torch.inference_mode()
def batched_speculative_generate(
    target, draft, prompts, max_new_tokens: int, *, gamma: int = 3
) -> tuple[torch.Tensor, BatchedStats]:
    """Greedy speculative decoding of B equal-length prompts at once, accepting in lockstep.

    prompts: (B, T) ids (or B lists of T ids). Returns ((B, T + max_new_tokens) ids, BatchedStats); row b
    equals `generate(target, prompts[b:b+1], max_new_tokens)` (greedy) up to float rounding of near-ties.
    """
    check_gamma(gamma, "gamma")
    if draft.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(
            f"draft and target must share a vocabulary; vocab_size {draft.cfg.vocab_size} != {target.cfg.vocab_size}"
        )
    prompts = check_prompts(prompts, target)
    B, T = prompts.shape
    check_generation_length(T, max_new_tokens, target.cfg.max_seq_len)
    check_generation_length(T, max_new_tokens, draft.cfg.max_seq_len, window="the draft model's context window")
    stats = BatchedStats(B)
    if max_new_tokens == 0:
        return prompts.clone(), stats
    end = T + max_new_tokens
    # a round writes at most positions n - 1 .. n + g - 1 < end into either cache
    t_cache = KVCache.for_model(target, B, end)
    d_cache = KVCache.for_model(draft, B, end)
    ids = torch.empty(B, end + gamma + 1, dtype=torch.long, device=prompts.device)  # committed, then proposals
    ids[:, :T] = prompts
    if T > 1:  # everything but the last prompt token: the first round feeds it
        target(prompts[:, :-1], cache=t_cache, last_only=True, check=False)
        draft(prompts[:, :-1], cache=d_cache, last_only=True, check=False)
    n = T  # committed length, the same in every row
    while n < end:
        g = min(gamma, end - n - 1)  # never propose past max_new_tokens
        # 1. draft g proposals per row; the first step also feeds what the draft has not seen (1 or 2 tokens)
        for i in range(g):
            x = ids[:, d_cache.length : n] if i == 0 else ids[:, n + i - 1 : n + i]  # (B, 1 or 2)
            logits = draft(x, cache=d_cache, last_only=True, check=False)  # (B, 1, V)
            ids[:, n + i] = logits[:, -1].argmax(-1)
        # 2. one target pass over the last committed token and the g proposals, for every row
        t_next = target(ids[:, n - 1 : n + g], cache=t_cache, check=False).argmax(-1)  # (B, g + 1)
        # 3. each row's accepted prefix, then the lockstep minimum
        agree = (t_next[:, :g] == ids[:, n : n + g]).long()  # (B, g)
        row_acc = agree.cumprod(dim=1).sum(dim=1)  # (B,)
        k = int(row_acc.min())  # the round's one device -> host read (plus the row counts below)
        ids[:, n + k] = t_next[:, k]  # overwrites the first rejected proposal of the worst row
        stats.proposed.append(g)
        stats.accepted.append(k)
        stats.row_accepted.append(row_acc.tolist())
        n += k + 1
        # 4. roll back: the target has seen all but the new last token; the draft never saw the last proposal
        t_cache.truncate(n - 1)
        d_cache.truncate(min(n - 1, d_cache.length))
    stats.new_tokens = max_new_tokens
    return ids[:, :end].clone(), stats
