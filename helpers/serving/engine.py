"""The engine: submit requests, call step() until they are done; each step runs one batched forward pass.

    engine = Engine(model, num_blocks=256, block_size=16, max_num_seqs=32)
    rid = engine.submit(prompt_ids, max_tokens=64)                  # greedy
    rid2 = engine.submit(ids, max_tokens=64, sampling=SamplingConfig(temperature=0.8), seed=1)
    while engine.has_unfinished():
        for out in engine.step():                                   # StepOutput per request that moved
            print(out.request_id, out.new_token_ids, out.finished, out.finish_reason)
    engine.get(rid).output                                          # the generated ids

Each step: the scheduler picks the requests and token counts (scheduler.py), the model runner computes
them in one pass through the paged cache (model_runner.py), and each request whose last known token
was computed gets its next token with its own sampling settings, seeded generator and logits
processors (sampling.py), then its own stop conditions (stopping.StopChecker). A stop criterion that
raises fails only its own request (finish_reason "error", the exception kept in `request.error`).

Time: `engine.time` is the engine's clock in seconds. Each step advances it by the step's measured
duration; `advance_to(t)` moves it forward over idle time. A workload replayed against it therefore
charges exactly the compute it used, and a server can keep it on the wall clock by calling
`advance_to(time.perf_counter() - t0)` before each step.

Out of scope (vLLM has them): a separate process for the engine core and a detokenizer, async output
streaming, n > 1 / best-of, logprobs, guided decoding, speculative decoding inside the engine, and
multi-LoRA batching.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch

from ..sampling import SamplingConfig, check_generator, next_token
from ..stopping import StopChecker
from .block_pool import BlockPool
from .model_runner import SequenceChunk, forward_step
from .paged_cache import PagedKVCache
from .request import FINISHED, Request
from .scheduler import Scheduler

GREEDY = SamplingConfig(temperature=0.0)


@dataclass
class StepOutput:
    request_id: str
    new_token_ids: list[int]  # 0 or 1 tokens this step
    finished: bool
    finish_reason: str | None


@dataclass
class StepRecord:
    """What one step did, for the metrics."""
    start: float
    duration: float
    num_tokens: int  # tokens computed (prefill + decode)
    num_decode: int  # requests that decoded one token
    num_running: int
    live_tokens: int  # tokens whose K/V is in the cache, summed over running requests
    allocated_slots: int  # token slots in blocks handed out (blocks in use * block_size)
    reserved_slots: int  # what contiguous max-length reservation would hold for the same requests


class Engine:
    def __init__(self, model, num_blocks: int, block_size: int = 16, max_num_seqs: int = 32,
                 max_num_batched_tokens: int | None = None, enable_prefix_caching: bool = False,
                 chunked_prefill: bool = True, policy: str = "continuous"):
        cfg = model.cfg
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size), ("max_num_seqs", max_num_seqs)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1; got {value!r}")
        if max_num_batched_tokens is None:  # without chunking a whole prompt must fit one step
            max_num_batched_tokens = 256 if chunked_prefill else cfg.max_seq_len + max_num_seqs
        if not isinstance(max_num_batched_tokens, int) or max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be an int >= 1; got {max_num_batched_tokens!r}")
        if not chunked_prefill and max_num_batched_tokens < cfg.max_seq_len:
            raise ValueError(f"without chunked prefill max_num_batched_tokens ({max_num_batched_tokens}) must be "
                             f">= max_seq_len ({cfg.max_seq_len}) so that any prompt fits one step")
        self.model, self.block_size = model, block_size
        self.cache = PagedKVCache.for_model(model, num_blocks, block_size)
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self.scheduler = Scheduler(self.pool, block_size, max_num_seqs, max_num_batched_tokens,
                                   chunked_prefill, policy)
        self.scheduler.context_limit = cfg.max_seq_len
        self.requests: dict[str, Request] = {}
        self.steps: list[StepRecord] = []
        self.time = 0.0
        self._ids = itertools.count()

    # --- the public API ---------------------------------------------------------------------------
    def submit(self, prompt, max_tokens: int, *, sampling: SamplingConfig | None = None, seed: int | None = None,
               eos_id: int | None = None, stop_sequences=(), stop_criteria=(), logits_processors=(),
               request_id: str | None = None, arrival_time: float | None = None) -> str:
        """Queue a request; returns its id. Rejected with a ValueError, before it takes any block, if
        prompt + max_tokens exceeds the context window or its KV could never fit the pool."""
        cfg = self.model.cfg
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.reshape(-1).tolist()
        if not isinstance(prompt, (list, tuple)) or not prompt or \
                not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise ValueError("prompt must be a non-empty list of int token ids")
        if min(prompt) < 0 or max(prompt) >= cfg.vocab_size:
            raise ValueError(f"prompt: token ids must be in [0, {cfg.vocab_size - 1}]")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1; got {max_tokens!r}")
        if len(prompt) + max_tokens > cfg.max_seq_len:
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the context window "
                             f"max_seq_len={cfg.max_seq_len}")
        # KV is kept for every position but the last generated token's
        blocks = -(-(len(prompt) + max_tokens - 1) // self.block_size)
        if blocks > self.pool.num_blocks:
            raise ValueError(f"prompt + max_tokens needs {blocks} KV blocks of {self.block_size} tokens but the pool "
                             f"has num_blocks={self.pool.num_blocks}: it could never run")
        sampling = GREEDY if sampling is None else sampling
        if not isinstance(sampling, SamplingConfig):
            raise ValueError(f"sampling must be a SamplingConfig or None; got {type(sampling).__name__}")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ValueError(f"seed must be an int or None; got {seed!r}")
        if not all(callable(p) for p in logits_processors):
            raise ValueError("logits_processors must be callables proc(ids, logits) -> logits")
        stop = None
        if eos_id is not None or stop_sequences or stop_criteria:
            stop = StopChecker(eos_id, stop_sequences, stop_criteria)
        generator = torch.Generator(device=self.model.device).manual_seed(seed) if seed is not None else None
        check_generator(generator)
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        r = Request(request_id, list(prompt), max_tokens, sampling, generator, stop, tuple(logits_processors),
                    self.time if arrival_time is None else float(arrival_time))
        self.requests[request_id] = r
        self.scheduler.add(r)
        return request_id

    def cancel(self, request_id: str) -> None:
        """Stop a request now and free its blocks (no-op if it already finished)."""
        r = self.get(request_id)
        if not r.finished:
            self._finish(r, "cancelled", abort=True)

    def get(self, request_id: str) -> Request:
        if request_id not in self.requests:
            raise ValueError(f"no request with id {request_id!r}")
        return self.requests[request_id]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def advance_to(self, t: float) -> None:
        """Move the engine's clock forward to t (over idle time); never backwards."""
        self.time = max(self.time, float(t))

    def step(self) -> list[StepOutput]:
        """Schedule, run one forward pass, sample, check stops. Returns what changed, per request."""
        t0, start = time.perf_counter(), self.time
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return []
        chunks = []
        for s in scheduled:
            r = s.request
            ids = r.all_ids[r.num_computed:r.num_computed + s.num_tokens]
            chunks.append(SequenceChunk(ids, r.num_computed, r.block_table,
                                        r.num_computed + s.num_tokens == r.num_tokens))
        logits = forward_step(self.model, self.cache, chunks)  # (n_sampled, V)
        sampled = [s.request for s, c in zip(scheduled, chunks) if c.want_logits]
        tokens = self._sample(sampled, logits)
        self.time += time.perf_counter() - t0  # the step's compute; its tokens appear when it ends
        for s in scheduled:
            s.request.num_computed += s.num_tokens
            self.scheduler.register_full_blocks(s.request)
        self.steps.append(StepRecord(
            start, self.time - start, sum(s.num_tokens for s in scheduled),
            sum(1 for s in scheduled if s.num_tokens == 1), len(scheduled),
            live_tokens=sum(s.request.num_computed for s in scheduled),
            allocated_slots=self.pool.num_used * self.block_size,
            reserved_slots=sum(len(s.request.prompt) + s.request.max_tokens for s in scheduled)))
        outputs = []
        for r, tok in zip(sampled, tokens):
            if r.finished:  # a static batch's padded row: computed, thrown away
                r.padded.append(tok)
                continue
            r.output.append(tok)
            r.token_times.append(self.time)
            reason = self._stop_reason(r)
            if reason is not None:
                self._finish(r, reason)
            outputs.append(StepOutput(r.request_id, [tok], r.finished, r.finish_reason))
        return outputs

    def run(self) -> dict[str, list[int]]:
        """Step until every submitted request is done; returns each one's output ids."""
        while self.has_unfinished():
            self.step()
        return {rid: r.output for rid, r in self.requests.items()}

    def metrics(self) -> dict:
        """Totals over every step so far (see StepRecord for the per-step log in `engine.steps`)."""
        steps, done = self.steps, [r for r in self.requests.values() if r.finished and r.token_times]
        generated = sum(len(r.output) for r in self.requests.values())
        alloc = sum(s.allocated_slots for s in steps)
        return dict(
            steps=len(steps), generated_tokens=generated, engine_time_s=self.time,
            busy_time_s=sum(s.duration for s in steps),
            kv_utilisation=sum(s.live_tokens for s in steps) / alloc if alloc else float("nan"),
            peak_running=max((s.num_running for s in steps), default=0),
            preemptions=self.scheduler.num_preemptions,
            prefix_cache_hit_rate=self.pool.hits / self.pool.queries if self.pool.queries else 0.0,
            free_blocks=self.pool.num_free, num_blocks=self.pool.num_blocks,
            finished=len(done), waiting=len(self.scheduler.waiting), running=len(self.scheduler.running),
        )

    # --- inside a step ----------------------------------------------------------------------------
    def _sample(self, requests: list[Request], logits: torch.Tensor) -> list[int]:
        """One token per request, each with its own settings. Plain greedy rows share one argmax."""
        out: list[int | None] = [None] * len(requests)
        plain = [i for i, r in enumerate(requests) if r.sampling.greedy and not r.logits_processors]
        if plain:
            best = logits[plain].argmax(dim=-1).tolist()
            for i, t in zip(plain, best):
                out[i] = t
        for i, r in enumerate(requests):
            if out[i] is not None:
                continue
            row = logits[i:i + 1]  # (1, V)
            ids = torch.tensor([r.prompt + r.output], dtype=torch.long, device=row.device)  # (1, T)
            for proc in r.logits_processors:
                row = proc(ids, row)
            s = r.sampling
            penalised = s.repetition_penalty != 1.0 or s.presence_penalty or s.frequency_penalty
            out[i] = int(next_token(row, s, r.generator, ids if penalised else None)[0, 0])
        return out

    def _stop_reason(self, r: Request) -> str | None:
        if r.stop is not None:
            try:
                if r.stop(r.output):
                    reason = r.stop.reason
                    return reason if isinstance(reason, str) else "stop_criterion"
            except Exception as e:  # this request's criterion broke: fail it alone
                r.error = e
                return "error"
        if len(r.output) >= r.max_tokens:
            return "length"
        return None

    def _finish(self, r: Request, reason: str, abort: bool = False) -> None:
        r.finish_reason, r.finish_time = reason, self.time
        if abort or reason == "error":
            self.scheduler.abort(r)
        else:
            self.scheduler.finish(r)
        if r.status != FINISHED and not r.padding:
            raise RuntimeError("request left in the scheduler after finishing")
