"""Pipeline parallelism of the course Transformer: whole layers split across ranks.

Stage 0 holds the embedding and the first layers, the last stage the remaining layers, the final norm
and the output head; a stage in between holds only layers. Per token, each boundary between two stages
carries one activation (d_model numbers) forward, and the last stage sends the chosen token id back to
stage 0, which needs it to embed the next step. Nothing is split inside a layer, so every stage does
exactly the arithmetic the single-process model does: the logits are the same numbers, not merely close.

A single sequence gains no speed: its stages run one after the other, plus the sends. Throughput comes
from keeping several independent sequences ("micro-batches") in flight, so that stage 0 works on
sequence 2 while stage 1 finishes sequence 1 (`pipeline_greedy_task`, n_in_flight > 1).

Left out: uneven stage sizes, interleaved schedules, training (backward passes and their bubbles),
batching the micro-batches of one stage together.
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn

from ..kv_cache import KVCache
from ..model import ModelConfig
from .workers import worker_model


def stage_layers(cfg: ModelConfig, n_stages: int, stage: int) -> range:
    """The layers `stage` runs: n_layers split into n_stages contiguous, near-equal runs."""
    if not isinstance(n_stages, int) or not 1 <= n_stages <= cfg.n_layers:
        raise ValueError(f"n_stages must be an int in [1, n_layers={cfg.n_layers}]; got {n_stages!r}")
    if not isinstance(stage, int) or not 0 <= stage < n_stages:
        raise ValueError(f"stage must be an int in [0, {n_stages - 1}]; got {stage!r}")
    bounds = [round(i * cfg.n_layers / n_stages) for i in range(n_stages + 1)]
    return range(bounds[stage], bounds[stage + 1])


def activation_bytes_per_token(cfg: ModelConfig, dtype=torch.float16) -> int:
    """Bytes one token's activation carries across one stage boundary: d_model numbers."""
    return cfg.d_model * torch.empty((), dtype=dtype).element_size()


class PipelineStage(nn.Module):
    """One stage's share of a course Transformer: its layers (the model's own Block modules), plus the
    embedding on the first stage and the final norm and head on the last."""

    def __init__(self, model, n_stages: int, stage: int):
        super().__init__()
        self.cfg, self.stage, self.n_stages = model.cfg, stage, n_stages
        self.layer_ids = stage_layers(model.cfg, n_stages, stage)
        self.first, self.last = stage == 0, stage == n_stages - 1
        self.embed = model.embed if self.first else None
        self.layers = nn.ModuleList(model.layers[i] for i in self.layer_ids)
        self.norm, self.head = (model.norm, model.head) if self.last else (None, None)
        self.rope_cos, self.rope_sin = model.rope_cos, model.rope_sin

    def new_cache(self, max_seq_len: int) -> KVCache:
        """A KV cache for this stage's layers only."""
        cfg = self.cfg
        return KVCache(
            len(self.layers),
            1,
            cfg.n_kv_heads,
            max_seq_len,
            cfg.head_dim,
            dtype=self.rope_cos.dtype,
            device=self.rope_cos.device,
        )

    @torch.no_grad()
    def forward(self, x, cache: KVCache):
        """First stage: token ids (B, T) -> activation (B, T, C). Middle: (B, T, C) -> (B, T, C).
        Last stage: (B, T, C) -> logits of the last position (B, V)."""
        start = cache.length
        T = x.shape[1]
        cos, sin = self.rope_cos[start : start + T], self.rope_sin[start : start + T]
        if self.first:
            x = self.embed(x)  # (B, T, C)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.layer(i), start)
        cache.commit(start + T)
        if self.last:
            return self.head(self.norm(x[:, -1:, :]))[:, -1, :]  # (B, V)
        return x


def pipeline_greedy_task(
    rank: int, world_size: int, prompts: list[list[int]], max_new_tokens: int, n_in_flight: int
) -> dict:
    """Greedy generation for len(prompts) independent sequences through a world_size-stage pipeline.

    Sequences go through in groups of `n_in_flight`: within a group, each stage handles sequence after
    sequence, so with n_in_flight >= world_size every stage has work while the others do too. With
    n_in_flight = 1 the stages take turns. Returns (on the last stage) the generated tokens per
    sequence, the wall time and this process's CPU time (its busy time: a stage waiting for its
    neighbour uses none), and the bytes this rank sent forward per token."""
    import torch.distributed as dist

    if world_size < 2:
        raise ValueError(f"a pipeline needs at least 2 stages (world_size >= 2); got {world_size}")
    if not isinstance(n_in_flight, int) or n_in_flight < 1:
        raise ValueError(f"n_in_flight must be an int >= 1; got {n_in_flight!r}")
    model = worker_model()
    stage = PipelineStage(model, world_size, rank)
    C = model.cfg.d_model
    prev, nxt = rank - 1, rank + 1
    tokens = [[] for _ in prompts]
    sent_bytes = []
    # sends do not wait for their receiver (isend): a stage that blocked in a send to a busy neighbour
    # while that neighbour blocked sending to it would wait forever. Kept until done: (tensor, handle)
    in_transit = []
    dist.barrier()
    t0, cpu0 = time.perf_counter(), time.process_time()
    for g in range(0, len(prompts), n_in_flight):
        group = range(g, min(g + n_in_flight, len(prompts)))
        caches = {i: stage.new_cache(len(prompts[i]) + max_new_tokens) for i in group}
        for step in range(max_new_tokens):
            for i in group:
                T = len(prompts[i]) if step == 0 else 1
                if stage.first:
                    if step == 0:
                        x = torch.tensor([prompts[i]], dtype=torch.long)  # (1, T)
                    else:
                        x = torch.empty(1, 1, dtype=torch.long)
                        dist.recv(x, src=world_size - 1)  # the token the last stage chose
                else:
                    x = torch.empty(1, T, C)
                    dist.recv(x, src=prev)  # (1, T, C) activation from the previous stage
                y = stage(x, caches[i])
                if stage.last:
                    tok = y.argmax(dim=-1, keepdim=True)  # (1, 1)
                    tokens[i].append(int(tok))
                    if step + 1 < max_new_tokens:
                        in_transit.append((tok, dist.isend(tok, dst=0)))
                else:
                    y = y.contiguous()
                    in_transit.append((y, dist.isend(y, dst=nxt)))
                    if step > 0:
                        sent_bytes.append(y.numel() * y.element_size())
        for _, handle in in_transit:
            handle.wait()
        in_transit.clear()
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "tokens": tokens if stage.last else None,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "layers": list(stage.layer_ids),
        "bytes_sent_per_decode_token": sorted(set(sent_bytes)),
    }
