"""The engine's step compiled: one graph from token ids to logits, attention and cache writes inside.

A serving step lays every request's new tokens end to end (model_runner.py): most requests decode one
token, a few bring a chunk of their prompt. Run eagerly (model_runner.forward_step) such a step is about
380 torch calls (norms, rotations, residual adds, the cache writes, 25 matmuls, the views between them)
plus one gather and one SDPA per prefill chunk and layer, each paying its dispatch. Here the step is
traced once by torch.compile into one graph. What is traced is the model's own forward (model.py,
`Transformer.hidden`) with a cache view, `OpStepView`, whose layers attend through the custom op below:
the same layer loop as every other path, only the attention and the cache writes are the view's.

    step = compiled_step_for(model, "autotune")  # one per model, mode and process
    step.warmup(block_size=16)                   # compile now, on a scratch pool
    if step.applies(chunks, "in_place", None):
        logits = step(cache, chunks)             # (n_sampled, V); the pool written, each sequence committed
    step.calls                                   # steps it ran (tests check that it is used)

- every new token is a row that attends on its own: a decoding request's one row, and each row of a
  prompt chunk, which reads its request's blocks up to its own position (length = position + 1). Causal
  attention needs no mask then, and a prompt chunk reads its blocks in place like a decoding request. The
  op writes the step's new keys and values first (every row of a chunk sees the keys before it);
- the C paged-decode kernel (paged_attention.py) is a torch custom op, `llm_course::paged_decode`, with a
  fake implementation that only gives the output's shape, so it sits in the graph as one opaque call. The
  op first writes the step's new keys and values into the pool (index_copy_; the schema declares the pool
  mutated, and inductor then runs the op on the pool in place, no copy of it);
- the step's inputs are the tokens, their positions, each row's chunk, the chunks' block tables and the
  rows sampled from; each row's table and slot are looked up in the graph. The final norm and the head run
  on the sampled rows only;
- the weights are frozen into the graph and inductor drives its kernels from generated C++ (cpp_wrapper,
  its intermediate buffers pooled: compile_options(pooled=True)),
  as FastGenerator does; the matmuls are the library's (mode "library") or, in mode "autotune", whichever
  of inductor's generated C++ GEMM and the library's packed call its autotuner timed faster for each
  product (compiling.compile_options);
- the numbers of rows, chunks and sampled rows are dynamic (torch._dynamo.mark_dynamic): one graph serves
  every step of 2 or more rows. A step of one row runs eagerly (torch would specialise a size of 1 into a
  second graph, a second compile for the rarest step of a batching workload); the chunks' tables and the
  sampled rows are padded to at least 2 for the same reason (a padded table is never read, a padded
  row's logits are dropped). No token is padded, so no slot of the pool is written that belongs to nobody.
  Block tables are padded to a fixed width (max_seq_len / block_size) and the pool's number of slots is
  dynamic too, so engines with other pool sizes reuse the graph;
- after a block size's first call, later calls skip dynamo's guard checks (compiling.guards_checked_once):
  every input is built here, always with the same dtypes, ranks and grad mode.

Where it pays: the eager step spends a roughly fixed time outside its matmuls and attention whatever the
batch, so compiling helps most at small batches and on prompt chunks (their eager attention is a gather
and an SDPA per chunk and layer); at 32 decoding rows the step is mostly matmuls, which compiling does
not make faster (bench.py and chapter 13 measure both on the machine at hand). A prompt's rows read its
keys once per row instead of once per chunk; the keys are few and hot in the cache, and attention is a
small part of a prompt's work next to the matmuls of a 256-wide model.

Compile cost: mode "library" goes through inductor's on-disk graph cache (a new process loads it in a few
seconds); mode "autotune" cannot (its packed weights do not pickle, compiling.py), so every new process
compiles it again (tens of seconds on a small CPU). Within a process every engine on the model reuses
the graph. Hence `Engine(compile_step=...)` is off by default (tests and notebooks), "autotune" in the
serving bench and the server CLI. The weights are fixed when the step compiles: after changing a model's
weights, call forget(model).

`applies` says when the compiled step runs: two or more rows, the in-place attention (a float32 model on
the CPU, the kernel built), outside the batch-invariant mode. Every other step (one row, the gather path,
other dtypes or devices, the invariant mode's row tiles) runs model_runner.forward_step, and so does
every step where compiling failed (`error` keeps why).

Left out: CUDA graphs and GPU kernels, and the batch-invariant mode (its row tiles are the point of that
mode).
"""

from __future__ import annotations

import contextlib
import time
import types
import weakref

import numpy as np
import torch

from ..compiling import compile_options, guards_checked_once, use_course_compile_cache
from .paged_attention import paged_decode_layer
from .paged_cache import PagedKVCache

# Registered with torch.library's low-level API rather than the custom_op decorator, whose wrapper cost
# more per call (six calls a step). The schema's (a!) and (b!) declare the pools as mutated.
_library = torch.library.Library("llm_course", "FRAGMENT")
_library.define(
    "paged_decode(Tensor q, Tensor k_new, Tensor v_new, Tensor(a!) k_pool, Tensor(b!) v_pool, Tensor slots, "
    "Tensor tables, Tensor lengths, int layer, int block_size) -> Tensor"
)


