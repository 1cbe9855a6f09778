"""The KV-allocation simulator (course/paged_kv_simulator.py): invariants, hand-computed cases, the step cost,
and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.course.paged_kv_simulator import SimulatedRequest, StepCost, simulate, synthetic_requests


@pytest.fixture(scope="module")
def requests():
    return synthetic_requests(200, seed=1)


def test_synthetic_requests_are_seeded_and_fit_the_window():
    a, b = synthetic_requests(100, seed=3), synthetic_requests(100, seed=3)
    assert a == b and a != synthetic_requests(100, seed=4)
    assert all(1 <= r.prompt_len and 1 <= r.output_len <= r.max_new_tokens for r in a)
    assert all(r.prompt_len + r.max_new_tokens <= 2048 for r in a)
    capped = synthetic_requests(100, seed=3, max_new_tokens=300)
    assert all(r.max_new_tokens == max(r.output_len, min(300, 2048 - r.prompt_len)) for r in capped)
    timed = synthetic_requests(100, seed=3, arrival_rate=0.5)
    arrivals = [r.arrival for r in timed]
    assert arrivals == sorted(arrivals) and 100 < arrivals[-1] < 400  # about 200 steps for 100 requests


def test_one_request_by_hand():
    req = SimulatedRequest(prompt_len=10, output_len=5, max_new_tokens=20)
    contiguous = simulate([req], capacity_tokens=100, policy="contiguous")
    assert contiguous.steps == 5
    assert contiguous.stored.tolist() == [11, 12, 13, 14, 15] and contiguous.allocated.tolist() == [30] * 5
    assert contiguous.utilisation == pytest.approx(65 / 150)
    paged = simulate([req], capacity_tokens=100, policy="paged", block_size=4)
    assert paged.allocated.tolist() == [12, 12, 16, 16, 16]  # a new block when token 13 arrives
    assert paged.utilisation == pytest.approx(65 / 72)


@pytest.mark.parametrize("block_size", [1, 4, 16, 64])
def test_paged_invariants(requests, block_size):
    res = simulate(requests, capacity_tokens=20_000, policy="paged", block_size=block_size)
    assert (res.allocated <= 20_000).all()
    waste = res.allocated - res.stored
    assert (waste >= 0).all() and (waste <= (block_size - 1) * res.running).all()  # under one block each
    assert res.steps >= max(r.output_len for r in requests)
    if block_size == 1:
        assert res.utilisation == 1.0


def test_contiguous_reserves_the_maximum(requests):
    res = simulate(requests, capacity_tokens=20_000, policy="contiguous")
    assert (res.allocated <= 20_000).all() and res.preemptions == 0
    assert (res.stored <= res.allocated).all()
    # with no client limit every request reserves the whole window: at most 9 fit in 20,000 slots
    assert res.running.max() == 20_000 // 2048


def test_paged_uses_memory_better_and_finishes_sooner(requests):
    contiguous = simulate(requests, capacity_tokens=20_000, policy="contiguous")
    paged = simulate(requests, capacity_tokens=20_000, policy="paged", block_size=16)
    assert paged.utilisation > 0.9 > 0.5 > contiguous.utilisation
    assert paged.mean_running > 2 * contiguous.mean_running
    assert paged.steps < contiguous.steps


def test_preemption_recomputes_a_request_and_everything_finishes():
    reqs = [SimulatedRequest(8, 40, 40), SimulatedRequest(8, 40, 40), SimulatedRequest(8, 40, 40)]
    res = simulate(reqs, capacity_tokens=64, policy="paged", block_size=8)  # room for only one at full length
    assert res.preemptions > 0 and res.recomputed_tokens > 0
    assert (res.allocated <= 64).all()
    assert res.stored[-1] == 48  # the last request ends with its prompt + 40 tokens
    # every prompt is prefilled once, and every re-admission prefills its prompt and kept tokens again
    assert res.prefilled.sum() == 3 * 8 + res.recomputed_tokens


def test_preempted_request_keeps_its_tokens_by_hand():
    # 2 requests, blocks of 4, 12 slots: both start with one block (prompt 3 + token 1). In step 1 the older
    # takes the last free block for its 5th token; the newer finds none for its own 5th, so it is pre-empted
    # giving back that token: it comes back later with its prompt and 1 kept token to recompute
    reqs = [SimulatedRequest(3, 9, 9), SimulatedRequest(3, 9, 9)]
    res = simulate(reqs, capacity_tokens=12, policy="paged", block_size=4)
    assert res.preemptions == 1 and res.recomputed_tokens == 3 + 1
    assert res.prefilled.tolist()[0] == 6 and res.prefilled.sum() == 6 + 4
    assert res.stored.tolist()[:2] == [8, 5]  # step 1: only the older request's 5 tokens are held


def test_step_cost_prices_bytes_and_flops():
    req = SimulatedRequest(prompt_len=10, output_len=3, max_new_tokens=3)
    res = simulate([req], capacity_tokens=100, policy="contiguous")
    assert res.prefilled.tolist() == [10, 0, 0] and res.stored.tolist() == [11, 12, 13]
    memory_bound = StepCost(
        weight_bytes=100.0, kv_bytes_per_token=10.0, flops_per_token=1.0, bandwidth=10.0, peak_flops=1e9
    )
    assert res.seconds(memory_bound).tolist() == pytest.approx([21.0, 22.0, 23.0])  # (100 + 10 x stored) / 10
    compute_bound = StepCost(
        weight_bytes=1.0, kv_bytes_per_token=1.0, flops_per_token=100.0, bandwidth=1e9, peak_flops=100.0
    )
    assert res.seconds(compute_bound).tolist() == pytest.approx([11.0, 1.0, 1.0])  # (1 decoded + 10 prefilled)


def test_paged_costs_more_per_step_but_less_in_total(requests):
    cost = StepCost(
        weight_bytes=16e9, kv_bytes_per_token=131_072, flops_per_token=15e9, bandwidth=3.35e12, peak_flops=989.4e12
    )
    contiguous = simulate(requests, capacity_tokens=20_000, policy="contiguous").seconds(cost)
    paged = simulate(requests, capacity_tokens=20_000, policy="paged", block_size=16).seconds(cost)
    assert paged.mean() > contiguous.mean()  # more requests per step: more keys and values to read
    assert paged.sum() < contiguous.sum()
    with pytest.raises(ValueError, match="bandwidth must be a number > 0"):
        StepCost(1.0, 1.0, 1.0, 0.0, 1.0)


def test_utilisation_depends_on_the_workload():
    loose = synthetic_requests(200, seed=2)  # clients allow up to the whole window
    tight = synthetic_requests(200, seed=2, max_new_tokens=1)  # clients allow exactly what they use
    u_loose = simulate(loose, 20_000, "contiguous").utilisation
    u_tight = simulate(tight, 20_000, "contiguous").utilisation
    assert u_tight > 2 * u_loose
    assert all(r.max_new_tokens == r.output_len for r in tight)


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        (dict(policy="buddy"), "policy must be"),
        (dict(block_size=0), "block_size must be an int >= 1"),
        (dict(capacity_tokens=0), "capacity_tokens must be an int >= 1"),
        (dict(capacity_tokens=1000), "needs 2048 token slots but capacity_tokens is 1000"),
    ],
)
def test_bad_input(kwargs, msg):
    args = dict(requests=[SimulatedRequest(48, 10, 2000)], capacity_tokens=10_000, policy="contiguous")
    args.update(kwargs)
    with pytest.raises(ValueError, match=msg):
        simulate(**args)


def test_bad_synthetic_parameters():
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        synthetic_requests(0)
    with pytest.raises(ValueError, match="arrival_rate"):
        synthetic_requests(5, arrival_rate=0)
    assert np.isfinite(synthetic_requests(5, sigma=0)[0].prompt_len)
