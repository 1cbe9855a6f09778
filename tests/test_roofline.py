"""helpers.measure.roofline: the roofline arithmetic exactly, the measurements for sanity (positive, median,
work counted by the stated convention), and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.measure.roofline import (
    Rate,
    attainable_flops,
    bandwidth_bound_tokens_per_s,
    measure_copy_bandwidth,
    measure_matmul_flops,
    ridge_point,
    roofline_time,
)


def test_rate_uses_the_median():
    r = Rate(work=10.0, seconds=[1.0, 100.0, 2.0])
    assert r.median_s == 2.0 and r.per_second == 5.0


def test_roofline_arithmetic():
    peak, bw = 100.0, 10.0
    assert ridge_point(peak, bw) == 10.0
    np.testing.assert_array_equal(attainable_flops([1, 10, 1000], peak, bw), [10.0, 100.0, 100.0])
    assert roofline_time(flops=1000, n_bytes=10, peak_flops=peak, bandwidth=bw) == 10.0  # compute-bound
    assert roofline_time(flops=10, n_bytes=1000, peak_flops=peak, bandwidth=bw) == 100.0  # memory-bound
    assert bandwidth_bound_tokens_per_s(16e9, 3.35e12) == pytest.approx(209.375)
    assert bandwidth_bound_tokens_per_s(16e9, 3.35e12, batch_size=4) == pytest.approx(4 * 209.375)


def test_measurements_count_work_by_their_convention():
    cpu = torch.device("cpu")
    mm = measure_matmul_flops(cpu, n=64, repeats=3)
    assert mm.work == 2 * 64**3 and len(mm.seconds) == 3 and mm.per_second > 0
    copy = measure_copy_bandwidth(cpu, n_bytes=4 * 2**20, repeats=3)
    assert copy.work == 2 * 4 * 2**20 and copy.per_second > 0  # read + written


@pytest.mark.cuda
def test_measurements_on_cuda():
    dev = torch.device("cuda")
    assert measure_matmul_flops(dev, n=1024, repeats=3).per_second > 1e12
    assert measure_copy_bandwidth(dev, n_bytes=2**28, repeats=3).per_second > 1e11


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: ridge_point(0, 1), "peak_flops"),
        (lambda: attainable_flops(1, 1, -1), "bandwidth"),
        (lambda: measure_matmul_flops("cpu", n=0), "n"),
        (lambda: measure_copy_bandwidth("cpu", n_bytes=2), "n_bytes"),
        (lambda: measure_copy_bandwidth("cpu", n_bytes=64, repeats=0), "repeats"),
        (lambda: bandwidth_bound_tokens_per_s(0, 1), "bytes_per_step"),
        (lambda: bandwidth_bound_tokens_per_s(1, 1, batch_size=0), "batch_size"),
    ],
)
def test_bad_arguments_raise_value_errors(call, name):
    with pytest.raises(ValueError, match=name):
        call()
