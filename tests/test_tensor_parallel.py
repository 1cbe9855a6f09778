"""Tensor and pipeline parallelism of the course model, and the worker group that runs them.

In one process: the weight slices, the config arithmetic, and the sharded model with an all-reduce
done by threads (exact equality of the two ranks, closeness to the single-process model). In real
processes (gloo on 127.0.0.1): logits and greedy tokens against the single-process model, the halved
KV cache, the pipeline's tokens, a clean shutdown, and the launcher's failures: a worker that dies,
a task that raises, a task that runs past its deadline. Each must end in a WorkerError, quickly,
with every worker gone.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from helpers import KVCache, generate, load_model
from helpers.measure.flops import kv_cache_bytes
from helpers.model import ModelConfig, Transformer
from helpers.parallel.interconnect import GPUS, LINKS, LLAMA3_70B, decode_step_budget, ring_allreduce_seconds
from helpers.parallel.pipeline_parallel import pipeline_greedy_task, stage_layers
from helpers.parallel.tensor_parallel import (
    TensorParallelTransformer,
    allreduce_bytes_per_token_per_layer,
    check_tp_size,
    head_ranges,
    kv_heads_per_rank,
    shard_state_dict,
    tp_greedy_task,
    tp_kv_cache_bytes,
)
from helpers.parallel.workers import WorkerError, WorkerGroup

TINY = ModelConfig.from_preset("tiny")  # 4 heads, 2 kv heads, d_ff 128


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# tasks the workers run (module level: spawn imports them by name)


def _die_on_rank_1(rank, world_size):
    import torch.distributed as dist

    if rank == 1:
        os._exit(3)  # no cleanup, no message: like a segfault or the OOM killer
    dist.barrier()  # rank 0 would wait here forever for the dead rank
    return "unreachable"


def _raise(rank, world_size):
    raise RuntimeError(f"deliberate failure on rank {rank}")


def _sleep(rank, world_size, seconds):
    time.sleep(seconds)


# ---------------------------------------------------------------------------------------------
# config arithmetic and slicing, no processes


def test_ownership_and_bad_sizes():
    cfg = ModelConfig.from_preset("target")
    assert [list(r) for r in head_ranges(cfg, 2, 1)] == [[4, 5, 6, 7], [1]]
    assert kv_heads_per_rank(cfg, 2) == 1 and kv_heads_per_rank(cfg, 4) == 1  # replicated beyond 2
    assert kv_heads_per_rank(LLAMA3_70B, 8) == 1 == kv_heads_per_rank(LLAMA3_70B, 16)
    assert tp_kv_cache_bytes(LLAMA3_70B, 100, 8) == kv_cache_bytes(LLAMA3_70B, 100) // 8
    assert tp_kv_cache_bytes(LLAMA3_70B, 100, 16) == tp_kv_cache_bytes(LLAMA3_70B, 100, 8)
    assert allreduce_bytes_per_token_per_layer(cfg, torch.float32) == 2 * 256 * 4
    for bad in (0, 3, 2.0, True):
        with pytest.raises(ValueError, match="tp_size"):
            check_tp_size(cfg, bad)
    with pytest.raises(ValueError, match="rank"):
        head_ranges(cfg, 2, 2)
    with pytest.raises(ValueError, match="n_stages"):
        stage_layers(cfg, 7, 0)


def test_stage_layers_cover_every_layer_once():
    cfg = ModelConfig.from_preset("target")
    for n in range(1, cfg.n_layers + 1):
        layers = [i for s in range(n) for i in stage_layers(cfg, n, s)]
        assert layers == list(range(cfg.n_layers))


def test_shards_partition_every_split_weight():
    torch.manual_seed(0)
    model = Transformer(TINY).eval()
    full = model.state_dict()
    shards = [shard_state_dict(model, 2, r) for r in range(2)]
    # the MLP's down projection: column blocks that put back together give the full matrix
    name = "layers.1.mlp.w_down.weight"
    assert torch.equal(torch.cat([s[name] for s in shards], dim=1), full[name])
    name = "layers.0.attn.wo.weight"
    assert torch.equal(torch.cat([s[name] for s in shards], dim=1), full[name])
    assert torch.equal(shards[0]["embed.weight"], full["embed.weight"])  # replicated


def test_cost_model_arithmetic():
    assert ring_allreduce_seconds(1e6, 1, 1e9) == 0.0
    assert ring_allreduce_seconds(1e6, 4, 1e9, latency_s=1e-6) == pytest.approx(6e-6 + 1.5e6 / 1e9)
    b = decode_step_budget(LLAMA3_70B, 8, GPUS["H100 SXM"], LINKS["nvlink-h100"])
    assert b["total"] == pytest.approx(b["weights"] + b["allreduce"])
    with pytest.raises(ValueError, match="tp_size"):
        ring_allreduce_seconds(1.0, 0, 1.0)


class _ThreadAllReduce:
    """An all-reduce between threads: every rank deposits its tensor, all wait, all take the same sum."""

    def __init__(self, n):
        self.barrier, self.parts = threading.Barrier(n, timeout=60), [None] * n

    def for_rank(self, rank):
        def all_reduce(t):
            self.parts[rank] = t.clone()
            self.barrier.wait()
            total = self.parts[0].clone()
            for p in self.parts[1:]:
                total += p
            self.barrier.wait()  # nobody overwrites a part before everyone has summed
            t.copy_(total)

        return all_reduce


def test_a_shard_takes_its_own_cache_and_refuses_the_full_models():
    from helpers.model import check_cache

    model = Transformer(TINY).eval()
    shard = TensorParallelTransformer(model, 0, 2, all_reduce=lambda t: None)  # one rank, no peers needed
    check_cache(shard.new_cache(max_seq_len=8), shard)  # its own KV head: accepted
    with pytest.raises(ValueError, match="cache was built for another model"):
        generate(shard, [1, 2, 3], 2, cache=KVCache.for_model(model, max_seq_len=8))


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_sharded_model_matches_full_model_in_threads(tp_size):
    torch.manual_seed(0)
    model = Transformer(TINY).eval()
    comm = _ThreadAllReduce(tp_size)
    ranks = [TensorParallelTransformer(model, r, tp_size, all_reduce=comm.for_rank(r)) for r in range(tp_size)]
    prompt = torch.randint(0, TINY.vocab_size, (2, 7))
    out = [None] * tp_size

    def work(r):
        cache = ranks[r].new_cache(batch_size=2, max_seq_len=20)
        out[r] = (ranks[r](prompt), generate(ranks[r], prompt, 8, cache=cache), cache.nbytes)  # the one decode loop

    threads = [threading.Thread(target=work, args=(r,)) for r in range(tp_size)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    with torch.no_grad():
        ref_logits = model(prompt)
    ref_tokens = generate(model, prompt, 8)
    full_cache = KVCache.for_model(model, batch_size=2, max_seq_len=20).nbytes
    for logits, tokens, nbytes in out:
        assert torch.equal(logits, out[0][0])  # every rank ends with the same numbers
        assert (logits - ref_logits).abs().max() < 1e-4
        assert torch.equal(tokens, ref_tokens)
        assert nbytes == full_cache // min(tp_size, TINY.n_kv_heads)


# ---------------------------------------------------------------------------------------------
# real processes


@pytest.fixture(scope="module")
def group():
    g = WorkerGroup(world_size=2, timeout_s=240).start()
    yield g
    g.close()


def test_two_processes_match_one(group):
    model, tok = load_model("target", device="cpu", dtype=torch.float32)
    prompt = tok.encode("import os\n", bos=True)
    results = group.run(tp_greedy_task, prompt, 12)
    with torch.no_grad():
        ref = model(torch.tensor([prompt]))
    for r in results:
        assert (torch.from_numpy(r["logits"]) - ref).abs().max() < 1e-3
        assert r["tokens"] == generate(model, prompt, 12)[0, len(prompt) :].tolist()
        assert r["kv_cache_nbytes"] == KVCache.for_model(model, max_seq_len=len(prompt) + 12).nbytes // 2
        assert r["allreduce_bytes_last_step"] == [model.cfg.d_model * 4] * (2 * model.cfg.n_layers)
        assert len(r["step_seconds"]) == len(r["allreduce_seconds"]) == len(r["step_cpu_seconds"]) == 11
        assert all(0 <= a <= s for a, s in zip(r["allreduce_seconds"], r["step_seconds"]))
    assert torch.equal(torch.from_numpy(results[0]["logits"]), torch.from_numpy(results[1]["logits"]))


def test_pipeline_matches_one_process(group):
    model, tok = load_model("target", device="cpu", dtype=torch.float32)
    prompts = [tok.encode(t, bos=True) for t in ("def f(x):", "class A:", "x = [")]
    for in_flight in (1, 3):
        results = group.run(pipeline_greedy_task, prompts, 6, in_flight)
        assert results[1]["tokens"] == [generate(model, p, 6)[0, len(p) :].tolist() for p in prompts]
        assert results[0]["bytes_sent_per_decode_token"] == [model.cfg.d_model * 4]


def test_clean_shutdown(group):
    g = group  # runs after the tests above that use it (pytest keeps the file's order)
    pids = g.pids
    assert all(g.alive())
    g.close()
    assert not any(g.alive()) and not any(_pid_running(p) for p in pids)
    g.close()  # closing twice is harmless
    with pytest.raises(WorkerError, match="closed"):
        g.run(_sleep, 0)


def test_dead_worker_raises_instead_of_hanging():
    g = WorkerGroup(world_size=2, timeout_s=240).start()
    pids = g.pids
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank 1 .*exit code 3"):
        g.run(_die_on_rank_1, timeout_s=60)
    assert time.monotonic() - t0 < 30  # noticed within the poll interval, long before any timeout
    assert not any(_pid_running(p) for p in pids)  # the survivor, stuck in a barrier, was killed


def test_task_exception_and_deadline():
    g = WorkerGroup(world_size=1, timeout_s=240).start()
    with pytest.raises(WorkerError, match="deliberate failure on rank 0"):
        g.run(_raise)
    assert not any(g.alive())
    g = WorkerGroup(world_size=1, timeout_s=240).start()
    pid = g.pids[0]
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="did not finish within 2 s"):
        g.run(_sleep, 600, timeout_s=2)
    assert time.monotonic() - t0 < 20 and not _pid_running(pid)


def test_bad_arguments():
    with pytest.raises(ValueError, match="world_size"):
        WorkerGroup(world_size=0)
    with pytest.raises(ValueError, match="timeout_s"):
        WorkerGroup(timeout_s=-1)
    with pytest.raises(WorkerError, match="start the WorkerGroup first"):
        WorkerGroup().run(_sleep, 0)
