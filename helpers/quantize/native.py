"""The course's own C++ kernels for quantized decode (`cpu_kernels.cpp`): built once per machine, loaded as torch ops.

torch has no CPU kernel that multiplies int4 codes by int8 activations (llama.cpp's q4_0 x q8_0), and its int8
and int4 weight-only kernels read the codes well below the memory's speed at batch 1. `cpu_kernels.cpp` holds
loops that do better: the int4 "dynamic" kernel (helpers/quantize/int4_dynamic.py says what it computes) and
the weight-only "cpu_rows" kernels for int8, fp16 and bf16 weights (QuantizedLinear's docstring). This module
builds the file with the system's C++ compiler against torch's headers into .cache/kernels/ (about 20 s, once
per source, torch version and compiler; then loaded in well under a second) and registers it as
`torch.ops.course_quant`, with the shapes torch.compile needs to call it from a compiled step.

The kernels read weights laid out by `interleave_rows`: the loop computes ROWS_AT_ONCE output rows side by side
(they share each load of the activations and overlap their chains of additions: 1.5-1.9x one row at a time in
cache), and interleaving those rows 64 bytes at a time makes that one sequential stream (four rows read from
four places ran at 0.6x one row from memory, interleaved 1.3-1.4x; the 149M config's int4 matrices, AMD Zen 5
VM, one thread).

`available()` is True where a compiler built the file. `vnni()` where the CPU has AVX512-VNNI and torch's
kernels are not held below AVX-512 (the course's restricted-CPU run holds them to the default capability; there
a scalar loop computes the same sums, slowly). Left out: building ahead of time (a wheel), vector loops for
CPUs without AVX-512, and any GPU.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from ..paths import CACHE

SOURCE = Path(__file__).with_name("cpu_kernels.cpp")
KERNELS = CACHE / "kernels"  # built libraries (beside the paged-attention kernel's), one per source, torch and compiler
ROWS_AT_ONCE = 4  # output rows per interleaved block: the C++ loop's (load() checks that the two agree)
# A layer multiplies up to this many input rows with a kernel here (a decode step, a verify pass: each block of
# codes is read once for all of them); more rows (a prefill) are one GEMM over the dequantized weight
MAX_ROWS = 16


def compiler() -> str | None:
    """The C++ compiler: $CXX, else c++ or g++ on the PATH; None if there is none."""
    for name in (os.environ.get("CXX"), "c++", "g++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def buildable() -> bool:
    """An x86-64 CPU and a C++ compiler: what building needs (it can still fail: `load` says why)."""
    return platform.machine().lower() in ("x86_64", "amd64") and compiler() is not None


def _library_path(cxx: str) -> Path:
    key = hashlib.sha256(SOURCE.read_bytes() + f"{torch.__version__} {cxx} {platform.machine()}".encode())
    return KERNELS / f"cpu_kernels-{key.hexdigest()[:16]}.so"


def _build(cxx: str, out: Path) -> None:
    from torch.utils import cpp_extension

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)  # two processes may build at once: each its own file
    os.close(fd)
    lib_dirs = cpp_extension.library_paths()
    cmd = [cxx, "-O3", "-shared", "-fPIC", "-std=c++17", str(SOURCE), "-o", tmp]
    cmd += [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
    cmd += [f"-L{p}" for p in lib_dirs] + [f"-Wl,-rpath,{p}" for p in lib_dirs] + ["-ltorch", "-ltorch_cpu", "-lc10"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"building {SOURCE.name} failed:\n{done.stderr[-2000:]}")
        os.replace(tmp, out)  # atomic: a reader sees no file or a whole one
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@functools.cache
def load() -> str | None:
    """Build (once per machine) and load the kernels; None where they are loaded, else why they cannot be."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the kernels are written for x86-64; this CPU is {platform.machine()}"
    cxx = compiler()
    if cxx is None:
        return "no C++ compiler found (set CXX, or install g++)"
    path = _library_path(cxx)
    try:
        if not path.exists():
            _build(cxx, path)
        torch.ops.load_library(str(path))
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        return str(err)
    if torch.ops.course_quant.rows_at_once() != ROWS_AT_ONCE:
        return f"{SOURCE.name} interleaves {torch.ops.course_quant.rows_at_once()} rows, this module {ROWS_AT_ONCE}"
    _register_fake()
    return None


