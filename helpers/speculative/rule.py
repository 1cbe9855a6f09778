"""The acceptance rule of speculative decoding and the statistics of a generation.

accept_or_resample keeps every committed token distributed exactly as the target alone would draw it;
greedy_accept is the same rule for one-hot distributions (temperature 0). Both work on a batch of
independent rounds. No model and no loop here: helpers.speculative.loop drives the rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..sampling import SamplingConfig, check_generator


@dataclass
class SpeculativeStats:
    """What happened in one generation call.

    proposed[r] / accepted[r]: draft tokens proposed and accepted in round r. Every round is one
    target forward pass (`target_calls`; the prompt's prefill is not counted) and commits
    accepted[r] + 1 tokens (the last one from the residual, or the bonus token), except that the
    final round may be cut at max_new_tokens or at eos.
    """

    proposed: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    target_calls: int = 0
    draft_calls: int = 0
    new_tokens: int = 0
    trace: list[tuple[list[int], int, int]] | None = None  # with trace=True: (proposal ids, n accepted, next id)

    @property
    def rounds(self) -> int:
        return len(self.proposed)

    @property
    def acceptance_rate(self) -> float:
        """Estimate of alpha: accepted / examined proposals. A proposal is examined when all before it
        in its round were accepted, so examined = accepted + rejections (rounds that stopped early)."""
        rejections = sum(a < p for a, p in zip(self.accepted, self.proposed))
        examined = sum(self.accepted) + rejections
        return sum(self.accepted) / examined if examined else float("nan")

    @property
    def tokens_per_target_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else float("nan")

    def merge(self, other: "SpeculativeStats") -> "SpeculativeStats":
        trace = None if self.trace is None or other.trace is None else self.trace + other.trace
        return SpeculativeStats(
            self.proposed + other.proposed,
            self.accepted + other.accepted,
            self.target_calls + other.target_calls,
            self.draft_calls + other.draft_calls,
            self.new_tokens + other.new_tokens,
            trace,
        )


def expected_tokens_per_target_call(alpha: float, gamma: int) -> float:
    """(1 - alpha^(gamma+1)) / (1 - alpha): committed tokens per round when each proposal is accepted
    independently with probability alpha (Leviathan et al., eq. 1)."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1]; got {alpha!r}")
    if not isinstance(gamma, int) or gamma < 0:
        raise ValueError(f"gamma must be an int >= 0; got {gamma!r}")
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def acceptance_probability(p_target: torch.Tensor, p_draft: torch.Tensor) -> torch.Tensor:
    """The chance that a token drawn from p_draft is accepted: sum_x min(p_target(x), p_draft(x)),
    i.e. 1 - total variation distance. Works on (..., V), returns (...)."""
    return torch.minimum(p_target, p_draft).sum(-1)