def paged_decode_impl(q, k_new, v_new, k_pool, v_pool, slots, tables, lengths, layer: int, block_size: int):
    """Write k_new, v_new (N, Hkv, D) at `slots` (N,) of layer `layer`'s pool, then attend each row of q
    (N, H, D) over the first lengths[i] keys its table names, in place (the C kernel). k_pool, v_pool (L,
    slots, Hkv, D); tables (N, W) and lengths (N,) int64, built in CompiledStep's graph. Returns (N, H, D)."""
    k_pool[layer].index_copy_(0, slots, k_new)
    v_pool[layer].index_copy_(0, slots, v_new)
    return paged_decode_layer(q.contiguous(), k_pool, v_pool, tables, lengths, layer, block_size)


_library.impl("paged_decode", paged_decode_impl, "CompositeExplicitAutograd")


@torch.library.register_fake("llm_course::paged_decode")
def _(q, k_new, v_new, k_pool, v_pool, slots, tables, lengths, layer, block_size):
    return torch.empty_like(q, memory_format=torch.contiguous_format)  # (N, H, D)


paged_decode_op = torch.ops.llm_course.paged_decode


class LayerOpView:
    """Layer `index` of the compiled step's cache view: its attend is the custom op (the model's Attention calls it)."""

    rowwise = None  # the model's default: each row-wise module on all the step's rows at once

    def __init__(self, view: "OpStepView", index: int):
        self.view, self.index = view, index

    def attend(self, q, k, v):
        """q (1, H, N, D), k, v (1, Hkv, N, D) -> (1, H, N, D): written into the pool, attended in place."""
        w = self.view
        k_new, v_new = k[0].transpose(0, 1), v[0].transpose(0, 1)  # (N, Hkv, D)
        y = paged_decode_op(
            q[0].transpose(0, 1),
            k_new,
            v_new,
            w.k_pool,
            w.v_pool,
            w.slots,
            w.tables,
            w.lengths,
            self.index,
            w.block_size,
        )  # (N, H, D)
        return y.transpose(0, 1).unsqueeze(0)  # (1, H, N, D)


