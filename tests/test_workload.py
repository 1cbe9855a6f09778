"""RunResult's latency percentiles: each is numpy's percentile of the samples it names, nan with none."""

import math

import numpy as np

from helpers.serving.workload import RunResult


def test_percentiles_are_numpys_over_the_named_samples():
    r = RunResult(
        "x",
        outputs=[[1, 2, 3], [4], [5, 6]],
        arrivals=[0.0, 0.25, 1.0],
        token_times=[[0.5, 0.75, 1.5], [2.0], [1.25, 3.0]],
    )
    assert r.ttfts == [0.5, 1.75, 0.25] and r.itls == [0.25, 0.75, 1.75]
    for name, samples, q in (
        ("ttft_p50", r.ttfts, 50),
        ("ttft_p99", r.ttfts, 99),
        ("itl_p50", r.itls, 50),
        ("itl_p99", r.itls, 99),
    ):
        assert getattr(r, name) == float(np.percentile(samples, q)), name


def test_percentiles_without_samples_are_nan():
    r = RunResult("empty", outputs=[[7]], arrivals=[0.0], token_times=[[1.0]])  # one token: no gap between two
    assert r.itls == [] and math.isnan(r.itl_p50) and math.isnan(r.itl_p99)
    assert r.ttft_p50 == 1.0
