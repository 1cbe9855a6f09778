"""The row every group of the bench returns: a candidate timed against its baseline, interleaved."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..measure.timing import median


@dataclass
class Row:
    name: str
    baseline: str
    candidate: str
    ratios: list[float]  # baseline time / candidate time, one per interleaved repeat
    baseline_abs: str
    candidate_abs: str
    target: float | None = None  # the course's goal for the ratio (>=)
    note: str = ""
    same_output: bool | None = None
    extra: dict = field(default_factory=dict)

    @property
    def median(self) -> float:
        return median(self.ratios)

    def line(self) -> str:
        lo, hi = min(self.ratios), max(self.ratios)
        goal = ""
        if self.target is not None:
            goal = f">= {self.target:g}x " + ("met" if self.median >= self.target else "MISSED")
        same = "" if self.same_output is None else ("same tokens" if self.same_output else "DIFFERENT TOKENS")
        return (
            f"{self.name:46s} {self.median:6.2f}x [{lo:.2f}-{hi:.2f}]  {self.baseline_abs:>16s} -> "
            f"{self.candidate_abs:<16s} {goal:14s} {same} {self.note}"
        )


def ratios(tb, tc):
    """baseline time / candidate time, one per interleaved repeat."""
    return [b / c for b, c in zip(tb, tc)]


def random_model(preset: str, device, dtype):
    """A seeded random-weight model of a named preset: the memory-bound rows' model."""
    from ..model import ModelConfig, Transformer

    torch.manual_seed(0)
    return Transformer(ModelConfig.from_preset(preset)).to(device=device, dtype=dtype).eval()


def device_description(device) -> str:
    """The device's name as the report prints it (a CPU: its model name, as the OS reports it)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from ..measure.calibration import cpu_name

    return f"{cpu_name()} CPU, {torch.get_num_threads()} threads"


class ReadRoof:
    """The read-only bandwidth that bounds streaming `working_set_bytes` per step, measured again on each call
    of measure() (interleave it with the steps it is the denominator for, so that the machine's load hits both
    alike): a streaming sum over the calibration's in-cache buffer where the working set fits the last-level
    cache, over its main-memory buffer where it does not (measure/calibration.py)."""

    def __init__(self, working_set_bytes: float, device):
        from ..measure.calibration import calibrate

        cal = calibrate(device)
        self.in_cache = cal.fits_in_cache(working_set_bytes)
        self.where = "in-cache" if self.in_cache else "main memory"
        n_bytes = cal.cache_bytes if self.in_cache else cal.dram_bytes
        self.buffer = torch.ones(n_bytes // 4, device=device)  # float32, touched: its pages exist

    def measure(self) -> float:
        """Bytes per second of a streaming sum over the buffer, now (median of a few passes)."""
        from ..measure.calibration import read_bandwidth

        return read_bandwidth(self.buffer, repeats=5, warmup=3 if self.in_cache else 1)
