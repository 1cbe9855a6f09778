"""The roofline of the machine you are on: measured peak matmul FLOP/s and memory bandwidth.

    peak = measure_matmul_flops(device)          # a large square matmul: fp32 on a CPU, bf16 on CUDA
    bw = measure_copy_bandwidth(device)           # a large tensor copy: bytes read + bytes written per second
    attainable_flops(intensity, peak.per_second, bw.per_second)   # min(peak, intensity * bandwidth)

A computation that does I FLOPs per byte it moves can run no faster than min(peak, I * bandwidth):
below the ridge point (peak / bandwidth) memory is the limit, above it arithmetic is. Every
measurement synchronises the device before reading the clock and reports the median of several
calls, after a warm-up call.

Out of scope: cache-level rooflines, power, multi-device; vendor numbers (the notebook states its
spec-sheet constants itself).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from .. import many_rows
from ..device import default_dtype
from .timing import time_call


@dataclass(frozen=True)
class Rate:
    """`work` units (FLOPs or bytes) per call, and each call's seconds; per_second uses the median."""

    work: float
    seconds: list[float] = field(repr=False)

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def per_second(self) -> float:
        return self.work / self.median_s


def _check_int(name, value, minimum):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")


def measure_matmul_flops(device, n: int | None = None, dtype=None, repeats: int = 5, warmup: int = 1) -> Rate:
    """Time (n x n) @ (n x n): 2 n^3 FLOPs per call. Defaults: n = 1536 on a CPU, 8192 on a GPU;
    fp32 on a CPU, bf16 on a GPU that supports it. In float32 on a CPU, both math libraries torch carries
    are timed where many_rows takes oneDNN (many_rows.ONEDNN_FAST), its default BLAS (torch.mm) and oneDNN
    (many_rows.linear), and the faster is the peak: on some CPUs one runs at about half the other's rate."""
    device = torch.device(device)
    n = n if n is not None else (1536 if device.type == "cpu" else 8192)
    _check_int("n", n, 1)
    _check_int("repeats", repeats, 1)
    dtype = dtype or default_dtype(device)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds = time_call(lambda: torch.mm(a, b, out=out), device, repeats=repeats, warmup=warmup)
    if device.type == "cpu" and dtype == torch.float32 and n >= many_rows.MIN_ROWS and many_rows.ONEDNN_FAST:
        with torch.no_grad():
            onednn = time_call(lambda: many_rows.linear(a, b), device, repeats=repeats, warmup=warmup)
        seconds = min(seconds, onednn)
    return Rate(work=2.0 * n**3, seconds=seconds)


def measure_copy_bandwidth(device, n_bytes: int | None = None, repeats: int = 7, warmup: int = 1) -> Rate:
    """Time dst.copy_(src) of `n_bytes`: the work counted is 2 * n_bytes (every byte is read once and
    written once), the convention STREAM's "copy" uses. Default size: 128 MiB on a CPU (beyond its
    caches), 1 GiB on a GPU."""
    device = torch.device(device)
    n_bytes = n_bytes if n_bytes is not None else (2**27 if device.type == "cpu" else 2**30)
    _check_int("n_bytes", n_bytes, 4)
    _check_int("repeats", repeats, 1)
    src = torch.ones(n_bytes // 4, device=device, dtype=torch.float32)  # touched, so pages exist
    dst = torch.zeros_like(src)
    seconds = time_call(lambda: dst.copy_(src), device, repeats=repeats, warmup=warmup)
    return Rate(work=2.0 * src.numel() * 4, seconds=seconds)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The arithmetic intensity (FLOP/byte) where the memory roof meets the compute roof."""
    if not peak_flops > 0 or not bandwidth > 0:
        raise ValueError(f"peak_flops and bandwidth must be > 0; got {peak_flops!r}, {bandwidth!r}")
    return peak_flops / bandwidth


def attainable_flops(intensity, peak_flops: float, bandwidth: float):
    """The roofline: min(peak_flops, intensity * bandwidth). Works on floats and numpy arrays."""
    ridge_point(peak_flops, bandwidth)  # validates
    import numpy as np

    return np.minimum(peak_flops, np.asarray(intensity, dtype=float) * bandwidth)


def roofline_time(flops: float, n_bytes: float, peak_flops: float, bandwidth: float) -> float:
    """The roofline's lower bound on time: max(flops / peak, bytes / bandwidth) seconds."""
    ridge_point(peak_flops, bandwidth)
    return max(flops / peak_flops, n_bytes / bandwidth)


def bandwidth_bound_tokens_per_s(bytes_per_step: float, bandwidth: float, batch_size: int = 1) -> float:
    """Decode ceiling when every step must stream `bytes_per_step` from memory: each step yields one
    token per sequence, so tokens/s <= batch_size * bandwidth / bytes_per_step."""
    if not bytes_per_step > 0 or not bandwidth > 0:
        raise ValueError(f"bytes_per_step and bandwidth must be > 0; got {bytes_per_step!r}, {bandwidth!r}")
    _check_int("batch_size", batch_size, 1)
    return batch_size * bandwidth / bytes_per_step
