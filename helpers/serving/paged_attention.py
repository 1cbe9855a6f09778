"""Decode attention that reads the paged KV cache where it lies, block by block, through each block table.

A decoding request has one query row per head and its keys/values scattered over the pool's blocks
(paged_cache.py). Two ways to attend:

- gather: copy the request's blocks into a dense (B, Hkv, S, D) tensor, then call SDPA. Every layer,
  every step, that copies the whole context of every running request once more (PagedKVCache.gather);
- in place: walk the block table and read each block where it is, keeping chapter 08's online softmax
  (a running max m, a running sum l, an output accumulator rescaled by exp(m_old - m_new) whenever a
  block raises the max). Nothing is copied; this is what vLLM's PagedAttention kernel does.

`attention_by_blocks` is the in-place method written in torch for one request: slices of the pool are
views, so it copies nothing either, but it runs a few torch calls per block and is only for reading
and checking. `paged_decode_attention` is the same loop in C (kernels/paged_decode.c), compiled once
with the machine's C compiler and cached under .cache/kernels/; the engine uses it for every decoding
request, through `PagedDecoder` (the step's tables checked and converted once, then one
call per layer). tests/test_paged_attention.py checks both against the gather path and SDPA.

Why a C loop and not torch.compile or FlexAttention: measured with one thread on a 2-core x86 CPU
(batch 32, 513 keys each, the course model's heads), a compiled torch expression of the same indexing
(Inductor, indirect loads) ran about 10x slower than the C loop, and FlexAttention with a block mask over
the whole pool compiled for 37 s and ran about 20x slower; the C loop ran at about the cost of SDPA over
an already-dense cache. bench.py measures the step against both baselines on the machine at hand.

What the C loop does beyond the plain loop, each measured with one thread on a 2-core x86 CPU (batch 32,
scattered blocks, with a few MB streamed between layers as the weights do in a real step): it asks for the
block two places on in the stream of blocks a few cache lines per key while it computes (asking for a
whole block at once stalled the core on its limit of outstanding misses; together about 1.6-2x), and it
sums a 16-slot block's 16 scores across vector lanes together rather than one at a time (about 1.1x, same
bits). tests/test_paged_attention.py checks the kernel at several block sizes and head shapes.

The eager step keeps the gather path for prefill chunks (step_view.py): a chunk of T queries reads each
key T times, so one O(S) copy is small next to the O(T * S) attention that follows and SDPA's blocked
kernel does that part well; the copy that mattered is the per-step one of every decoding request. The
compiled step (compiled_step.py) gives the kernel every prompt row as a query of its own, with its own
length (its position + 1): causal attention with no mask and no copy, each key re-read from the cache.

Left out: threads (the course runs one), dtypes other than float32, ALiBi/soft-capping/sliding windows,
the split-K (flash-decoding) partition of one long context across cores, and GPUs (vLLM's and
FlashInfer's kernels are the real ones; the same layout and loop are what they tile).
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from ..paths import CACHE

SOURCE = os.path.join(os.path.dirname(__file__), "kernels", "paged_decode.c")
KERNELS = CACHE / "kernels"
# Tried in order; the first that compiles is used. -ffast-math lets the compiler vectorize expf and the
# sums; it is given only when compiling (not when linking), so it cannot switch the process's floats to
# flush-to-zero. -march=native: the kernel is built on the machine that runs it.
FLAG_SETS = (["-O3", "-march=native", "-ffast-math"], ["-O3", "-ffast-math"], ["-O2"])


def attention_by_blocks(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, table: list[int], length: int, block_size: int
) -> torch.Tensor:
    """One request's decode attention read block by block from the pool, with the online softmax.

    q (H, D); k_pool, v_pool (num_blocks * block_size, Hkv, D) one layer's pool; table: the request's
    blocks in position order; length: keys to attend to. Returns (H, D)."""
    H, D = q.shape
    Hkv = k_pool.shape[1]
    qg = q.view(Hkv, H // Hkv, D) / math.sqrt(D)  # (Hkv, G, D): the query heads that share a kv head
    m = torch.full((Hkv, H // Hkv, 1), float("-inf"))  # running max of the scores
    l = torch.zeros(Hkv, H // Hkv, 1)  # running sum of exp(score - m)
    acc = torch.zeros(Hkv, H // Hkv, D)  # running sum of exp(score - m) * v
    for j in range(math.ceil(length / block_size)):
        start = table[j] * block_size
        used = min(block_size, length - j * block_size)  # the last block may be part full
        k = k_pool[start : start + used].transpose(0, 1)  # (Hkv, used, D): a view of the pool, no copy
        v = v_pool[start : start + used].transpose(0, 1)
        s = qg @ k.transpose(1, 2)  # (Hkv, G, used)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)  # (Hkv, G, used)
        correction = torch.exp(m - m_new)  # shrinks what earlier blocks summed when the max went up
        l = l * correction + p.sum(-1, keepdim=True)
        acc = acc * correction + p @ v
        m = m_new
    return (acc / l).reshape(H, D)


_libs: dict[tuple[int, int, int, int], ctypes.CDLL | None] = {}


def _build(head_dim: int, kv_heads: int, group: int, block_size: int) -> ctypes.CDLL | None:
    """Compile kernels/paged_decode.c for these sizes, once per source, flags and machine (cached under
    .cache/kernels/); None when no compiler works."""
    with open(SOURCE, "rb") as f:
        source = f.read()
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    sizes = [f"-DHEAD_DIM={head_dim}", f"-DKV_HEADS={kv_heads}", f"-DGROUP={group}", f"-DBLOCK={block_size}"]
    folder = KERNELS
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # an installed package without a writable checkout: a per-user folder instead
        folder = Path(tempfile.gettempdir()) / f"llm-course-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}"
        folder.mkdir(parents=True, exist_ok=True)
    for flags in FLAG_SETS:
        key = hashlib.sha256(source + " ".join([cc, *flags, *sizes, platform.machine(), platform.node()]).encode())
        path = folder / f"paged_decode-{head_dim}-{kv_heads}-{group}-{block_size}-{key.hexdigest()[:12]}.so"
        if not path.exists():
            with tempfile.TemporaryDirectory(dir=folder) as tmp:
                obj, so = os.path.join(tmp, "k.o"), os.path.join(tmp, "k.so")
                compiled = subprocess.run([cc, *flags, *sizes, "-fPIC", "-c", SOURCE, "-o", obj], capture_output=True)
                if (
                    compiled.returncode
                    or subprocess.run([cc, "-shared", obj, "-o", so, "-lm"], capture_output=True).returncode
                ):
                    continue
                os.replace(so, path)  # atomic: a second process never loads a half-written file
        lib = ctypes.CDLL(str(path))
        P, I64 = ctypes.c_void_p, ctypes.c_int64
        lib.paged_decode.argtypes = [P, P, P, P, P, I64, I64, ctypes.c_float, P]
        lib.paged_decode.restype = None
        return lib
    return None


def _kernel(head_dim: int, kv_heads: int, group: int, block_size: int) -> ctypes.CDLL | None:
    key = (head_dim, kv_heads, group, block_size)
    if key not in _libs:
        _libs[key] = _build(*key)
    return _libs[key]


def kernel_available(head_dim: int = 32, kv_heads: int = 2, group: int = 4, block_size: int = 16) -> bool:
    """Whether the C kernel builds for these sizes (the first call compiles it, about a second): needs a C
    compiler."""
    return _kernel(head_dim, kv_heads, group, block_size) is not None


def _launch(lib, q, k, v, tables, lengths, layer: int) -> torch.Tensor:
    """The kernel's call on checked inputs: q (N, H, D); k, v (L, slots, Hkv, D); tables (N, W); lengths (N,)."""
    out = torch.empty_like(q)  # (N, H, D)
    offset = layer * k.stride(0) * k.element_size()  # layer `layer`'s pool starts this many bytes in
    lib.paged_decode(
        q.data_ptr(),
        k.data_ptr() + offset,
        v.data_ptr() + offset,
        tables.data_ptr(),
        lengths.data_ptr(),
        q.shape[0],
        tables.shape[1],
        1.0 / math.sqrt(q.shape[2]),
        out.data_ptr(),
    )
    return out


