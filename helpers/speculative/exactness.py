"""Checking exactness: is a sample distributed as p_target? (total variation, Pearson's chi-square test)"""

from __future__ import annotations

import torch


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    """Half the L1 distance between two distributions over the same outcomes: the largest difference in
    probability they give to any set of outcomes."""
    return 0.5 * float((p.double() - q.double()).abs().sum())


def chi_square_test(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Pearson's goodness-of-fit test of observed `counts` against `probs` (same outcomes, 1-D).

    Outcomes whose expected count is below `min_expected` are pooled into one bin, so the chi-square
    approximation holds. Returns (statistic, degrees of freedom, p-value); a tiny p-value says the
    counts did not come from `probs`. The p-value is the chi-square survival function,
    Q(dof/2, statistic/2) (the regularised upper incomplete gamma function).
    """
    counts, probs = counts.double().flatten(), probs.double().flatten()
    if counts.shape != probs.shape:
        raise ValueError(
            f"counts and probs must have the same number of outcomes; got {counts.numel()} and {probs.numel()}"
        )
    n = counts.sum()
    expected = n * probs / probs.sum()
    if (counts[expected == 0] > 0).any():  # an impossible outcome happened: certainly not from probs
        return float("inf"), int((expected > 0).sum()) - 1, 0.0
    big = expected >= min_expected
    obs, exp = counts[big], expected[big]
    if (~big).any():  # pool the rare outcomes: into their own bin, or into the rarest kept bin if still too rare
        rare_obs, rare_exp = counts[~big].sum(), expected[~big].sum()
        if rare_exp >= min_expected or obs.numel() == 0:
            obs, exp = torch.cat([obs, rare_obs.view(1)]), torch.cat([exp, rare_exp.view(1)])
        else:
            j = int(exp.argmin())
            obs, exp = obs.clone(), exp.clone()
            obs[j] += rare_obs
            exp[j] += rare_exp
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = int(obs.numel()) - 1
    if dof < 1:
        raise ValueError(
            "chi_square_test needs at least 2 outcomes with enough expected counts; "
            f"got {obs.numel()} (lower min_expected or draw more samples)"
        )
    p_value = float(
        torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64))
    )
    return stat, dof, p_value
