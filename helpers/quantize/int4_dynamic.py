"""The "dynamic" int4 kernel: 4-bit weight codes times activations rounded to 8 bits per group, in C++.

torch has no CPU kernel that multiplies int4 codes by int8 activations; llama.cpp's q4_0 does exactly that
(q4_0 x q8_0), and on a CPU with AVX512-VNNI its byte dot products read the codes about twice as fast as
torch's int4pack kernel, which widens every code to bf16 (the 149M config's 52 matrices, one thread, on an
AMD Zen 5 VM: 18-22 GB/s against 10-12). `int4_dynamic.cpp` holds the kernel; this module builds it once
per machine with the system's C++ compiler into .cache/kernels/ (about 20 s, then loaded in well under a
second), registers it as `torch.ops.course_int4`, and holds the same arithmetic in plain torch
(`reference_mm`) for the tests and for reading.

    rounded   x ~ d * a per group of g inputs: d = max|x| / 127, a = round(x / d) in -127..127
    product   y[n] = sum_g  s[n,g] * d_g * sum_k (q[n,k] - 8) a_k  +  z[n,g] * sum_k x_k

The zeros multiply the group's exact float sum of x, so only the scale term sees the rounding. Rounding the
activations adds error that weight-only int4 has not (the tests bound it; chapter 11 measures the same for
int8's "dynamic" kernel), so "auto" never picks it: it is the kernel to set beside llama.cpp's q4_0.

`available()` is True where a compiler built the file; `VNNI` where the CPU has AVX512-VNNI and torch's
kernels are not held below AVX-512 (the course's restricted-CPU run holds them to the default capability:
there the scalar loop runs, slowly, with the same codes). Left out: building ahead of time (a wheel), CPUs
without AVX-512 getting a vector path (AVX2's vpmaddubsw would need the pair-sum saturation guard of
helpers.quantize.dynamic), and any GPU.
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

SOURCE = Path(__file__).with_name("int4_dynamic.cpp")
KERNELS = CACHE / "kernels"  # built libraries (beside the paged-attention kernel's), one per source, torch and compiler
# A layer rounds and multiplies up to this many rows with the kernel (a decode step, a verify pass: each block of
# codes is read once for all of them); more rows (a prefill) are one GEMM over the dequantized weight
ROUNDED_ROWS = 16


def compiler() -> str | None:
    """The C++ compiler: $CXX, else c++ or g++ on the PATH; None if there is none."""
    for name in (os.environ.get("CXX"), "c++", "g++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _library_path(cxx: str) -> Path:
    key = hashlib.sha256(SOURCE.read_bytes() + f"{torch.__version__} {cxx} {platform.machine()}".encode()).hexdigest()[
        :16
    ]
    return KERNELS / f"int4_dynamic-{key}.so"


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


def buildable() -> bool:
    """An x86-64 CPU and a C++ compiler: what building needs (it can still fail: `load` says why)."""
    return platform.machine().lower() in ("x86_64", "amd64") and compiler() is not None


@functools.cache
def load() -> str | None:
    """Build (once per machine) and load the kernel; None where it is loaded, else why it cannot be."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the kernel is written for x86-64; this CPU is {platform.machine()}"
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
    if torch.ops.course_int4.rows_at_once() != ROWS_AT_ONCE:
        return f"{SOURCE.name} interleaves {torch.ops.course_int4.rows_at_once()} rows, this module {ROWS_AT_ONCE}"
    _register_fake()
    return None


def available() -> bool:
    return load() is None


def _register_fake() -> None:
    """Shapes for torch.compile: the compiled step calls the kernel as an opaque operator."""

    @torch.library.register_fake("course_int4::dynamic_mm")
    def _(x, codes, scales, zeros, group_size, vnni):
        return x.new_empty(x.shape[0], codes.shape[0])


@functools.cache
def vnni() -> bool:
    """AVX512-VNNI on this CPU, and torch's kernels not held below AVX-512 (see the module docstring)."""
    if not available() or torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False
    return bool(torch.ops.course_int4.has_vnni())


def check_group_size(group_size: int) -> None:
    """The kernel reads 128 codes at a time: a group of 64 is half of that, larger groups whole multiples."""
    if group_size != 64 and group_size % 128:
        raise ValueError(f"group_size must be 64 or a multiple of 128 for the int4 'dynamic' kernel; got {group_size}")


