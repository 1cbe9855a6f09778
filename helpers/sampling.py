"""Turning logits into the next token: pure functions, no model inside, explicit random generator.

    logits --(penalties)--> --(temperature)--> --(top-k)--> --(top-p)--> --(min-p)--> probs --> token

The order is HuggingFace's: penalties act on raw logits, temperature rescales, then the filters cut
the candidate set (each filter sets the logits it removes to -inf), and softmax renormalises what is
left. Temperature 0 means greedy (argmax), exactly.

Out of scope: beam search, grammar-constrained decoding, batched per-row settings.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off; keep the k most likely tokens
    top_p: float = 1.0  # 1 = off; keep the smallest set whose probability reaches top_p
    min_p: float = 0.0  # 0 = off; keep tokens with probability >= min_p * (top probability)
    repetition_penalty: float = 1.0  # 1 = off; HuggingFace's (CTRL paper) multiplicative penalty
    presence_penalty: float = 0.0  # 0 = off; OpenAI's: subtract once if the token appeared
    frequency_penalty: float = 0.0  # 0 = off; OpenAI's: subtract per previous occurrence

    def __post_init__(self):
        validate_sampling(self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def validate_sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0) -> None:
    import math

    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy); got {temperature!r}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 = off); got {top_k!r}")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 = off); got {top_p!r}")
    if not isinstance(min_p, (int, float)) or not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1] (0 = off); got {min_p!r}")
    if not isinstance(repetition_penalty, (int, float)) or repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0 (1 = off); got {repetition_penalty!r}")


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 here (greedy is handled by the caller); got {temperature}")
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits per row (ties at the k-th value are all kept), -inf elsewhere."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most likely tokens whose probability reaches p.

    A token is dropped when the probability of all tokens more likely than it already reaches p;
    so the most likely token is always kept. (HuggingFace's TopPLogitsWarper computes the same set
    from the other end of the sorted list.)
    """
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above each one
    drop_sorted = mass_before >= p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens whose probability is at least min_p times the most likely token's."""
    if min_p <= 0:
        return logits
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_penalties(logits: torch.Tensor, previous: torch.Tensor | None, repetition_penalty: float = 1.0,
                    presence_penalty: float = 0.0, frequency_penalty: float = 0.0) -> torch.Tensor:
    """Penalise tokens already in `previous` (B, N) token ids.

    repetition (HuggingFace): a seen token's logit is divided by the penalty if positive, multiplied
    if negative (so it always becomes less likely).
    presence / frequency (OpenAI): logit -= presence * [count > 0] + frequency * count.
    """
    if previous is None or previous.numel() == 0:
        return logits
    if repetition_penalty != 1.0:
        seen = torch.gather(logits, -1, previous)
        seen = torch.where(seen < 0, seen * repetition_penalty, seen / repetition_penalty)
        logits = logits.scatter(-1, previous, seen)
    if presence_penalty or frequency_penalty:
        counts = torch.zeros_like(logits).scatter_add_(-1, previous, torch.ones_like(previous, dtype=logits.dtype))
        logits = logits - presence_penalty * (counts > 0).to(logits.dtype) - frequency_penalty * counts
    return logits


def probabilities(logits: torch.Tensor, cfg: SamplingConfig, previous: torch.Tensor | None = None) -> torch.Tensor:
    """The distribution the next token is drawn from, (..., V). Greedy gives a one-hot."""
    logits = logits.float()
    logits = apply_penalties(logits, previous, cfg.repetition_penalty, cfg.presence_penalty, cfg.frequency_penalty)
    if cfg.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    logits = apply_temperature(logits, cfg.temperature)
    logits = top_k_filter(logits, cfg.top_k)
    logits = top_p_filter(logits, cfg.top_p)
    logits = min_p_filter(logits, cfg.min_p)
    return logits.softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token id per row of probs (B, V) -> (B, 1)."""
    return torch.multinomial(probs, 1, generator=generator)


def next_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None,
               previous: torch.Tensor | None = None) -> torch.Tensor:
    """logits (B, V) -> token ids (B, 1). Greedy takes the argmax (no randomness consumed)."""
    if cfg.greedy and cfg.repetition_penalty == 1.0 and not (cfg.presence_penalty or cfg.frequency_penalty):
        return logits.argmax(dim=-1, keepdim=True)
    probs = probabilities(logits, cfg, previous)
    if cfg.greedy:
        return probs.argmax(dim=-1, keepdim=True)
    return sample(probs, generator)
