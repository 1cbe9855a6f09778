"""Tensor parallelism of the course Transformer, Megatron-style, over torch.distributed.

Each of `tp_size` ranks holds a slice of every layer and the same full residual stream (B, T, C):

- attention: rank r owns a contiguous block of query heads and the key/value heads they read
  (its rows of W_qkv, its columns of W_o). Its output is a partial sum of the layer's output;
- MLP: rank r owns a block of the SwiGLU hidden units (its rows of gate and up, its columns of down),
  again a partial sum;
- one all-reduce (sum over ranks) after attention and one after the MLP, per layer; everything else
  (embedding, norms, output head) is replicated and computed identically on every rank.

So per token and layer, each rank all-reduces 2 * d_model elements, and its KV cache holds only its
own key/value heads: 1/tp_size of the cache when n_kv_heads divides by tp_size. When tp_size is a
multiple of n_kv_heads, each key/value head is replicated on tp_size / n_kv_heads ranks (vLLM does the
same), so the cache per rank stops shrinking.

    tp_model = TensorParallelTransformer(model, rank, tp_size)   # inside a worker, after init_process_group
    logits = tp_model(idx, cache=tp_model.new_cache(max_seq_len=64))
    ids = generate(tp_model, prompt, 16, cache=tp_model.new_cache(max_seq_len=64))   # the one decode loop

`shard_state_dict` is plain slicing and runs anywhere; the forward pass needs an initialised process
group (workers.py starts one) unless you pass your own `all_reduce`.

The sharded model takes the same forward arguments the decode loop passes (`cache`, `start_pos`,
`last_only`, `check`) and says how many KV heads its cache holds (`cache_kv_heads`, which the cache
contract, model.check_cache, reads), so `helpers.generate.generate` decodes with it unchanged.

Left out: a vocabulary-parallel embedding and head (Megatron and vLLM split those too), sequence parallelism,
overlap of communication with compute, quantized collectives, fused kernels, the static-shape path
of fast_decode.py.
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..generate import decode_one_token, generate
from ..kv_cache import KVCache
from ..model import EmbeddedModel, ModelConfig, RMSNorm, apply_rope, causal_mask, check_token_ids
from .workers import worker_model

# ----------------------------------------------------------------------------------------------
# who owns what: arithmetic on the config


def check_tp_size(cfg: ModelConfig, tp_size) -> None:
    """Raise a ValueError naming tp_size unless heads, key/value heads and MLP width split evenly."""
    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        raise ValueError(f"tp_size must be an int >= 1; got {tp_size!r}")
    if cfg.n_heads % tp_size:
        raise ValueError(f"tp_size={tp_size} must divide n_heads={cfg.n_heads} (each rank owns whole heads)")
    if cfg.d_ff % tp_size:
        raise ValueError(f"tp_size={tp_size} must divide d_ff={cfg.d_ff} (each rank owns whole MLP units)")
    if cfg.n_kv_heads % tp_size and tp_size % cfg.n_kv_heads:
        raise ValueError(
            f"tp_size={tp_size} must divide n_kv_heads={cfg.n_kv_heads} or be a multiple of it "
            f"(key/value heads are split, or replicated when there are fewer than ranks)"
        )


def _check_rank(rank, tp_size: int) -> None:
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < tp_size:
        raise ValueError(f"rank must be an int in [0, {tp_size - 1}]; got {rank!r}")


def kv_heads_per_rank(cfg: ModelConfig, tp_size: int) -> int:
    """Key/value heads each rank stores: n_kv_heads / tp_size, or 1 (replicated) once tp_size >= n_kv_heads."""
    check_tp_size(cfg, tp_size)
    return max(cfg.n_kv_heads // tp_size, 1)


def head_ranges(cfg: ModelConfig, tp_size: int, rank: int) -> tuple[range, range]:
    """(query heads, key/value heads) owned by `rank`. Query head h reads key/value head h // group."""
    check_tp_size(cfg, tp_size)
    _check_rank(rank, tp_size)
    q_per_rank = cfg.n_heads // tp_size
    group = cfg.n_heads // cfg.n_kv_heads  # query heads per key/value head
    q = range(rank * q_per_rank, (rank + 1) * q_per_rank)
    kv_first = q.start // group
    return q, range(kv_first, kv_first + kv_heads_per_rank(cfg, tp_size))