def mm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int):
    """x (M, K) float32 times the weight of `codes` (N, G, g/2) uint8 (the kernel's layout: pack), `scales` and `zeros`
    (N, G) bf16 -> (M, N) float32, the activations rounded to int8 per group."""
    return torch.ops.course_int4.dynamic_mm(x, codes, scales, zeros, group_size, vnni())


def dequantize(codes, scales, zeros, group_size: int, out: torch.Tensor) -> torch.Tensor:
    """The (N, K) weight in out's dtype (float32 or bfloat16), written into `out`."""
    torch.ops.course_int4.dequantize(codes, scales, zeros, group_size, out)
    return out


ROWS_AT_ONCE = 4  # rows per interleaved block: the C++ loop's (load() checks that the two agree)


def interleave_rows(codes: torch.Tensor) -> torch.Tensor:
    """Halves-layout codes (N, G, g/2) -> the kernel's layout, same shape: in each block of ROWS_AT_ONCE rows,
    64 bytes of the first row, 64 of the second, ..., then the next 64 of each (a last 32-byte half unit
    likewise), so the loop computing a block's rows side by side reads one sequential stream. Rows after the
    last whole block stay as they are."""
    N, R = codes.shape[0], ROWS_AT_ONCE
    flat = codes.reshape(N, -1)  # (N, row_bytes)
    row_bytes, N4 = flat.shape[1], N - N % R
    full = row_bytes // 64 * 64
    blocks = flat[:N4].reshape(N4 // R, R, row_bytes)  # (B, R, row_bytes)
    units = blocks[:, :, :full].reshape(N4 // R, R, full // 64, 64).transpose(1, 2).reshape(N4 // R, R * full)
    half = blocks[:, :, full:].reshape(N4 // R, R * (row_bytes - full))  # (B, R * 32) or empty
    return torch.cat([torch.cat([units, half], 1).reshape(N4, row_bytes), flat[N4:]]).reshape(codes.shape)


def deinterleave_rows(codes: torch.Tensor) -> torch.Tensor:
    """The inverse of interleave_rows: the kernel's layout -> halves-layout codes (N, G, g/2)."""
    N, R = codes.shape[0], ROWS_AT_ONCE
    flat = codes.reshape(N, -1)
    row_bytes, N4 = flat.shape[1], N - N % R
    full = row_bytes // 64 * 64
    blocks = flat[:N4].reshape(N4 // R, R * row_bytes)
    units = blocks[:, : R * full].reshape(N4 // R, full // 64, R, 64).transpose(1, 2).reshape(N4 // R, R, full)
    half = blocks[:, R * full :].reshape(N4 // R, R, row_bytes - full)
    return torch.cat([torch.cat([units, half], 2).reshape(N4, row_bytes), flat[N4:]]).reshape(codes.shape)


def pack(q: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N, K) codes 0..15 -> the kernel's (N, G, g/2) uint8 layout (halves, then rows interleaved)."""
    from .arithmetic import pack_int4_halves

    return interleave_rows(pack_int4_halves(q, group_size)).contiguous()


def round_activations(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) float32 -> (a (M, K) int8-valued float32, d (M, G)): x ~ d * a per group, as the kernel rounds."""
    M, K = x.shape
    groups = x.reshape(M, K // group_size, group_size)  # (M, G, g)
    amax = groups.abs().amax(-1)  # (M, G)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    a = torch.round(groups * inv.unsqueeze(-1))  # ties to even, as the kernel's conversion
    return a.reshape(M, K), amax / 127.0


def reference_mm(x, codes, scales, zeros, group_size: int) -> torch.Tensor:
    """The kernel's arithmetic in plain torch (float64 sums): what tests compare both of its loops with. codes
    in the kernel's layout (pack)."""
    from .arithmetic import unpack_int4_halves

    M, K = x.shape
    N, G = scales.shape
    a, d = round_activations(x.float(), group_size)
    q = unpack_int4_halves(deinterleave_rows(codes)).double().reshape(N, G, group_size) - 8  # (N, G, g)
    dots = torch.einsum("mgk,ngk->mng", a.double().reshape(M, G, group_size), q)  # (M, N, G): exact integers
    sum_x = x.double().reshape(M, G, group_size).sum(-1)  # (M, G)
    y = (scales.double() * dots * d.double().unsqueeze(1)).sum(-1) + sum_x @ zeros.double().t()
    return y.float()  # (M, N)
