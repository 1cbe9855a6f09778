"""Fast batch-1 decoding: a decode step with static shapes, compiled once and reused.

For a small model, an eager decode step is mostly per-operation overhead: ~40 small ops per layer,
each a few microseconds of Python and dispatch, around little arithmetic. Two things remove it:

- static shapes: the step writes its K/V at a position held in a tensor and attends over the whole
  cache buffer with a mask (`Transformer(..., input_pos=...)`), so every step has the same shapes;
- `torch.compile` then fuses the step into a few generated kernels (C++ on a CPU, Triton on a GPU);
  on CUDA, mode="reduce-overhead" also records the step as a CUDA graph and replays it, so one launch
  replaces hundreds.

    fast = FastGenerator(model, max_seq_len=320)  # compiles on first use (10-60 s on a CPU, cached on disk)
    ids = fast.generate(prompt, max_new_tokens=256)

Size max_seq_len to the longest generation you need: every step attends over the whole buffer (masked);
a 1,024-token buffer made the course model's step 1.8x slower than one of 288 (CPU, one thread).

`fast.generate` is helpers.generate's own loop (stop conditions, logits processors, sampling; not the
penalties) with the compiled step as its `step`; the prompt's prefill runs eagerly, except a short prompt
of a "fused_dequant" model, which goes through the compiled step one token at a time (`_prefill`). Plain greedy
generation (no stop condition, processor or progress bar) feeds the argmax the step's graph returns back
in as the next token: the course model 1.19-1.32x faster than through that loop (BENCHMARKS.md).
Tokens are the same as `generate`'s (the tests check greedy equality); logits agree to float rounding,
since compiled kernels add in a different order. If compilation is impossible (no C++ compiler, an
unsupported platform) it warns once and runs the same static step eagerly.

Compiling is slow once: the generated code is cached on disk (TORCHINDUCTOR_CACHE_DIR; in this repo
.cache/inductor/<instruction set>, set when the first generator is built: compiling.use_course_compile_cache;
importing this module does nothing), and a later process with the same model shapes loads it in seconds.
`warmup()` says which happened (`compile_source`), and the seconds a cold compile took are kept in a small
record beside the cache (`cold_compile_seconds`), so a run from the cache can still report them.

On a CPU each one-row product of the compiled step is a sum that inductor generates (`gemv="sums"`,
the default there; helpers/row_sums.py), one vectorized C++ loop per product that streams the weights
once. Since 2026-12-07 that loop reads a panel copy of each weight (16 outputs per register, x[k]
broadcast; row_sums.panel_copy), 1.13-1.24x faster over the course model's step than sums along
nn.Linear's own (out, in) rows, at the cost of a second copy of the projections (19 MB for the course
model). Torch's fp32 matrix-vector kernel had read the weights at 0.64-0.72 of the rate of a plain
streaming sum over them, the row sums at 1.0x of it (a 5632 x 1024 product, six weight copies, one thread,
interleaved; 2-core AMD Zen 5 VM shared with other jobs); over the whole step, same VM under load, the row
sums made the course model 1.33x faster than torch's kernel (2.33 against 3.09 ms/token), the 149M random
config (bench-150m) 1.30x (107 against 138 ms). It is ordinary generated code, nothing packed, so
inductor's graph cache keeps it: a new process loads the course model's step in 5-11 s (torch's kernel:
5-9 s); the cold compile took 16-35 s there. A verify pass of 2-8 tokens is one such loop for all its rows,
over the panels (row_sums.MAX_SUM_ROWS); eagerly and for more rows, many_rows.linear (F.linear, or oneDNN's
GEMM from 128 rows: a long prompt's eager prefill). The opt-in autotuned GEMM
below, 1.06-1.26x faster than the row sums, is on par with the panels (1.19-1.23x in the same runs as
1.17-1.24x), at 43 s of lowering in every new process. `gemv="library"` switches back to torch's kernel.

With `gemv="library"` (the default on a GPU) the generator keeps each projection's weight transposed on a
CPU, (in, out) and contiguous (`input_major_copy`): for a batch-1 step, torch's matrix-vector product over
that layout ran 1.6-2.1x faster than over nn.Linear's for the course model's projections (AVX-512 and AVX2;
1.1x with SSE4.2 only; chapter 07 measures it on yours). It costs a second copy of those weights (19 MB for
the course model); `input_major=False` turns it off (and, given without `gemv`, selects torch's kernel). For
several rows at once (a 4-token verify pass, a batch, a prefill) the same layer multiplies by
nn.Linear's own (out, in) weight instead, where the library's kernels are faster (InputMajorLinear):
for 4 rows the 25 products took 2.59 ms instead of 3.89 (interleaved), and the compiled 4-token
verify pass went from 1.83 to 1.59 times the cost of a 1-token step (`python -m helpers.bench`).

On a CPU the compiled step also attends with explicit sums (`static_attention="sums"`,
model.attention_as_sums) instead of torch's scaled_dot_product_attention: inductor fuses scores, mask,
softmax and the weighted sum of V into one generated loop per layer, where the attention kernel is an
extern call with its own overhead; for the course model that made the whole step about 1.16x faster
(2.78 -> 2.39 ms/token, interleaved, same greedy tokens on five prompts). Eagerly (and on a GPU) the
static path keeps SDPA.

On a CPU, what is left between the kernels goes too. `cpp_wrapper` (on by default there) has inductor
drive its kernels and matmul calls from generated C++ instead of generated Python, and `freeze` (on by
default for float weights) compiles the weights in as constants, so a step passes 14 tensors (token,
position, the cache) instead of 55 through torch.compile's wrappers (gemv="library"). Together about
1.17x on the course model's step (2.14 -> 1.76 ms, interleaved, same logits, gemv="library"). Inductor's
weight prepacking (a freezing pass that swaps each matmul for a packed library call) is turned off: it
made the step 0.87x.
The weights are fixed when the step compiles: build a new generator after changing the model.
A quantized model is frozen by default when all its quantized layers use quantize/'s "fused_dequant"
kernel, with inductor's constant folding kept off their dtype conversions (compiling.conversions_kept):
folded ahead of time, they turned the int8 codes and 16-bit weights back into float32 weights. Other
quantized kernels (torch's int8pack and int4pack, fbgemm's dynamic) keep their weights as graph inputs.
Every CPU graph also pools its intermediate buffers (compile_options' `pooled`).
Frozen, pooled and with their input rows realized in the generated code (not copied by an extern call),
the course model's int8 and bf16 steps ran 1.16x and 1.19x faster (21 interleaved blocks, same tokens,
one thread, AMD Zen 5); pooling alone made the fp32 step 1.08x faster.

Opt-in on a CPU, `gemm_autotune=True` (frozen weights, torch's kernels: gemv="library"): inductor prepacks
the weights and times, for every product, its own generated C++ GEMM (its CPU GEMM template) against the
library's packed call, keeping the faster. Against torch's kernel it is often much faster (course model,
one thread, AMD Zen 5 VM: 1.67-1.96x quiet), and it was 1.06-1.26x faster than the generated row sums
(above), but it is not the default, for its compile cost, which is not cached: the packed weights
could not be pickled, so inductor's graph cache was bypassed and a new process lowers the step again
(course model: 15-43 s, 68 s loaded; 119-326 s cold; the row-sum step: 35 s cold, 5-11 s cached): too
slow for every chapter and test that builds a generator. Without prepacking the template is cacheable but
was slower than torch's kernel (25.5 against 16.3 ms, loaded); on an Intel Xeon VM it bought nothing
(1.01x). Fused speculative rounds on two such generators are frozen and autotuned too (FusedRounds).

`forward(tokens, input_pos)` runs T > 1 tokens through the same static path (speculative decoding's
verify pass and its draft's catch-up step, speculative/): compiled for each T named in
`warmup(token_counts=...)`, one graph per T; any other T runs the static path eagerly, so a call never
compiles in the middle of a generation.

Out of scope: batching requests of different lengths; the speculative loop (speculative/); the compile
plumbing (compiling.py: cache folder, options, warm-up, cold-compile record, guard skipping).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import warnings

import torch

from .compiling import (  # noqa: F401 (re-exported: chapters, tests and scripts import them from here)
    compile_options,
    guards_checked_once,
    inductor_cache_counts,
    inductor_cache_dir,
    read_cold_compiles,
    remember_cold_compile,
    use_course_compile_cache,
    warm_compiled,
)
from .decode_copy import GEMVS, InputMajorLinear, decode_copy, float_weights_only, input_major_copy, row_sums_copy  # noqa: F401 (re-exported)
from .generate import generate as generate_loop
from .generate import prefill, prefill_by_steps, prepare_generation
from .kv_cache import KVCache
from .options import keyword_options
from .quantize.linear import QuantizedLinear
from .sampling import check_logits
from .stopping import stop_checker

# the longest prompt a generator of a "fused_dequant" model prefills one token at a time (see _prefill)
PREFILL_BY_STEPS = 6


def compile_available() -> bool:
    """Whether torch.compile can generate code here (a C++ compiler on a CPU; Triton on a GPU)."""
    import shutil

    return shutil.which(os.environ.get("CXX", "g++")) is not None or shutil.which("c++") is not None


class FastGenerator:
    """A KV cache plus a decode step compiled for it. Reuse one instance for many generations."""

    def __init__(
        self,
        model,
        batch_size: int = 1,
        max_seq_len: int | None = None,
        compile: bool = True,
        mode: str | None = None,
        cpp_wrapper: bool | None = None,
        input_major: bool | None = None,
        static_attention: str | None = None,
        freeze: bool | None = None,
        gemm_autotune: bool = False,
        gemv: str | None = None,
    ):
        use_course_compile_cache()  # the on-disk cache folder, set when the first generator is built
        self.model = model.eval()
        # on a CPU, multiply 1 to 8 rows (compiled) by sums inductor generates, more as many_rows.linear (row_sums.py;
        # torch's kernel on request, over projections stored (in, out), several rows keeping nn.Linear's kernel
        # and layout), and let the compiled step attend with explicit sums inductor fuses: see the module docstring
        on_cpu = model.device.type == "cpu"
        if gemv is None:  # naming a layout or the autotuned GEMM asks for torch's kernel
            gemv = "sums" if on_cpu and input_major is None and not gemm_autotune else "library"
        if gemv == "sums" and gemm_autotune:
            raise ValueError("gemm_autotune times torch's and inductor's GEMMs: it needs gemv='library'")
        self.gemv = gemv
        self.input_major = (on_cpu and gemv == "library") if input_major is None else input_major
        self.static_attention = ("sums" if on_cpu else "sdpa") if static_attention is None else static_attention
        self.decode_model = decode_copy(
            self.model, input_major=self.input_major, static_attention=self.static_attention, gemv=self.gemv
        )
        self.cache = KVCache.for_model(model, batch_size=batch_size, max_seq_len=max_seq_len)
        self.compile_seconds = 0.0
        self.compiled = False
        self.compile_source = "not compiled (compile=False)"
        # on a CPU, the Python around the kernels goes too: C++ drives them, the weights are compiled in
        self.cpp_wrapper = on_cpu if cpp_wrapper is None else cpp_wrapper
        # quantize/'s "fused_dequant" layers are frozen too, their dtype conversions kept out of constant
        # folding (compiling.conversions_kept), and so are int4 "dynamic" and "cpu_rows" ones (the course's C++
        # operators reading their weights as constants: a graph without the weights among its inputs checks fewer
        # guards and passes fewer tensors, 1.12x the course model's int4 tokens/s); other quantized kernels keep
        # their weights as inputs
        quantized = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
        one_row = any(m.kernel == "fused_dequant" for m in quantized)
        float_only = float_weights_only(self.decode_model)
        frozen_kinds = [
            m.kernel in ("fused_dequant", "cpu_rows") or (m.kernel, m.method) == ("dynamic", "int4") for m in quantized
        ]
        freezable = float_only or (bool(quantized) and all(frozen_kinds))
        self.freeze = (on_cpu and freezable) if freeze is None else freeze
        self._keep_conversions = not float_only
        self.gemm_autotune = bool(gemm_autotune)
        if self.gemm_autotune and not on_cpu:
            raise ValueError("gemm_autotune is inductor's CPU GEMM template: it runs on a CPU only")
        if self.gemm_autotune and not self.freeze:
            raise ValueError("gemm_autotune needs freeze=True: inductor's GEMM template packs constant weights")
        step = self._eager_step
        if compile and not compile_available():
            self.compile_source = "not compiled: no C++ compiler found, the static step runs eagerly"
            warnings.warn(
                "torch.compile needs a C++ compiler on a CPU and none was found; decoding eagerly", stacklevel=2
            )
        if compile and compile_available():
            if mode is None and model.device.type == "cuda":
                mode = "reduce-overhead"  # CUDA graphs: replay the whole step with one launch
                # the cache is written in place every step; tell the graph machinery its address never changes
                torch._dynamo.mark_static_address(self.cache.k)
                torch._dynamo.mark_static_address(self.cache.v)
            self._compile_options = compile_options(
                mode, cpp_wrapper=self.cpp_wrapper, freeze=self.freeze, gemm_autotune=self.gemm_autotune, pooled=True
            )
            step = torch.compile(self._static_step, **self._compile_options)
        self.mode = mode
        self._step = step
        self._want_compile = compile and compile_available()  # (bound methods are new objects: never test `is`)
        self._forwards: dict[int, object] = {}  # T > 1 -> its compiled static forward (warmup(token_counts=...))
        self.compile_seconds_by_tokens: dict[int, float] = {}  # T -> seconds its warm-up took
        # "fused_dequant" layers multiply several rows by dequantizing the whole weight on every call: there
        # a short prompt costs fewer compiled steps than one eager prefill (_prefill)
        self.prefill_steps = PREFILL_BY_STEPS if one_row else 0  # prompts up to this long: one step a token

    def compile_key(self, tokens: int = 1) -> str:
        """What decides the generated code: model shapes, buffer size, batch, dtype, device, options, torch,
        and the number of tokens per call (T = 1, the step, keeps the key it always had)."""
        m = self.model
        what = (
            f"{m.cfg.to_dict()} B={self.cache.batch_size} S={self.cache.max_seq_len} {m.dtype} {m.device.type} "
            f"mode={self.mode} cpp_wrapper={self.cpp_wrapper} input_major={self.input_major} "
            f"{'gemv=sums ' if self.gemv == 'sums' else ''}"
            f"{'freeze ' if self.freeze else ''}{'gemm_autotune ' if self.gemm_autotune else ''}pooled "
            f"{'' if self.static_attention == 'sdpa' else 'attention=' + self.static_attention + ' '}"
            f"{'quantization=' + str(m.quantization) + ' ' if hasattr(m, 'quantization') else ''}"
            f"torch={torch.__version__}"
        )
        if tokens != 1:
            what += f" T={tokens}"
        return hashlib.sha256(what.encode()).hexdigest()[:16]

    @property
    def cold_compile_seconds(self) -> float | None:
        """Seconds the cold compile of this very step took (on this machine, whenever it filled the cache)."""
        return read_cold_compiles().get(self.compile_key())

    @property
    def compiled_token_counts(self) -> tuple[int, ...]:
        """The numbers of tokens per call that run compiled (1: the step); () when nothing is compiled."""
        return tuple(sorted({1, *self._forwards})) if self.compiled else ()

    def cold_compile_seconds_for(self, tokens: int) -> float | None:
        """The same for the static forward of `tokens` tokens per call (1: the step)."""
        return read_cold_compiles().get(self.compile_key(tokens))

    @torch.no_grad()
    def step(self, token: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """One decode step (compiled if it could be): token (B, 1) at position input_pos (1,) -> logits (B, V).
        Writes that position's K/V into this generator's cache; the caller tracks positions."""
        self.warmup()
        logits = self._step(token, input_pos)[0]
        if self.model.device.type == "cuda" and self._want_compile:
            logits = logits.clone()  # a CUDA-graph output is overwritten by the next replay
        return logits

    # What torch.compile wraps: undecorated, as a no_grad-decorated function compiles as torch's one shared
    # wrapper, whose code object holds every generator's graphs under one recompile limit; callers use no_grad.
    # the step also returns, fused into its graph, what greedy decoding needs: the argmax (the next token)
    # and whether every row's maximum is finite (helpers.sampling.check_logits's first test)
    def _static_step(self, token, input_pos):
        logits = self.decode_model(token, cache=self.cache, input_pos=input_pos, check=False)[:, -1, :]  # (B, V)
        finite = torch.isfinite(logits.amax(dim=-1)).all()  # () bool
        return logits, logits.argmax(dim=-1, keepdim=True), finite  # (B, V), (B, 1), ()

    def _static_forward(self, tokens, input_pos):
        return self.decode_model(tokens, cache=self.cache, input_pos=input_pos, check=False)  # (B, T, V)

    @torch.no_grad()
    def _eager_step(self, token, input_pos):
        return self._static_step(token, input_pos)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """The static path for several tokens: tokens (B, T) at positions input_pos (T,) -> logits (B, T, V).

        Compiled for T = 1 (the step) and for every T warmed up with `warmup(token_counts=...)`; any other
        T runs the same static path eagerly (compiling it here would stall the caller for seconds). Writes
        those positions' K/V into this generator's cache and leaves cache.length alone: the caller tracks
        positions, so rolling back is only the caller forgetting them (later writes overwrite the slots)."""
        self.warmup()
        T = tokens.shape[1]
        if self.compiled and tokens.stride() != (T, 1):
            # a view into a longer id buffer: the graphs are specialised to the strides they were
            # compiled for, so other strides would mean another compile (a plain clone keeps a (1, T)
            # view's strides, and contiguous() returns it as it is: both count it as contiguous)
            tokens = torch.empty(tokens.shape, dtype=tokens.dtype, device=tokens.device).copy_(tokens)
        if T == 1:
            return self.step(tokens, input_pos).unsqueeze(1)  # (B, 1, V)
        fn = self._forwards.get(T)
        if fn is None:
            return self._static_forward(tokens, input_pos)  # under this method's no_grad
        logits = fn(tokens, input_pos)
        if self.model.device.type == "cuda":
            logits = logits.clone()  # a CUDA-graph output is overwritten by the next replay
        return logits

    def _warm(self, fn, tokens: int) -> Exception | None:
        """Run fn twice on `tokens` zeros at positions 0..tokens-1, leaving the cache as it was.
        Returns the error if it failed, else None."""
        token = torch.zeros(self.cache.batch_size, tokens, dtype=torch.long, device=self.model.device)
        pos = torch.arange(tokens, device=self.model.device)
        args = (token, pos), [self.cache], tokens, self.freeze, self._keep_conversions
        error, seconds, cold = warm_compiled(fn, *args)
        self.compile_seconds += seconds
        self.compile_seconds_by_tokens[tokens] = seconds
        if error is None and cold:  # a cold compile: remember how long it took
            remember_cold_compile(self.compile_key(tokens), seconds)
        return error

    @torch.no_grad()  # the same grad mode as the decode loop, or its first call would compile a second graph
    def warmup(self, token_counts=()) -> float:
        """Compile now (if not yet), timing it; falls back to eager if compilation fails.

        token_counts: also compile `forward` for these numbers of tokens per call (one graph each; 1 is
        the step). Returns the seconds all warm-ups of this generator took so far."""
        if self._want_compile and not self.compiled:
            _, misses = inductor_cache_counts()
            error = self._warm(self._step, 1)
            if error is None:
                self.compiled = True
                cold = inductor_cache_counts()[1] > misses
                self.compile_source = "compiled cold" if cold else "compiled from the on-disk cache"
            else:
                warnings.warn(
                    f"torch.compile failed ({type(error).__name__}: {str(error)[:200]}); decoding eagerly", stacklevel=2
                )
                self._step = self._eager_step
                self._want_compile = False
                self.compile_source = f"not compiled: torch.compile failed ({type(error).__name__}), running eagerly"
        for T in token_counts:
            if not isinstance(T, int) or isinstance(T, bool) or not 1 <= T <= self.cache.max_seq_len:
                raise ValueError(f"token_counts must hold ints in [1, {self.cache.max_seq_len}]; got {T!r}")
            if T == 1 or T in self._forwards or not self.compiled:
                continue
            fn = torch.compile(self._static_forward, **self._compile_options)
            error = self._warm(fn, T)
            if error is None:
                self._forwards[T] = fn
            else:
                warnings.warn(
                    f"torch.compile failed for {T} tokens per call ({type(error).__name__}: "
                    f"{str(error)[:200]}); that forward runs eagerly",
                    stacklevel=2,
                )
        return self.compile_seconds

    @torch.no_grad()
    def generate(self, prompt, max_new_tokens: int, **options) -> torch.Tensor:
        """helpers.generate's loop (its stop conditions, logits processors and sampling; penalties excepted)
        on this generator's cache, with the compiled step as its step: (B, T + n_new) token ids. The
        prompt's prefill runs eagerly (its shape depends on the prompt), or through the step (_prefill).

        options: helpers.generate's keywords (temperature, sampling, generator, eos_id, stop_sequences,
        stop_criteria, logits_processors, progress), with its defaults; not cache, step or prefill (this
        generator's)."""
        o = keyword_options(generate_loop, options, leave_out=("cache", "step", "prefill"))
        prompt, sampling = prepare_generation(
            self.model, prompt, max_new_tokens, o.sampling, o.temperature, o.generator
        )
        if sampling.repetition_penalty != 1.0 or sampling.presence_penalty or sampling.frequency_penalty:
            raise ValueError("FastGenerator does not apply penalties; use helpers.generate for those")
        B, T = prompt.shape
        if B != self.cache.batch_size:
            raise ValueError(f"prompt batch size {B} != this generator's batch_size {self.cache.batch_size}")
        if T + max_new_tokens > self.cache.max_seq_len:
            raise ValueError(
                f"prompt ({T}) + max_new_tokens ({max_new_tokens}) exceeds this generator's "
                f"max_seq_len={self.cache.max_seq_len}"
            )
        stop = stop_checker(B, o.eos_id, o.stop_sequences, o.stop_criteria)  # bad settings fail before the compile
        self.warmup()  # only now: compiling is the slowest part, and bad input should not wait for it
        if sampling.greedy and stop is None and not o.logits_processors and not o.progress and max_new_tokens:
            return self._generate_greedy(prompt, max_new_tokens)
        with contextlib.ExitStack() as later_steps:
            hooks = {"cache": self.cache, "step": self._loop_step(later_steps), "prefill": self._prefill}
            loop_options = {**vars(o), "sampling": sampling, **hooks}
            return generate_loop(self.decode_model, prompt, max_new_tokens, **loop_options)

    def _prefill(self, model, prompt: torch.Tensor, cache) -> torch.Tensor:
        """generate's prefill here: one eager forward over the prompt, or, for a prompt of at most
        `prefill_steps` tokens once the step is compiled, that many compiled steps (generate.prefill_by_steps).
        With "fused_dequant" layers an eager forward over several rows dequantizes every weight (their
        "reference" path): six prompt tokens cost 6 to 21 compiled steps so, course model and 149M config in
        every such format (one thread, AMD Zen 5). PREFILL_BY_STEPS is the smallest of those."""
        if not self.compiled or prompt.shape[1] > self.prefill_steps:
            return prefill(model, prompt, cache)  # (B, V)
        with contextlib.ExitStack() as later_steps:
            return prefill_by_steps(model, prompt, cache, self._loop_step(later_steps))  # (B, V)

    def _generate_greedy(self, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """generate's loop for plain greedy decoding (no stop condition, processor or progress bar): each
        step's in-graph argmax is the next step's token, gathered once at the end; one host read a step
        (the finite-logits flag: bad logits raise as in generate's loop). The same tokens."""
        T = prompt.shape[1]
        logits = self._prefill(self.decode_model, prompt, self.cache)  # (B, V), as in generate's loop
        check_logits(logits)
        tokens = [prompt, logits.argmax(dim=-1, keepdim=True)]  # (B, T), then (B, 1) per new token
        pos = torch.zeros(1, dtype=torch.long, device=self.model.device)  # (1,)
        copy_out = self.model.device.type == "cuda" and self._want_compile  # CUDA graphs reuse their outputs
        with contextlib.ExitStack() as later_steps:
            for n in range(1, max_new_tokens):
                pos.fill_(T + n - 1)
                logits, token, finite = self._step(tokens[-1], pos)  # (B, V), (B, 1), ()
                if not finite:
                    check_logits(logits)  # raises, naming what is wrong
                tokens.append(token.clone() if copy_out else token)
                if n == 1 and self._want_compile:
                    later_steps.enter_context(guards_checked_once())  # see _loop_step
        self.cache.commit(T + max_new_tokens - 1)  # as generate's loop leaves it: the last token is not fed back
        return torch.cat(tokens, dim=1)  # (B, T + max_new_tokens)

    def _loop_step(self, later_steps: contextlib.ExitStack):
        """helpers.generate's step(model, token, cache) -> logits, over this generator's static step: the
        position goes in as a tensor, and cache.length (which the static path leaves alone) is kept here."""
        pos = torch.zeros(1, dtype=torch.long, device=self.model.device)  # (1,)
        copy_out = self.model.device.type == "cuda" and self._want_compile
        first = True

        def step(model, token, cache):
            nonlocal first
            pos.fill_(cache.length)
            logits = self._step(token, pos)[0]  # (B, V)
            if copy_out:
                logits = logits.clone()  # a CUDA-graph output is overwritten by the next replay
            cache.commit(cache.length + 1)  # the step wrote one more position
            if first and self._want_compile:
                # the first step had dynamo's guards checked (shapes, dtypes, grad mode, the weights);
                # nothing in this loop changes any of them, so checking them again on every later step
                # only costs time (0.38 ms of a 5.0 ms step, measured interleaved on a busy 2-core CPU)
                later_steps.enter_context(guards_checked_once())
            first = False
            return logits

        return step
