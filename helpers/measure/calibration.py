"""This machine's ceilings, measured once per process and shared: the numbers every speed claim is held against.

    cal = calibrate()                  # a few seconds the first time; the same object on every later call
    print(cal.summary())               # one line: CPU, instruction set, threads, the ceilings
    cal.peak_flops, cal.read_bandwidth, cal.cache_read_bandwidth
    cal.read_roof(19e6)               # the read roof of a 19 MB working set: in-cache if it fits the cache

What is measured, each the median of several timed calls (measure/timing.py) after a warm-up:
- peak matmul FLOP/s: a large square matmul (roofline.measure_matmul_flops);
- read-only bandwidth: a streaming sum over a buffer several times larger than the last-level cache, with
  the threads torch uses now and with every core. A decode step only *reads* its weights, so this is the
  memory roof of a step;
- copy bandwidth beside it: dst.copy_(src) over the same bytes, counted as STREAM does (bytes read + bytes
  written). The two are timed interleaved, so a change in the machine's load hits both alike;
- in-cache read bandwidth: the same sum over a working set half the size of the last-level cache. The
  course model's weights (about 19 MB in float32) fit a last-level cache of 32 MB or more, so on such a
  CPU a decode step of it is bounded by this roof, not by main memory's.

Why cached: the ceilings are properties of the machine, and a chapter that measured them again in every
cell would hold each result against different numbers (a shared machine's speed drifts). One measurement per
process (a notebook kernel, the bench) keeps every ratio of that run on the same denominator. Keyed by
device and thread count: calibrate() after torch.set_num_threads(n) measures again.

One run, one calibration: where the variable LLM_COURSE_CALIBRATION names a JSON file (scripts/run_notebooks.py
sets it for a regeneration run), calibrate() reads the ceilings from it when it was measured on the same CPU,
instruction set, device and thread count, and otherwise measures them and writes the file. Every notebook of
that run then prints, and divides by, the same figures. Without the variable nothing touches the disk (a
learner's machine can change between runs).

Left out: per-core cache levels (L1, L2), write bandwidth, latency, GPU L2 tuning, any vendor figure (the
chapters state spec sheets themselves).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from .roofline import measure_matmul_flops
from .timing import median, time_call, time_interleaved

MiB = 2**20
ASSUMED_LAST_LEVEL_CACHE = 32 * MiB  # when the OS does not say (sizes the buffers only; reported as unknown)


@dataclass(frozen=True)
class Calibration:
    """Ceilings of one device at one thread count. Bandwidths in bytes per second (read-only ones count each
    byte once; copy counts it read and written), FLOP/s for the matmul."""

    device: str
    cpu: str  # the processor's name as the OS reports it
    isa: str  # ATen's CPU capability: the vector instructions its kernels use ("AVX512", "AVX2", "DEFAULT")
    threads: int  # torch's threads for every ceiling below, unless named "all threads"
    all_threads: int  # the cores this process may run on
    peak_flops: float
    read_bandwidth: float  # a streaming sum over `dram_bytes`
    read_bandwidth_all_threads: float | None  # the same with every core (None on a GPU)
    copy_bandwidth: float  # dst.copy_(src), src and dst together `dram_bytes`
    cache_read_bandwidth: float  # a streaming sum over `cache_bytes`
    dram_bytes: int
    cache_bytes: int
    last_level_cache: int | None  # bytes, as the OS reports it (None: unknown)

    def summary(self) -> str:
        """One line for the top of a chapter: where this ran and the ceilings it is held against."""
        gb = 1e9
        llc = f"{self.last_level_cache // MiB} MiB" if self.last_level_cache else "an unknown"
        all_threads = (
            f", {self.read_bandwidth_all_threads / gb:.1f} GB/s with {self.all_threads} threads"
            if self.read_bandwidth_all_threads is not None and self.all_threads != self.threads
            else ""
        )
        return (
            f"{self.cpu} ({self.isa}), {self.threads} of {self.all_threads} threads: matmul "
            f"{self.peak_flops / 1e9:.0f} GFLOP/s; read {self.read_bandwidth / gb:.1f} GB/s "
            f"({self.dram_bytes // MiB} MiB{all_threads}), copy {self.copy_bandwidth / gb:.1f} GB/s; in-cache read "
            f"{self.cache_read_bandwidth / gb:.1f} GB/s ({self.cache_bytes // MiB} MiB of {llc} last-level cache)"
        )

    def fits_in_cache(self, working_set_bytes: float) -> bool:
        """Whether `working_set_bytes` fit the last-level cache the OS reports (False where it reports none)."""
        return bool(self.last_level_cache) and working_set_bytes <= self.last_level_cache

    def read_roof(self, working_set_bytes: float) -> float:
        """The read bandwidth that bounds streaming `working_set_bytes` over and over (a decode step's weights):
        the in-cache roof where they fit the last-level cache, main memory's read-only roof where they do not."""
        return self.cache_read_bandwidth if self.fits_in_cache(working_set_bytes) else self.read_bandwidth


def cpu_name() -> str:
    """The processor's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def last_level_cache_bytes() -> int | None:
    """The largest cache the OS lists for CPU 0 (Linux sysfs), in bytes; None where it lists none."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes) if sizes else None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


def read_bandwidth(buf: torch.Tensor, repeats: int = 7, warmup: int = 1) -> float:
    """Bytes per second of buf.sum(): every byte read once, nothing written but one number."""
    seconds = time_call(buf.sum, buf.device, repeats=repeats, warmup=warmup)
    return buf.numel() * buf.element_size() / median(seconds)


def _with_threads(n: int, fn):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(old)


def _main_memory(device: torch.device, n_bytes: int, repeats: int) -> tuple[float, float, float | None]:
    """(read-only, copy, read-only with every core) bandwidth over an n_bytes buffer; the last on a CPU only."""
    big = torch.ones(n_bytes // 4, device=device)  # float32, touched: its pages exist
    src, dst = big[: big.numel() // 2], big[big.numel() // 2 :]  # the copy moves the bytes the sum reads
    t_read, t_copy = time_interleaved([big.sum, lambda: dst.copy_(src)], device, repeats=repeats)
    read, copy = n_bytes / median(t_read), 2 * src.numel() * 4 / median(t_copy)
    if device.type != "cpu":
        return read, copy, None
    return read, copy, _with_threads(usable_cores(), lambda: read_bandwidth(big, repeats))


def measure_ceilings(device="cpu", repeats: int = 7) -> Calibration:
    """Measure every ceiling now (calibrate() caches this). A few seconds on a CPU."""
    device = torch.device(device)
    on_cpu = device.type == "cpu"
    if device.type == "cuda":
        llc = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", None)
    else:
        llc = last_level_cache_bytes() if on_cpu else None
    sized = llc or ASSUMED_LAST_LEVEL_CACHE
    # far beyond the last-level cache; on a GPU 1 GiB, so that one pass outlasts the launch overhead
    dram_bytes = min(max(256 * MiB, 4 * sized), 1024 * MiB) if on_cpu else 1024 * MiB
    cache_bytes = max(sized // 2, MiB)  # fits it with room to spare
    read, copy, read_all = _main_memory(device, dram_bytes, repeats)
    small = torch.ones(cache_bytes // 4, device=device)  # float32
    cache_read = read_bandwidth(small, repeats, warmup=3)  # the warm-up calls bring it into the cache
    peak = measure_matmul_flops(device, repeats=5).per_second
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return Calibration(
        device=str(device),
        cpu=name,
        isa=torch.backends.cpu.get_cpu_capability(),
        threads=torch.get_num_threads(),
        all_threads=usable_cores(),
        peak_flops=peak,
        read_bandwidth=read,
        read_bandwidth_all_threads=read_all,
        copy_bandwidth=copy,
        cache_read_bandwidth=cache_read,
        dram_bytes=dram_bytes,
        cache_bytes=cache_bytes,
        last_level_cache=llc,
    )


def calibrate(device="cpu") -> Calibration:
    """This machine's ceilings for `device` at torch's current thread count: measured on the first call,
    the same Calibration on every later one in this process."""
    return _calibrate(str(torch.device(device)), torch.get_num_threads())


RUN_FILE_VARIABLE = "LLM_COURSE_CALIBRATION"  # a JSON file one regeneration run shares (docstring above)


@functools.lru_cache(maxsize=None)
def _calibrate(device: str, threads: int) -> Calibration:
    path = os.environ.get(RUN_FILE_VARIABLE)
    if not path:
        return measure_ceilings(device)
    key = {"device": device, "cpu": cpu_name(), "isa": torch.backends.cpu.get_cpu_capability(), "threads": threads}
    shared = Path(path)
    try:
        saved = json.loads(shared.read_text())
        if all(saved.get(k) == v for k, v in key.items()):
            return Calibration(**saved)
    except (OSError, ValueError, TypeError):  # absent, unreadable or from another version: measure again
        pass
    cal = measure_ceilings(device)
    shared.parent.mkdir(parents=True, exist_ok=True)
    shared.write_text(json.dumps(dataclasses.asdict(cal)))
    return cal
