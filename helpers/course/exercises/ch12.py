"""Checks for chapter 12's exercises (speculative decoding). Worked solutions:
notebooks/solutions/12_speculative_decoding_solutions.ipynb. Each check prints one line (a prediction also says
what was measured) and returns nothing; a wrong answer raises ExerciseNotRight with one line."""

from __future__ import annotations

import torch

from . import FROM_NOTEBOOK, exercise, prediction

# exercise 2: rounds of GAMMA_2 proposals that commit TOKENS_2 tokens per target pass on average
GAMMA_2, TOKENS_2 = 4, 3.0
# exercise 3: greedy speculation with this draft length on the chapter's section-4 prompts
GAMMA_3 = 8
# exercise 4: alpha, the draft step's cost c, and a verify pass costing 1 + V_SLOPE_4 * gamma target steps
ALPHA_4, C_4, V_SLOPE_4 = 0.8, 0.1, 0.1


def _expected_tokens(alpha: float, gamma: int) -> float:
    """(1 - alpha^(gamma+1)) / (1 - alpha): tokens a round commits on average (gamma + 1 at alpha = 1)."""
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def _alpha_for(tokens: float, gamma: int) -> float:
    """The alpha at which rounds of `gamma` proposals commit `tokens` on average (bisection: E grows with alpha)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _expected_tokens(mid, gamma) < tokens else (lo, mid)
    return (lo + hi) / 2


def check_1(answer=FROM_NOTEBOOK) -> None:
    """lookup_rule(p_target, x) -> (accept_probability, residual) for a drafter whose proposal x is fixed
    (p_draft one-hot at x)."""

    def right(fn):
        g = torch.Generator().manual_seed(12)
        for V, x in [(5, 0), (6, 3), (8, 7)]:
            p_target = torch.rand(V, generator=g, dtype=torch.float64) ** 2  # (V,)
            p_target /= p_target.sum()
            got = fn(p_target.clone(), x)
            assert isinstance(got, tuple) and len(got) == 2, "return a tuple (accept_probability, residual)"
            accept, residual = float(got[0]), torch.as_tensor(got[1], dtype=torch.float64)
            assert residual.shape == p_target.shape, (
                f"the residual is a distribution over all {V} tokens, shaped like p_target; got {tuple(residual.shape)}"
            )
            one_hot = torch.nn.functional.one_hot(torch.tensor(x), V).double()
            assert abs(accept - min(1.0, p_target[x].item())) < 1e-9, (
                "accept_probability is not min(1, p_target(x) / p_draft(x)) with p_draft one-hot at x"
            )
            assert abs(residual.sum().item() - 1) < 1e-9 and (residual >= 0).all(), (
                "the residual must be a distribution: non-negative, summing to 1"
            )
            assert torch.allclose(accept * one_hot + (1 - accept) * residual, p_target, atol=1e-12), (
                "accepted mass + rejected mass x residual is not p_target: check the residual at x and elsewhere"
            )
        return True

    exercise(
        "12.1",
        answer,
        right,
        name="lookup_rule",
        hint="put a one-hot p_draft into min(1, p_target/p_draft) and norm(max(0, p_target - p_draft))",
        notice="a fixed proposal is accepted exactly as often as the target would have chosen it, and a "
        "rejection draws from the target with that token removed",
    )


def check_2(answer=FROM_NOTEBOOK) -> None:
    """alpha_needed: the alpha at which rounds of 4 proposals commit 3 tokens per target pass on average."""
    want = _alpha_for(TOKENS_2, GAMMA_2)

    def right(a):
        a = float(a)
        assert 0 < a < 1, f"alpha is a probability between 0 and 1; got {a}"
        assert abs(_expected_tokens(a, GAMMA_2) - TOKENS_2) < 0.01, (
            f"with alpha = {a:.3f} rounds of {GAMMA_2} commit {_expected_tokens(a, GAMMA_2):.2f} tokens per pass, "
            f"not {TOKENS_2:g}"
        )
        return abs(a - want) < 5e-4

    exercise(
        "12.2",
        answer,
        right,
        name="alpha_needed",
        hint="E = (1 - alpha^(gamma+1)) / (1 - alpha) grows with alpha: bisect, or scan a fine grid",
        notice=f"even a draft that agrees {want:.0%} of the time commits only {TOKENS_2:g} tokens per pass at "
        f"gamma {GAMMA_2}, against the {GAMMA_2 + 1} of a perfect one",
    )


def check_3(target, draft, prompts, n_new: int, answer=FROM_NOTEBOOK) -> None:
    """A prediction checked by a measurement: greedy tokens per target pass with gamma = 8 on `prompts`."""
    from ...speculative import speculative_generate

    def measure():
        stats = [speculative_generate(target, draft, p, n_new, gamma=GAMMA_3)[1] for p in prompts]
        return sum(s.new_tokens for s in stats) / sum(s.target_calls for s in stats)

    def notice(measured):
        return (
            f"at most {GAMMA_3 + 1} with every guess accepted: each extra proposal adds only alpha^gamma, so "
            "a long draft buys little once alpha^gamma is small"
        )

    prediction(
        "12.3",
        answer,
        measure,
        rel_tol=0.2,
        name="predicted_tokens_per_pass",
        notice=notice,
        hint="feed the alpha section 4 measured at the longest draft into (1 - alpha^(gamma+1)) / (1 - alpha)",
    )


def check_4(answer=FROM_NOTEBOOK) -> None:
    """best = (gamma, predicted speed-up): the gamma in 1..16 that maximises E / (gamma c + v), v = 1 + 0.1 gamma."""
    speedups = {g: _expected_tokens(ALPHA_4, g) / (g * C_4 + 1 + V_SLOPE_4 * g) for g in range(1, 17)}
    best = max(speedups, key=speedups.get)

    def right(a):
        gamma, speedup = a
        assert int(gamma) == gamma and 1 <= gamma <= 16, f"gamma is a whole number from 1 to 16; got {gamma}"
        assert abs(float(speedup) - speedups[int(gamma)]) < 1e-3, (
            f"the predicted speed-up at gamma = {int(gamma)} is not {float(speedup):.4f}"
        )
        return int(gamma) == best

    runner_up = sorted(speedups.values())[-2]
    exercise(
        "12.4",
        answer,
        right,
        name="best",
        hint="evaluate E / (gamma c + v) for every gamma from 1 to 16 and take the largest",
        notice=f"the optimum is flat: the runner-up is within {speedups[best] / runner_up - 1:.1%}, so alpha "
        "and the costs matter far more than the exact gamma",
    )
