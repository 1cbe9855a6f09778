"""helpers/serving/goodput.py: the sweep returns one run per design and rate, every request complete with
generate's greedy tokens, and the knee and the rate scaling mean what their docstrings say."""

from __future__ import annotations

import pytest
import torch

from helpers import load_model
from helpers.serving.goodput import DESIGNS, GoodputSweep, at_rate, goodput_sweep, sequential_service
from helpers.serving.workload import RunResult, WorkloadRequest, make_workload


@pytest.fixture(scope="module")
def model_tok():
    torch.manual_seed(0)
    return load_model("target")


def first_flip_is_a_near_tie(model, prompt, ref, out):
    """Where a batched output differs from generate's, the reference's top-2 logits at the first differing
    token are within float32 rounding of each other (batched matmuls round differently; tests/test_serving.py)."""
    j = next(i for i, (a, b) in enumerate(zip(out, ref)) if a != b)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ref[:j]]), last_only=True)[0, -1]  # (V,)
    top2 = logits.topk(2).values
    return (top2[0] - top2[1]).item() < 1e-3


def test_sweep_runs_every_design_at_every_rate_with_generates_tokens(model_tok):
    model, tok = model_tok
    wl = make_workload(tok, 5, rate=1.0, prompt_len=(8, 40), output_len=(3, 8), seed=3)
    rates = [400.0, 5.0]  # given out of order: the sweep sorts them
    sweep = goodput_sweep(model, wl, rates, ttft_target=10.0, tpot_target=10.0, engine_args=dict(num_blocks=64))
    assert sweep.rates == [5.0, 400.0]
    assert list(sweep.runs) == list(DESIGNS)
    sequential = sweep.runs["sequential"]
    for design, runs in sweep.runs.items():
        assert len(runs) == len(rates)
        for rate, run in zip(sweep.rates, runs):
            assert run.arrivals == pytest.approx([w.arrival for w in at_rate(wl, rate)])
            assert [len(o) for o in run.outputs] == [w.max_tokens for w in wl]  # every request complete
            assert [len(t) for t in run.token_times] == [w.max_tokens for w in wl]
            assert all(ttft >= 0 for ttft in run.ttfts)
            for w, ref, out in zip(wl, sequential[0].outputs, run.outputs):  # sequential is generate, alone
                assert out == ref or first_flip_is_a_near_tie(model, w.prompt, ref, out), design
        # targets of 10 s: every request meets both, so the knee is the top rate and goodput n / makespan
        assert sweep.attainment(design) == [1.0, 1.0]
        assert sweep.knee(design) == 400.0
        assert sweep.goodput(design) == pytest.approx([len(wl) / r.makespan for r in runs])
        assert sweep.best(design) == max(sweep.goodput(design))
        assert sweep.series(design, "tpot_p99") == [r.tpot_p99 for r in runs]
    service, tpot = sequential_service(model, wl)  # every request has >= 3 tokens: longer than one token gap
    assert 0 < tpot < service


def test_at_rate_gives_exactly_the_offered_rate():
    wl = [WorkloadRequest([1], 2, a) for a in (0.0, 0.3, 1.1, 2.0, 2.6)]
    for rate in (0.5, 3.0, 40.0):
        scaled = at_rate(wl, rate)
        assert (len(wl) - 1) / (scaled[-1].arrival - scaled[0].arrival) == pytest.approx(rate)
        assert [w.prompt for w in scaled] == [w.prompt for w in wl]
    with pytest.raises(ValueError, match="rate"):
        at_rate(wl, 0)
    with pytest.raises(ValueError, match="two requests"):
        at_rate([WorkloadRequest([1], 2, 0.0)] * 3, 1.0)


def test_knee_is_the_last_rate_before_attainment_drops():
    def run(ttfts):  # one token per request, arriving at 0: TTFT = its token time, TPOT 0
        return RunResult("r", [[0]] * len(ttfts), [0.0] * len(ttfts), [[t] for t in ttfts])

    met, late = 0.1, 5.0  # against a 1 s TTFT target
    runs = {
        "holds": [run([met] * 10)] * 3,
        "drops": [run([met] * 10), run([met] * 9 + [late]), run([met] * 8 + [late] * 2)],  # 100%, 90%, 80%
        "never": [run([late] * 10)] * 3,
        "recovers": [run([met] * 10), run([late] * 10), run([met] * 10)],  # the knee is the first drop
    }
    sweep = GoodputSweep([1.0, 2.0, 4.0], ttft_target=1.0, tpot_target=1.0, slo_share=0.9, runs=runs)
    assert sweep.attainment("drops") == [1.0, 0.9, 0.8]
    assert [sweep.knee(d) for d in runs] == [4.0, 2.0, None, 1.0]


def test_sweep_names_bad_arguments(model_tok):
    model, tok = model_tok
    wl = make_workload(tok, 2, rate=1.0, prompt_len=(4, 4), output_len=(1, 1), seed=0)
    for kw, word in ((dict(rates=[]), "rates"), (dict(rates=[-1.0]), "rates"), (dict(tpot_target=0), "target")):
        args = dict(rates=[1.0], ttft_target=1.0, tpot_target=1.0) | kw
        with pytest.raises(ValueError, match=word):
            goodput_sweep(model, wl, **args)