def tp_kv_cache_bytes(cfg: ModelConfig, seq_len: int, tp_size: int, batch_size: int = 1, dtype=torch.float16) -> int:
    """KV cache bytes one rank holds: 2 (K and V) * layers * batch * kv heads per rank * head_dim * seq_len."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.n_layers * batch_size * kv_heads_per_rank(cfg, tp_size) * cfg.head_dim * seq_len * elem


def allreduce_bytes_per_token_per_layer(cfg: ModelConfig, dtype=torch.float16) -> int:
    """Bytes each rank hands to all-reduce per token per layer: the attention output and the MLP
    output, d_model elements each. Independent of tp_size: every rank holds the whole residual stream."""
    return 2 * cfg.d_model * torch.empty((), dtype=dtype).element_size()


def ring_allreduce_bytes_sent(payload_bytes: float, tp_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce of `payload_bytes`: a reduce-scatter and an all-gather,
    each tp_size - 1 steps of payload / tp_size."""
    return 2 * (tp_size - 1) / tp_size * payload_bytes


# ----------------------------------------------------------------------------------------------
# slicing the weights


def shard_state_dict(model, tp_size: int, rank: int) -> dict[str, torch.Tensor]:
    """The weights `rank` needs, sliced from a full course Transformer (copies, not views).

    Per layer: wqkv keeps the rows of its query heads and of their key/value heads; wo the matching
    columns; w_gate_up the rows of its hidden units (gate and up each); w_down those columns. The
    embedding (tied to the head) and the norms are replicated."""
    cfg = model.cfg
    q_heads, kv_heads = head_ranges(cfg, tp_size, rank)
    D, Hq, Hkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    f_per_rank = cfg.d_ff // tp_size
    f = slice(rank * f_per_rank, (rank + 1) * f_per_rank)
    q_rows = slice(q_heads.start * D, q_heads.stop * D)
    k_rows = slice(Hq * D + kv_heads.start * D, Hq * D + kv_heads.stop * D)
    v_rows = slice((Hq + Hkv) * D + kv_heads.start * D, (Hq + Hkv) * D + kv_heads.stop * D)
    out = {}
    for name, w in model.state_dict().items():
        w = w.detach()
        if name.endswith("attn.wqkv.weight"):  # (Hq*D + 2*Hkv*D, C): rows are output features
            w = torch.cat([w[q_rows], w[k_rows], w[v_rows]])
        elif name.endswith("attn.wo.weight"):  # (C, Hq*D): columns are input features
            w = w[:, q_rows]
        elif name.endswith("mlp.w_gate_up.weight"):  # (2*F, C): gate rows, then up rows
            gate, up = w.split(cfg.d_ff)
            w = torch.cat([gate[f], up[f]])
        elif name.endswith("mlp.w_down.weight"):  # (C, F)
            w = w[:, f]
        out[name] = w.clone()
    return out


# ----------------------------------------------------------------------------------------------
# the sharded model


class Communicator:
    """all_reduce (sum, in place) with a log of what was sent: bytes per call and seconds spent inside."""

    def __init__(self, all_reduce=None):
        if all_reduce is None:
            import torch.distributed as dist

            def all_reduce(t):
                dist.all_reduce(t)  # default op: SUM

        self._all_reduce = all_reduce
        self.bytes_log: list[int] = []
        self.seconds_log: list[float] = []

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        t0 = time.perf_counter()
        self._all_reduce(t)
        self.seconds_log.append(time.perf_counter() - t0)
        self.bytes_log.append(t.numel() * t.element_size())
        return t

    def reset(self) -> None:
        self.bytes_log.clear()
        self.seconds_log.clear()


