"""Turning logits into the next token: pure functions, no model inside, explicit random generator.

    logits --(penalties)--> --(temperature)--> --(top-k)--> --(top-p)--> --(min-p)--> probs --> token

The order is HuggingFace's: penalties act on raw logits, temperature rescales, then the filters cut
the candidate set (each filter sets the logits it removes to -inf), and softmax renormalises what is
left. Temperature 0 means greedy (argmax), exactly.

Logits are checked before any of that (`check_logits`): NaN, +inf, or a row where every token is
masked to -inf has no distribution to sample from, so it raises a ValueError instead of producing
NaN probabilities or a silent token 0. A row that the temperature would overflow (3e38 at
temperature 1e-4) has its maximum subtracted first, so huge but finite logits still give a distribution;
a row a repetition penalty would carry past float32's range is penalised in float64 and shifted the same
way; a temperature too small for float32 (below 1.2e-38) is refused, as 0 (greedy) is what it means.

Every filter keeps all tokens tied with the last one it keeps, so its result never depends on how a
sort orders equal values (HuggingFace's top-p picks an arbitrary subset of such ties; otherwise the
results are identical, which tests/test_sampling.py checks against its warpers).

Out of scope: beam search, grammar-constrained decoding, batched per-row settings.
"""

from __future__ import annotations

import math
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
        validate_sampling(
            self.temperature,
            self.top_k,
            self.top_p,
            self.min_p,
            self.repetition_penalty,
            self.presence_penalty,
            self.frequency_penalty,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate_sampling(
    temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0
) -> None:
    """Raise a ValueError naming the first setting outside its allowed range."""
    if not _is_number(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy); got {temperature!r}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 = off); got {top_k!r}")
    if not _is_number(top_p) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 = off); got {top_p!r}")
    if not _is_number(min_p) or not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1] (0 = off); got {min_p!r}")
    if not _is_number(repetition_penalty) or repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be a finite number > 0 (1 = off); got {repetition_penalty!r}")
    for name, value in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
        if not _is_number(value) or not -2 <= value <= 2:
            raise ValueError(f"{name} must be in [-2, 2] (0 = off, the OpenAI API's range); got {value!r}")


def check_logits(logits) -> None:
    """Raise a ValueError unless every row of `logits` (..., V) can be turned into a token: no NaN, no +inf,
    and at least one finite entry (-inf marks a masked token; a row of nothing but -inf allows none).

    One reduction covers all three cases: a row's maximum is finite exactly when the row has no NaN
    (max propagates it), no +inf, and is not all -inf. Reading it back is one device -> host read per call
    (about 15 us on a CPU; on a GPU a synchronisation, which the decode loops' stop checks make anyway).
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() == 0:
        raise ValueError(
            f"logits must be a floating-point torch.Tensor of shape (..., V); got "
            f"{getattr(logits, 'dtype', type(logits).__name__)}"
        )
    if logits.shape[-1] == 0:
        raise ValueError(f"logits must have at least one token (V >= 1); got shape {tuple(logits.shape)}")
    row_max = logits.amax(dim=-1)  # (...,)
    # the sum of the row maxima is finite only if every one is; if it overflowed, the exact test decides
    if math.isfinite(row_max.sum().item()) or bool(torch.isfinite(row_max).all()):
        return
    allowed = "allowed: finite values, with -inf for masked tokens and at least one finite logit per row"
    if torch.isnan(logits).any():
        raise ValueError(f"logits contain NaN ({allowed}); NaN logits usually mean the model overflowed")
    if torch.isposinf(logits).any():
        raise ValueError(f"logits contain +inf ({allowed})")
    raise ValueError(f"logits have a row where every entry is -inf, so no token is left to pick ({allowed})")


def check_generator(generator) -> None:
    """None (torch's global generator) or a torch.Generator; checked even when greedy decoding never uses it,
    so that a bad value (a seed, a NumPy generator) is caught the first time, not when sampling is switched on."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(
            f"generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)) or None; "
            f"got {type(generator).__name__}"
        )


