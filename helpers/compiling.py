"""torch.compile's plumbing for the static decode graphs: where the generated code is cached, the compile
options, compiling by calling (warm_compiled), the record of cold compile times, and skipping guards.

FastGenerator (fast_decode.py) and the fused speculative rounds (speculative/compiled.py) share it. Nothing
here runs at import: use_course_compile_cache() points the cache at the course's folder when a generator is
built. Out of scope: choosing what to compile (the callers decide) and GPU-specific modes beyond passing
`mode` through.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings

import torch

from .device import synchronize
from .paths import INDUCTOR_CACHE


def inductor_cache_dir() -> str:
    """Where the course keeps inductor's generated code: .cache/inductor/<ATen's CPU capability>, one folder
    per instruction set ("avx512", "avx2", "default"; set ATEN_CPU_CAPABILITY to choose another).

    One folder per instruction set, because torch 2.13 reused cached code across them: with one shared
    folder, filled under AVX-512 and then read under ATEN_CPU_CAPABILITY=avx2, the course model's compiled
    step returned NaN logits, and under ATEN_CPU_CAPABILITY=default its C++ failed to build ("'at::vec' has
    not been declared"); with a fresh folder each setting compiled and gave generate's tokens. The same
    would happen to a folder shared by machines with different CPUs (a network home directory, a CI cache).
    The tests and scripts/run_notebooks.py use this folder too; TORCHINDUCTOR_CACHE_DIR, when set, wins."""
    return str(INDUCTOR_CACHE / torch.backends.cpu.get_cpu_capability().lower())


def use_course_compile_cache() -> str:
    """Point torch.compile's on-disk cache at inductor_cache_dir() unless TORCHINDUCTOR_CACHE_DIR is set, and
    let dynamo keep enough graphs per code object for many generators; returns the cache folder in use.

    Called when a FastGenerator is built (and by the test setup, before any notebook kernel starts), not at
    import: importing the course's helpers changes nothing. Inductor reads the variable when it first
    compiles, so call this before the first torch.compile of a process."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor_cache_dir())
    # dynamo keeps at most `recompile_limit` graphs per code object, and every FastGenerator compiles the same
    # methods (_static_step, _static_forward): each model, buffer size and token count is one more graph of
    # that code. The default (8) is reached by one process that builds a dozen generators (the bench does:
    # compile levers, speculative draft and target, quantized models), after which compiling fails with
    # FailOnRecompileLimitHit and the generator falls back to eager. Each graph is still guarded by its own
    # generator's tensors, so a larger limit only lets more generators coexist.
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def cold_compile_record() -> str:
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR", inductor_cache_dir())
    return os.path.join(folder, "fast_decode_cold_compiles.json")


def read_cold_compiles() -> dict:
    try:
        with open(cold_compile_record()) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def inductor_cache_counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]


def remember_cold_compile(key: str, seconds: float) -> None:
    """Note in the record beside the cache that the graph with this key took `seconds` to compile cold."""
    record = read_cold_compiles()
    record[key] = round(seconds, 1)
    try:
        os.makedirs(os.path.dirname(cold_compile_record()), exist_ok=True)
        with open(cold_compile_record(), "w") as f:
            json.dump(record, f, indent=1)
    except OSError:
        pass  # a read-only cache folder: nothing to remember, nothing lost