def accept_or_resample(
    p_target: torch.Tensor,
    p_draft: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The verification rule, for one round or for a batch of independent rounds.

    p_target:     (..., gamma + 1, V) the target's distributions at the gamma proposed positions and one more
    p_draft:      (..., gamma, V) the distributions the proposals were drawn from; None means a
                  deterministic drafter (prompt lookup): p_draft is one-hot at each proposal
    draft_tokens: (..., gamma) the proposals
    Returns n_accepted (...) in 0..gamma and next_token (...): the token that follows the accepted
    ones, from norm(max(0, p_target - p_draft)) at the first rejected position, or from p_target's
    extra position when all were accepted (the bonus token).

    Random numbers, in this order: gamma uniforms (one per proposal; u < p_target/p_draft accepts, written
    u * p_draft < p_target so nothing divides by zero), then one multinomial draw per round.
    """
    check_generator(generator)
    check_round_shapes(p_target, p_draft, draft_tokens)
    u = torch.rand(draft_tokens.shape, generator=generator, device=p_target.device)  # (..., gamma)
    n_accepted, residual = acceptance(p_target, p_draft, draft_tokens, u)
    V = p_target.shape[-1]
    next_token = torch.multinomial(residual.reshape(-1, V), 1, generator=generator).view(n_accepted.shape)
    return n_accepted, next_token  # (multinomial normalises the residual)


def check_round_shapes(p_target, p_draft, draft_tokens) -> None:
    gamma = draft_tokens.shape[-1]
    if p_target.shape[-2] != gamma + 1:
        raise ValueError(f"p_target must have gamma + 1 = {gamma + 1} positions; got {p_target.shape[-2]}")
    if p_draft is not None and p_draft.shape[-2] != gamma:
        raise ValueError(f"p_draft must have gamma = {gamma} positions; got {p_draft.shape[-2]}")


def acceptance(
    p_target: torch.Tensor, p_draft: torch.Tensor | None, draft_tokens: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule of accept_or_resample with its gamma uniforms u (..., gamma) given: returns n_accepted (...)
    and the (unnormalised) distribution (..., V) the next token is drawn from. No shape checks and no
    device -> host read, so a compiled graph can hold it (the fused sampled round)."""
    gamma = draft_tokens.shape[-1]
    V = p_target.shape[-1]
    idx = draft_tokens.unsqueeze(-1)  # (..., gamma, 1)
    p_target_x = p_target[..., :gamma, :].gather(-1, idx).squeeze(-1)  # (..., gamma)
    p_draft_x = torch.ones_like(p_target_x) if p_draft is None else p_draft.gather(-1, idx).squeeze(-1)
    accepted = u * p_draft_x < p_target_x  # (..., gamma): u < p_target / p_draft, without dividing
    n_accepted = accepted.long().cumprod(-1).sum(-1)  # (...,) length of the leading run of acceptances
    # the next token's distribution: the residual at position n_accepted; at n_accepted == gamma the
    # draft row is zero padding, so the same formula gives p_target's extra row (the bonus token)
    lead = n_accepted.shape
    pick = n_accepted.view(*lead, 1, 1).expand(*lead, 1, V)  # (..., 1, V)
    p_target_n = p_target.gather(-2, pick).squeeze(-2)  # (..., V)
    if p_draft is None:
        draft_padded = torch.nn.functional.pad(draft_tokens, (0, 1), value=-1)  # (..., gamma + 1)
        x_n = draft_padded.gather(-1, n_accepted.unsqueeze(-1))  # (..., 1)
        residual = p_target_n.masked_fill(torch.arange(V, device=x_n.device) == x_n, 0.0)
    else:
        p_draft_padded = torch.nn.functional.pad(p_draft, (0, 0, 0, 1))  # (..., gamma + 1, V)
        residual = (p_target_n - p_draft_padded.gather(-2, pick).squeeze(-2)).clamp_min(0.0)  # (..., V)
    # a rejection has probability zero when the residual is all zero; guard against float rounding
    return n_accepted, torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_target_n)


def greedy_accept(target_argmax: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """accept_or_resample for one-hot distributions (temperature 0), without building them.

    target_argmax (..., gamma + 1), draft_tokens (..., gamma). A one-hot p_target accepts x_i with
    probability 1 if x_i is its argmax and 0 otherwise; the residual of two different one-hots is the
    target's one-hot. So: accept while the tokens agree, then take the target's argmax. No randomness.
    """
    gamma = draft_tokens.shape[-1]
    agree = draft_tokens == target_argmax[..., :gamma]
    n_accepted = agree.long().cumprod(-1).sum(-1)
    return n_accepted, target_argmax.gather(-1, n_accepted.unsqueeze(-1)).squeeze(-1)


def check_sampling(sampling: SamplingConfig | None, temperature: float) -> SamplingConfig:
    if sampling is None:
        sampling = SamplingConfig(temperature=temperature)
    if sampling.repetition_penalty != 1.0 or sampling.presence_penalty or sampling.frequency_penalty:
        raise ValueError(
            "speculative decoding here supports temperature, top_k, top_p and min_p; "
            "repetition_penalty must be 1.0 and presence_penalty / frequency_penalty 0.0 "
            f"(got {sampling.repetition_penalty}, {sampling.presence_penalty}, "
            f"{sampling.frequency_penalty})"
        )
    return sampling


def check_gamma(gamma, name="gamma"):
    if not isinstance(gamma, int) or isinstance(gamma, bool) or not 1 <= gamma <= 64:
        raise ValueError(f"{name} must be an int in [1, 64]; got {gamma!r}")