def apply_temperature(logits: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """logits / temperature, safe from overflow. temperature: a number > 0, or a 0-d tensor holding one (the
    input of a compiled graph, where one graph serves every temperature: not checked here, so the caller
    checks the number it fills in)."""
    if not isinstance(temperature, torch.Tensor) and (not _is_number(temperature) or temperature <= 0):
        raise ValueError(f"temperature must be > 0 here (greedy is handled by the caller); got {temperature!r}")
    if not isinstance(temperature, torch.Tensor) and temperature < torch.finfo(logits.dtype).tiny:
        # below the smallest normal number of the logits' dtype the divisor rounds to 0 (or to a subnormal a
        # CPU may flush to 0): the division would give inf and NaN, not the limit, which is greedy
        raise ValueError(
            f"temperature {temperature!r} is too small for {logits.dtype} arithmetic (the smallest is "
            f"{torch.finfo(logits.dtype).tiny:.3g}); use temperature 0 for greedy decoding"
        )
    scaled = logits / temperature  # (..., V)
    if not isinstance(temperature, torch.Tensor) and temperature >= 1:
        return scaled  # |x / T| <= |x|: nothing can overflow; skipping the guard: 40 -> 5 us for a (1, 2048) row
    # a finite logit can overflow when divided by a small temperature (3e38 / 1e-4): such rows are divided
    # after subtracting their maximum, which changes none of their probabilities. Other rows keep the plain
    # division, so they stay bit-identical to HuggingFace's warpers; no device -> host read is needed.
    overflow = (torch.isinf(scaled) & torch.isfinite(logits)).any(dim=-1, keepdim=True)  # (..., 1)
    return torch.where(overflow, (logits - logits.amax(dim=-1, keepdim=True)) / temperature, scaled)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits per row (ties at the k-th value are all kept), -inf elsewhere. k=0: off."""
    validate_sampling(top_k=k)
    if k == 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most likely tokens whose probability reaches p.

    Computed from the unlikely end, like HuggingFace's TopPLogitsWarper: sort ascending and drop
    tokens while the probability dropped so far stays <= 1 - p; what is left has probability >= p,
    and the most likely token always stays. The logit of the least likely survivor is a threshold:
    every token at or above it is kept, so exact ties at the boundary are all kept (HuggingFace
    keeps whichever of them its unstable sort happens to put last).
    """
    validate_sampling(top_p=p)
    if p >= 1.0:
        return logits
    V = logits.shape[-1]
    sorted_logits = torch.sort(logits, dim=-1).values  # (..., V), ascending
    dropped_mass = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # probability of this token and all below it
    n_drop = (dropped_mass <= 1 - p).sum(dim=-1, keepdim=True).clamp(max=V - 1)  # a prefix: the cumsum only grows
    threshold = sorted_logits.gather(-1, n_drop)  # (..., 1) logit of the least likely token kept
    return logits.masked_fill(logits < threshold, float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens whose probability is at least min_p times the most likely token's. min_p=0: off."""
    validate_sampling(min_p=min_p)
    if min_p == 0:
        return logits
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, float("-inf"))


def token_counts(previous: torch.Tensor, vocab_size: int, dtype=torch.float32) -> torch.Tensor:
    """How often each id occurs in each row of previous (B, N) -> (B, V)."""
    counts = torch.zeros(*previous.shape[:-1], vocab_size, dtype=dtype, device=previous.device)
    return counts.scatter_add_(-1, previous, torch.ones_like(previous, dtype=dtype))


def apply_penalties(
    logits: torch.Tensor,
    previous: torch.Tensor | None,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
) -> torch.Tensor:
    """Penalise tokens already in `previous` (B, N) token ids (the prompt included). logits: (B, V).

    repetition (HuggingFace, from the CTRL paper): a seen token's logit is divided by the penalty if
    positive, multiplied by it if negative (so a penalty > 1 always makes it less likely). A row the
    penalty would carry past the dtype's range comes back shifted by its maximum (the same probabilities;
    HuggingFace gives inf there, then NaN).
    presence / frequency (OpenAI): logit -= presence * [count > 0] + frequency * count.
    """
    validate_sampling(
        repetition_penalty=repetition_penalty, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty
    )
    if previous is None or previous.numel() == 0:
        return logits
    if repetition_penalty != 1.0:
        seen = torch.gather(logits, -1, previous)  # (B, N)
        penalised = logits.scatter(
            -1, previous, torch.where(seen < 0, seen * repetition_penalty, seen / repetition_penalty)
        )
        # a penalty below 1 can push a finite logit past the dtype's range (3e38 / 0.5 = inf), and softmax
        # then meets inf - inf (NaN). Such rows are penalised in float64 and shifted by their maximum, which
        # changes no probability; what even float64 cannot hold is kept at the largest finite value. Other
        # rows keep the plain result (bit-identical to HuggingFace's); no device -> host read is needed.
        overflow = (torch.isinf(penalised) & torch.isfinite(logits)).any(dim=-1, keepdim=True)  # (B, 1)
        wide, seen64 = logits.double(), seen.double()
        wide = wide.scatter(
            -1, previous, torch.where(seen64 < 0, seen64 * repetition_penalty, seen64 / repetition_penalty)
        )
        big = torch.finfo(torch.float64).max
        wide = wide.clamp(-big, big)
        shifted = (wide - wide.amax(dim=-1, keepdim=True)).clamp(min=-torch.finfo(logits.dtype).max)
        logits = torch.where(overflow, shifted.to(logits.dtype), penalised)
    if presence_penalty or frequency_penalty:
        counts = token_counts(previous, logits.shape[-1], logits.dtype)  # (B, V)
        logits = logits - presence_penalty * (counts > 0).to(logits.dtype) - frequency_penalty * counts
    return logits


def filtered_logits(logits: torch.Tensor, cfg: SamplingConfig, previous: torch.Tensor | None = None) -> torch.Tensor:
    """Penalties, temperature and the three filters in order; removed tokens are -inf. Not for greedy."""
    if cfg.greedy:
        raise ValueError("temperature must be > 0 for filtered_logits (temperature 0 is greedy: use probabilities)")
    check_logits(logits)
    logits = apply_penalties(
        logits.float(), previous, cfg.repetition_penalty, cfg.presence_penalty, cfg.frequency_penalty
    )
    logits = apply_temperature(logits, cfg.temperature)
    logits = top_k_filter(logits, cfg.top_k)
    logits = top_p_filter(logits, cfg.top_p)
    return min_p_filter(logits, cfg.min_p)


def probabilities(logits: torch.Tensor, cfg: SamplingConfig, previous: torch.Tensor | None = None) -> torch.Tensor:
    """The distribution the next token is drawn from, (..., V). Greedy gives a one-hot."""
    if cfg.greedy:
        check_logits(logits)
        logits = apply_penalties(
            logits.float(), previous, cfg.repetition_penalty, cfg.presence_penalty, cfg.frequency_penalty
        )
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    return filtered_logits(logits, cfg, previous).softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token id per row of probs (B, V) -> (B, 1)."""
    check_generator(generator)
    return torch.multinomial(probs, 1, generator=generator)


def sample_from_uniform(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw one token id per row of probs (..., V) from given uniforms u (...) in [0, 1): the first id whose
    cumulative probability exceeds u times the row's total (inverse-CDF sampling) -> (...) ids.

    The same distribution as `sample`, from numbers drawn beforehand: a compiled graph takes no
    torch.Generator, so a caller that compiles sampling draws the uniforms from its generator on the host
    and passes them in (speculative.py's fused rounds), and a seed still fixes the tokens. Rows need not be
    normalised. A token of probability 0 is never picked: its cumulative sum equals its predecessor's, and
    should rounding carry u * total to the very end, the pick is the last token with probability > 0.
    """
    cdf = probs.cumsum(-1)  # (..., V)
    picked = (cdf <= u.unsqueeze(-1) * cdf[..., -1:]).sum(-1)  # (...,) ids whose cumulative sum is passed
    ids = torch.arange(probs.shape[-1], device=probs.device)
    last_possible = torch.where(probs > 0, ids, 0).amax(-1)  # (...,)
    return torch.minimum(picked, last_possible)


def next_token(
    logits: torch.Tensor,
    cfg: SamplingConfig,
    generator: torch.Generator | None = None,
    previous: torch.Tensor | None = None,
) -> torch.Tensor:
    """logits (B, V) -> token ids (B, 1). Greedy takes the argmax (no randomness consumed)."""
    check_generator(generator)
    if cfg.greedy and cfg.repetition_penalty == 1.0 and not (cfg.presence_penalty or cfg.frequency_penalty):
        check_logits(logits)  # argmax would silently return 0 for a row of -inf, or point at a NaN
        return logits.argmax(dim=-1, keepdim=True)
    probs = probabilities(logits, cfg, previous)  # checks the logits
    if cfg.greedy:
        return probs.argmax(dim=-1, keepdim=True)
    return sample(probs, generator)