class OpStepView:
    """A step as a cache view for the model's forward (model.py): row i is a token at positions[i], in the
    request whose blocks tables[i] names; it attends to positions 0 .. positions[i]."""

    def __init__(self, pos, row_chunk, chunk_tables, k_pool, v_pool, block_size: int):
        self.positions = pos  # (N,)
        self.tables = chunk_tables[row_chunk]  # (N, W): each row's request's blocks
        block = self.tables.gather(1, (pos // block_size).unsqueeze(1))[:, 0]  # (N,) the block holding each row
        self.slots = block * block_size + pos % block_size  # (N,) where each row's key and value go
        self.lengths = pos + 1  # (N,) keys each row reads, its own included
        self.k_pool, self.v_pool, self.block_size = k_pool, v_pool, block_size

    def layer(self, i: int) -> LayerOpView:
        return LayerOpView(self, i)


def step_logits(model, tokens, pos, row_chunk, chunk_tables, sampled, k_pool, v_pool, block_size: int):
    """The step as traced: tokens, pos, row_chunk (N,), chunk_tables (C, W), sampled (S,) rows to sample
    from -> logits (S, V), and what greedy sampling needs, fused into the graph: each row's argmax (S,) and
    whether its maximum is finite (S,). The model's own forward (Transformer.hidden) over a view whose
    attention is the custom op (tests compare it with forward_step)."""
    view = OpStepView(pos, row_chunk, chunk_tables, k_pool, v_pool, block_size)
    x = model.hidden(tokens.unsqueeze(0), view, check=False)[0]  # (N, C)
    logits = model.head(model.norm(x[sampled]))  # (S, V)
    return logits, logits.argmax(dim=-1), torch.isfinite(logits.amax(dim=-1))  # (S, V), (S,), (S,)


MODES = ("library", "autotune")  # the matmuls: the library's (graph cached on disk), or autotuned (not cached)


class CompiledStep:
    """The engine's step through torch.compile for one model (see the module docstring)."""

    def __init__(self, model, mode: str = "library"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
        use_course_compile_cache()
        self.model, self.mode = model, mode
        # a copy of step_logits with its own code object: dynamo keeps graphs per code object, so this
        # instance's graphs (with this model's weights frozen in) are its own, and forget() really forgets them
        own = types.FunctionType(step_logits.__code__.replace(), step_logits.__globals__, "step_logits")
        self.fn = torch.compile(
            own,
            **{
                **compile_options(None, cpp_wrapper=True, freeze=True, gemm_autotune=mode == "autotune", pooled=True),
                "dynamic": None,
            },
        )
        self.calls = 0  # steps run through the graph
        self.block_sizes: set[int] = set()  # block sizes whose graph has run once with its guards checked
        self.error: Exception | None = None  # why compiling failed, if it did: every step then runs eagerly
        self.compile_seconds: float | None = None  # the warm-up's compile, if warmup() ran
        self.float32_cpu = model.device.type == "cpu" and all(p.dtype == torch.float32 for p in model.parameters())

    def applies(self, chunks, decode_attention: str, row_widths) -> bool:
        """Whether this step runs compiled (see the module docstring)."""
        return (
            self.error is None
            and decode_attention == "in_place"
            and row_widths is None
            and self.float32_cpu
            and sum(len(c.token_ids) for c in chunks) >= 2
        )

    def warmup(self, block_size: int = 16, rows: int = 128) -> float:
        """Compile now on a scratch pool (`rows` requests of one block each); returns the seconds it took.
        The graph's number of rows is symbolic, but inductor chooses its kernels for the size it first
        sees. Measured on a 2-core x86 CPU, autotuned, one process, interleaved: warmed at 128 rows rather
        than 8, a step of 31 decodes and a 100-token prompt ran 1.22x faster, 32 decodes 1.05-1.11x, 8 the
        same, 2 0.91x; the bench's workload 1.10-1.17x (warmed at 256: slower than at 128). A workload's
        steps are mostly 8 to 32 decodes and a prompt beside them."""
        from .model_runner import SequenceChunk

        cache = PagedKVCache.for_model(self.model, rows, block_size)
        chunks = [SequenceChunk([1 + i], 0, [i], True) for i in range(rows)]
        calls, t0 = self.calls, time.perf_counter()
        try:
            self(cache, chunks)
        except Exception as e:  # noqa: BLE001 - any compiler failure means: run eagerly
            self.error = e
        self.calls = calls  # the warm-up is not a step
        self.compile_seconds = time.perf_counter() - t0
        return self.compile_seconds

    def __call__(self, cache: PagedKVCache, chunks, greedy: bool = False):
        """Logits (n_sampled, V) for chunks of two or more new tokens in all, one row per chunk that wants
        logits, in order; writes the pool and commits each sequence's new length, as forward_step does.
        greedy: return (logits, argmax, finite) instead, the last two lists of n_sampled ints and bools
        computed in the graph (the engine's greedy rows: one fused pass instead of two reductions after)."""
        bs = cache.block_size
        width = -(-self.model.cfg.max_seq_len // bs)  # every table padded to this many blocks: a fixed shape
        tables = np.zeros((max(len(chunks), 2), width), dtype=np.int64)  # at least 2 rows: see below
        ids, positions, row_chunk, sampled = [], [], [], []
        for i, c in enumerate(chunks):  # plain ints, one tensor each below
            T = len(c.token_ids)
            ids.extend(c.token_ids)
            positions.extend(range(c.start_pos, c.start_pos + T))
            row_chunk.extend([i] * T)
            tables[i, : len(c.block_table)] = c.block_table  # entries past a length: unread
            if c.want_logits:
                sampled.append(len(ids) - 1)
        n_sampled = len(sampled)
        sampled += [0] * (2 - n_sampled)  # at least 2 tables and 2 sampled rows (a size of 1 would be specialised)
        device = self.model.device
        inputs = [torch.tensor(x, dtype=torch.long, device=device) for x in (ids, positions, row_chunk)]
        inputs += [torch.from_numpy(tables).to(device), torch.tensor(sampled, dtype=torch.long, device=device)]
        for t in inputs:
            torch._dynamo.mark_dynamic(t, 0)
        for t in (cache.k, cache.v):
            torch._dynamo.mark_dynamic(t, 1)
        # dynamo reads inductor's freezing flag while tracing: set around the call, as compiling.warm_compiled does.
        # Once a block size has run with its guards checked, later calls skip them (compiling.guards_checked_once):
        # every input is built here, always of the same dtypes, ranks and grad mode.
        skip = guards_checked_once() if bs in self.block_sizes else contextlib.nullcontext()
        with torch.no_grad(), torch._inductor.config.patch(freezing=True), skip:
            logits, argmax, finite = self.fn(self.model, *inputs, cache.k, cache.v, bs)  # (max(n_sampled, 2), V)
        self.block_sizes.add(bs)
        for c in chunks:
            if c.seq_id is not None:
                cache.commit(c.seq_id, c.start_pos + len(c.token_ids))
        self.calls += 1
        if greedy:
            return logits[:n_sampled], argmax[:n_sampled].tolist(), finite[:n_sampled].tolist()
        return logits[:n_sampled]  # (n_sampled, V)


_steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {mode: CompiledStep}


def compiled_step_for(model, mode: str = "library") -> CompiledStep:
    """The model's CompiledStep in this mode, made on first request: every engine on the model shares it."""
    steps = _steps.setdefault(model, {})
    if mode not in steps:
        steps[mode] = CompiledStep(model, mode)
    return steps[mode]


def forget(model) -> None:
    """Drop the model's compiled steps (after changing its weights: the graphs hold the old ones)."""
    _steps.pop(model, None)