class ShardedAttention(nn.Module):
    """The rank's query heads and their key/value heads. Returns a partial sum of the layer output."""

    def __init__(self, cfg: ModelConfig, tp_size: int):
        super().__init__()
        self.n_heads = cfg.n_heads // tp_size
        self.n_kv_heads = kv_heads_per_rank(cfg, tp_size)
        self.head_dim = D = cfg.head_dim
        q_dim, kv_dim = self.n_heads * D, self.n_kv_heads * D
        self.wqkv = nn.Linear(cfg.d_model, q_dim + 2 * kv_dim, bias=False)
        self.wo = nn.Linear(q_dim, cfg.d_model, bias=False)
        self.split_sizes = (q_dim, kv_dim, kv_dim)

    def forward(self, x, cos, sin, layer_cache=None, start_pos: int = 0):
        B, T, C = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.wqkv(x).split(self.split_sizes, dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H/tp, T, D)
        k = k.view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv/tp, T, D)
        v = v.view(B, T, Hkv, D).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if layer_cache is not None:
            k, v = layer_cache.update(start_pos, k, v)  # (B, Hkv/tp, start_pos + T, D)
        S = k.shape[2]
        if T == 1:
            mask, is_causal = None, False  # one new query: everything cached is in its past
        elif S == T:
            mask, is_causal = None, True
        else:
            mask, is_causal = causal_mask(T, S, device=x.device), False
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=Hkv != H
        )  # (B, H/tp, T, D)
        return self.wo(y.transpose(1, 2).reshape(B, T, H * D))  # (B, T, C): this rank's share of the sum