def compile_options(
    mode: str | None, *, cpp_wrapper: bool, freeze: bool, gemm_autotune: bool = False, pooled: bool = False
) -> dict:
    """torch.compile's keyword arguments for a static decode graph (one fixed shape, the whole graph).

    gemm_autotune (with freeze): prepack the frozen weights and let inductor time its own generated C++
    matmul (its CPU GEMM template) against the library's call for each product, keeping the faster (see
    the module docstring for what it buys and costs).
    pooled (with cpp_wrapper): inductor's memory planning, one allocation a call for all intermediate
    buffers instead of one each (a quantized course-model step allocated and freed ~100 small buffers:
    a quarter of its time in malloc and free, sampled with a CPU profiler)."""
    options = {}
    if cpp_wrapper:
        options["cpp_wrapper"] = True
        if pooled:
            options["memory_planning"] = True
    if freeze:  # constants, not inputs; without the autotuned template, prepacking alone was slower
        options.update({"freezing": True, "cpp.weight_prepack": gemm_autotune})
        if gemm_autotune:  # quietly: no table of timings per product on stderr
            options.update(
                {
                    "max_autotune": True,
                    "max_autotune_gemm_backends": "CPP,ATEN",
                    "autotune_num_choices_displayed": 0,
                    "max_autotune_report_choices_stats": False,
                }
            )
    if mode is not None and options:  # torch.compile takes a mode or options, not both: spell the mode out
        options = {**torch._inductor.list_mode_options(mode), **options}
    return dict(mode=None if options else mode, fullgraph=True, dynamic=False, options=options or None)


@contextlib.contextmanager
def conversions_kept():
    """While a frozen graph compiles: inductor's constant folding leaves dtype conversions of the weights
    in the graph. By default it folds them ahead of time, which turns quantize/'s int8 codes and 16-bit
    weights back into float32 constants (four or two times the bytes each step reads); kept, they run in
    the generated loop that multiplies. Inductor's list of ops not to fold is global: this clears it on
    exit (nothing else in the course fills it)."""
    from torch._inductor import constant_folding

    constant_folding.add_dont_constant_fold(torch.ops.prims.convert_element_type.default)
    try:
        yield
    finally:
        constant_folding.clear_dont_constant_fold()


def warm_compiled(
    fn, args, caches, slots: int, freeze: bool, keep_conversions: bool = False
) -> tuple[Exception | None, float, bool]:
    """Call a compiled fn(*args) twice, so that it compiles (CUDA graphs record on a later call than the
    first), keeping the first `slots` positions of each KVCache in `caches` as they were (the call writes
    them); keep_conversions (with freeze): compile under conversions_kept(). Returns (the error if it failed,
    else None; seconds; whether inductor's cache missed: cold)."""
    saved = [(c.k[:, :, :, :slots].clone(), c.v[:, :, :, :slots].clone()) for c in caches]
    _, misses = inductor_cache_counts()
    t0 = time.perf_counter()
    error = None
    # dynamo reads inductor's freezing flag itself while tracing (it then treats the weights as
    # constants, not inputs), so the flag must be set around the calls that trace, not only in options
    freezing = torch._inductor.config.patch(freezing=True) if freeze else contextlib.nullcontext()
    kept = conversions_kept() if freeze and keep_conversions else contextlib.nullcontext()
    try:
        with freezing, kept, warnings.catch_warnings():
            # inductor's autotuner reads a weight through the deprecated TypedStorage: not the caller's concern
            warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
            for _ in range(2):
                fn(*args)
        synchronize(caches[0].k.device)
    except Exception as e:  # noqa: BLE001 - any compiler failure means: run eagerly
        error = e
    seconds = time.perf_counter() - t0
    for c, (k, v) in zip(caches, saved):
        c.k[:, :, :, :slots] = k
        c.v[:, :, :, :slots] = v
    return error, seconds, error is None and inductor_cache_counts()[1] > misses


def guards_checked_once():
    """A context manager in which dynamo skips its guard checks (shapes, dtypes, grad mode, the weights) on
    calls into graphs that have already had them checked once. The decode loops enter it after their first
    step, since nothing in a loop changes what the guards test; time steps inside it to time them as the
    loops run them (checked, the course model's 1-token step took 1.13-1.27 ms where the plain loop spent
    0.88-0.94 ms a token: autotuned GEMM, one thread, AMD Zen 5). Where one function holds several graphs
    (T = 1 and 2, or target and draft), torch still checks the guards that tell them apart."""
    return torch.compiler.set_stance(skip_guard_eval_unsafe=True)