class PagedDecoder:
    """The C kernel set up once per step for N decoding requests, then called once per layer.

        decode = PagedDecoder(tables, lengths, block_size, cache.k, cache.v)    # checks, pointers: once
        out = decode(layer, q)                                                    # (N, H, D), per layer

    tables (N, W) long, each row a request's blocks (entries past its length are never read); lengths (N,)
    long, keys per request, each >= 1; k, v (L, num_blocks * block_size, Hkv, D) contiguous float32 CPU:
    every layer's pool. The per-layer call checks only q and passes raw pointers (layer l's pool starts
    l * (its size) floats in), so a step pays the checks and index conversions once, not once per layer.
    Raises RuntimeError without a C compiler."""

    def __init__(self, tables: torch.Tensor, lengths: torch.Tensor, block_size: int, k: torch.Tensor, v: torch.Tensor):
        for name, t in (("k_pool", k), ("v_pool", v)):
            if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
                raise ValueError(f"{name} must be a contiguous float32 CPU tensor; got {t.dtype} on {t.device}")
        if k.dim() != 4 or v.shape != k.shape:
            raise ValueError(f"k and v must be (L, slots, Hkv, D) of one shape; got {tuple(k.shape)}, {tuple(v.shape)}")
        self.tables = tables.to(torch.int64).contiguous()  # kept: the kernel reads them through raw pointers
        self.lengths = lengths.to(torch.int64).contiguous()
        N = self.tables.shape[0]
        if self.tables.dim() != 2 or self.lengths.shape != (N,):
            raise ValueError(
                f"tables must be (N, W) and lengths (N,); got {tuple(self.tables.shape)}, {tuple(self.lengths.shape)}"
            )
        if N and int(self.lengths.min()) < 1:
            raise ValueError("every length must be >= 1")
        self.k, self.v, self.block_size = k, v, block_size
        self.Hkv, self.D = k.shape[2], k.shape[3]
        self.N, self.W = N, self.tables.shape[1]
        self.lib = None  # built on the first call, when the number of query heads is known

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Decode attention of q (N, H, D) contiguous float32 over layer `layer`'s pool -> (N, H, D)."""
        N, H, D = q.shape
        if q.dtype != torch.float32 or q.device.type != "cpu" or not q.is_contiguous():
            raise ValueError(f"q must be a contiguous float32 CPU tensor; got {q.dtype} on {q.device}")
        if N != self.N or H % self.Hkv or D != self.D:
            raise ValueError(
                f"q (N, H, D) = {tuple(q.shape)} does not fit a pool of shape {tuple(self.k.shape)} "
                f"read for {self.N} requests (H must be a multiple of its kv heads, D equal)"
            )
        if self.lib is None:
            self.lib = _kernel(D, self.Hkv, H // self.Hkv, self.block_size)
            if self.lib is None:
                raise RuntimeError("paged_decode_attention needs a C compiler (cc, gcc or clang, or $CC): none worked")
        return _launch(self.lib, q, self.k, self.v, self.tables, self.lengths, layer)


def paged_decode_layer(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tables: torch.Tensor,
    lengths: torch.Tensor,
    layer: int,
    block_size: int,
) -> torch.Tensor:
    """PagedDecoder's per-layer call without its per-step set-up: for a caller that built `tables` (N, W) and
    `lengths` (N,) itself (contiguous int64, each length >= 1 and covered by its table), as compiled_step.py's
    custom op does once per layer. Checks only what costs no pass over the data (dtypes, layouts, shapes).
    q (N, H, D), k, v (L, slots, Hkv, D) contiguous float32 CPU. Returns (N, H, D)."""
    N, H, D = q.shape
    Hkv = k.shape[2]
    for name, t, dtype in (("q", q, torch.float32), ("k", k, torch.float32), ("v", v, torch.float32)):
        if t.dtype != dtype or t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 CPU tensor; got {t.dtype} on {t.device}")
    for name, t in (("tables", tables), ("lengths", lengths)):
        if t.dtype != torch.int64 or not t.is_contiguous() or t.shape[0] != N:
            raise ValueError(f"{name} must be contiguous int64 with {N} rows; got {t.dtype}, {tuple(t.shape)}")
    if v.shape != k.shape or k.shape[3] != D or H % Hkv or not 0 <= layer < k.shape[0]:
        raise ValueError(f"q {tuple(q.shape)} and pools {tuple(k.shape)}, {tuple(v.shape)} do not fit layer {layer}")
    lib = _kernel(D, Hkv, H // Hkv, block_size)
    if lib is None:
        raise RuntimeError("paged_decode_layer needs a C compiler (cc, gcc or clang, or $CC): none worked")
    return _launch(lib, q, k, v, tables, lengths, layer)


def paged_decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    tables: torch.Tensor,
    lengths: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """Decode attention for N requests at once, read in place through their block tables (the C kernel).

    q (N, H, D) float32; k_pool, v_pool (num_blocks * block_size, Hkv, D) one layer's pool; tables (N, W)
    long, each row a request's blocks (entries past its length are never read); lengths (N,) long, keys
    per request, each >= 1. Returns (N, H, D). CPU only; raises RuntimeError without a C compiler.
    (PagedDecoder is the same call set up once for every layer of a step.)"""
    for name, t in (("k_pool", k_pool), ("v_pool", v_pool)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be (slots, Hkv, D); got shape {tuple(t.shape)}")
    if q.dim() != 3 or tables.shape[0] != q.shape[0]:
        raise ValueError(
            f"tables must be (N, W) and lengths (N,) with N = {q.shape[0]}; got "
            f"{tuple(tables.shape)}, {tuple(lengths.shape)}"
        )
    return PagedDecoder(tables, lengths, block_size, k_pool.unsqueeze(0), v_pool.unsqueeze(0))(0, q)