class ShardedMLP(nn.Module):
    """The rank's d_ff / tp_size SwiGLU units. Returns a partial sum of the layer output."""

    def __init__(self, cfg: ModelConfig, tp_size: int):
        super().__init__()
        self.d_ff = cfg.d_ff // tp_size
        self.w_gate_up = nn.Linear(cfg.d_model, 2 * self.d_ff, bias=False)
        self.w_down = nn.Linear(self.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        gate, up = self.w_gate_up(x).split(self.d_ff, dim=-1)  # (B, T, F/tp) each
        return self.w_down(F.silu(gate) * up)  # (B, T, C)


class ShardedBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, tp_size: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = ShardedAttention(cfg, tp_size)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = ShardedMLP(cfg, tp_size)

    def forward(self, x, cos, sin, comm: Communicator, layer_cache=None, start_pos: int = 0):
        x = x + comm.all_reduce(self.attn(self.attn_norm(x), cos, sin, layer_cache, start_pos))  # all-reduce 1
        return x + comm.all_reduce(self.mlp(self.mlp_norm(x)))  # all-reduce 2


class TensorParallelTransformer(EmbeddedModel):
    """One rank's share of a course Transformer. Every rank runs the same forward on the same tokens
    and ends with the same logits (B, T, V).

    all_reduce: a function summing a tensor in place across ranks; default torch.distributed.all_reduce
    (needs an initialised process group). `comm` logs the bytes and seconds of every call."""

    def __init__(self, model, rank: int, tp_size: int, all_reduce=None):
        super().__init__()
        cfg = model.cfg
        check_tp_size(cfg, tp_size)
        _check_rank(rank, tp_size)
        self.cfg, self.rank, self.tp_size = cfg, rank, tp_size
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(ShardedBlock(cfg, tp_size) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied, as in the full model
        self.register_buffer("rope_cos", model.rope_cos.clone(), persistent=False)
        self.register_buffer("rope_sin", model.rope_sin.clone(), persistent=False)
        self.load_state_dict(shard_state_dict(model, tp_size, rank))
        self.to(device=model.device, dtype=model.dtype).eval()
        self.comm = Communicator(all_reduce)

    @property
    def cache_kv_heads(self) -> int:
        """KV heads a cache for this rank holds (its own), for the cache contract (model.check_cache)."""
        return kv_heads_per_rank(self.cfg, self.tp_size)

    def new_cache(self, batch_size: int = 1, max_seq_len: int | None = None) -> KVCache:
        """A KV cache for this rank's key/value heads only."""
        S = self.cfg.max_seq_len if max_seq_len is None else max_seq_len
        if not isinstance(S, int) or not 1 <= S <= self.cfg.max_seq_len:
            raise ValueError(f"max_seq_len must be in [1, {self.cfg.max_seq_len}]; got {max_seq_len!r}")
        return KVCache(
            self.cfg.n_layers,
            batch_size,
            kv_heads_per_rank(self.cfg, self.tp_size),
            S,
            self.cfg.head_dim,
            dtype=self.dtype,
            device=self.device,
        )

    @torch.no_grad()
    def forward(
        self,
        idx,
        cache: KVCache | None = None,
        start_pos: int | None = None,
        last_only: bool = False,
        check: bool = True,
    ):
        """Logits (B, T, V) for tokens idx (B, T), placed at start_pos (default: after what `cache` holds;
        position 0 without one). check=False skips the token-id range check, as Transformer.forward does for
        tokens the model produced itself."""
        if check:
            check_token_ids(idx, self.cfg.vocab_size)
        B, T = idx.shape
        start = start_pos if start_pos is not None else cache.length if cache is not None else 0
        if start + T > (cache.max_seq_len if cache is not None else self.cfg.max_seq_len):
            raise ValueError(f"positions {start}..{start + T - 1} do not fit (cache or context window)")
        cos, sin = self.rope_cos[start : start + T], self.rope_sin[start : start + T]  # (T, D)
        x = self.embed(idx)  # (B, T, C), the same on every rank
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, self.comm, cache.layer(i) if cache is not None else None, start)
        if cache is not None:
            cache.commit(start + T)
        if last_only:
            x = x[:, -1:, :]
        return self.head(self.norm(x))  # (B, T, V)


# ----------------------------------------------------------------------------------------------
# tasks for workers.WorkerGroup: task(rank, world_size, ...) runs on every rank


def _as_numpy(t: torch.Tensor):
    return t.detach().cpu().numpy().copy()  # plain bytes through the result queue, no shared memory


def tp_greedy_task(rank: int, world_size: int, prompt_ids: list[int], max_new_tokens: int) -> dict:
    """On each rank: load the course model, keep this rank's shard, and run
    (1) a forward pass over the prompt without a cache (the logits, to compare with one process),
    (2) greedy generation with this rank's KV cache through `generate`'s loop, timing each decode step: its
        wall seconds, the seconds inside its all-reduces, and the CPU seconds this process used (so a step
        can be split into arithmetic, waiting inside collectives, and waiting for a core); and logging the
        bytes every all-reduce of the last decode step carried."""
    tp = TensorParallelTransformer(worker_model(), rank, world_size)
    prompt = torch.tensor([prompt_ids], dtype=torch.long)  # (1, T)
    logits = tp(prompt)  # (1, T, V)
    cache = tp.new_cache(max_seq_len=len(prompt_ids) + max_new_tokens)
    steps = {"step_seconds": [], "allreduce_seconds": [], "step_cpu_seconds": []}

    def timed_step(model, token, cache):
        model.comm.reset()  # so the log holds this step's all-reduces only
        wall, cpu = time.perf_counter(), time.process_time()
        out = decode_one_token(model, token, cache)
        steps["step_seconds"].append(time.perf_counter() - wall)
        steps["step_cpu_seconds"].append(time.process_time() - cpu)
        steps["allreduce_seconds"].append(sum(model.comm.seconds_log))
        return out

    tokens = generate(tp, prompt, max_new_tokens, cache=cache, step=timed_step)[0, len(prompt_ids) :].tolist()
    return {
        "logits": _as_numpy(logits),
        "tokens": tokens,
        "kv_cache_nbytes": cache.nbytes,
        "allreduce_bytes_last_step": list(tp.comm.bytes_log),
        **steps,
    }


def allreduce_timing_task(rank: int, world_size: int, sizes_bytes: list[int], repeats: int = 200) -> dict:
    """Seconds of each of `repeats` all-reduces (sum) of float32 tensors of each size, each between barriers
    (a list per size: loopback timings on a shared machine are not one number, so the caller takes the
    median and looks at the spread)."""
    import torch.distributed as dist

    out = {}
    for size in sizes_bytes:
        x = torch.ones(max(size // 4, 1))
        for _ in range(5):  # warm-up: connections, buffers
            dist.all_reduce(x)
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - t0)
        out[size] = times
    return out