def available() -> bool:
    return load() is None


def _register_fake() -> None:
    """Shapes for torch.compile: a compiled step calls each kernel as an opaque operator."""

    @torch.library.register_fake("course_quant::int4_dynamic_mm")
    def _(x, codes, scales, zeros, group_size, vnni):
        return x.new_empty(x.shape[0], codes.shape[0])

    @torch.library.register_fake("course_quant::int8_rows_mm")
    def _(x, codes, scales, vector):
        return x.new_empty(x.shape[0], codes.shape[0])

    @torch.library.register_fake("course_quant::float16_rows_mm")
    def _(x, weight, vector):
        return x.new_empty(x.shape[0], weight.shape[0])


@functools.cache
def avx512() -> bool:
    """AVX-512 on this CPU, and torch's kernels not held below it: the int8 loop's vector version."""
    if not available() or torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False
    return bool(torch.ops.course_quant.has_avx512())


@functools.cache
def vnni() -> bool:
    """AVX512-VNNI on this CPU, and torch's kernels not held below AVX-512 (see the module docstring)."""
    if not available() or torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False
    return bool(torch.ops.course_quant.has_vnni())


def interleave_weight(w: torch.Tensor) -> torch.Tensor:
    """interleave_rows for any (N, K) weight, bytes moved as bytes (a 16-bit weight: 32 values per 64 bytes)."""
    return interleave_rows(w.contiguous().view(torch.uint8)).view(w.dtype)


def deinterleave_weight(w: torch.Tensor) -> torch.Tensor:
    return deinterleave_rows(w.contiguous().view(torch.uint8)).view(w.dtype)


def interleave_rows(codes: torch.Tensor) -> torch.Tensor:
    """Codes with one row per output, (N, ...) uint8 or int8, -> the kernels' layout, same shape: in each block of
    ROWS_AT_ONCE rows, 64 bytes of the first row, 64 of the second, ..., then the next 64 of each (a last 32-byte
    half unit likewise; a row's bytes must be a multiple of 32). Rows after the last whole block stay as they are."""
    N, R = codes.shape[0], ROWS_AT_ONCE
    flat = codes.reshape(N, -1)  # (N, row_bytes)
    row_bytes, N4 = flat.shape[1], N - N % R
    full = row_bytes // 64 * 64
    blocks = flat[:N4].reshape(N4 // R, R, row_bytes)  # (B, R, row_bytes)
    units = blocks[:, :, :full].reshape(N4 // R, R, full // 64, 64).transpose(1, 2).reshape(N4 // R, R * full)
    half = blocks[:, :, full:].reshape(N4 // R, R * (row_bytes - full))  # (B, R * 32) or empty
    return torch.cat([torch.cat([units, half], 1).reshape(N4, row_bytes), flat[N4:]]).reshape(codes.shape)


def deinterleave_rows(codes: torch.Tensor) -> torch.Tensor:
    """The inverse of interleave_rows: the kernels' layout -> one row after another, same shape."""
    N, R = codes.shape[0], ROWS_AT_ONCE
    flat = codes.reshape(N, -1)
    row_bytes, N4 = flat.shape[1], N - N % R
    full = row_bytes // 64 * 64
    blocks = flat[:N4].reshape(N4 // R, R * row_bytes)
    units = blocks[:, : R * full].reshape(N4 // R, full // 64, R, 64).transpose(1, 2).reshape(N4 // R, R, full)
    half = blocks[:, R * full :].reshape(N4 // R, R, row_bytes - full)
    return torch.cat([torch.cat([units, half], 2).reshape(N4, row_bytes), flat[N4:]]).reshape(codes.shape)
