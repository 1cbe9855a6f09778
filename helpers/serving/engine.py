"""The engine: submit requests, call step() until they are done; each step runs one batched forward pass.

    engine = Engine(model, num_blocks=256, block_size=16, max_num_seqs=32)
    rid = engine.submit(prompt_ids, max_tokens=64)                  # greedy
    rid2 = engine.submit(ids, max_tokens=64, sampling=SamplingConfig(temperature=0.8), seed=1)
    while engine.has_unfinished():
        for out in engine.step():                                   # StepOutput per request that moved
            print(out.request_id, out.new_token_ids, out.finished, out.finish_reason)
    engine.get(rid).output                                          # the generated ids

Each step: the scheduler picks the requests and token counts (scheduler.py), the model runner computes
them in one pass through the paged cache (model_runner.py; with `compile_step`, every step of two or more
new tokens, decodes and prompt chunks alike, runs as one compiled graph where it applies: compiled_step.py), and
each request whose last known token was computed gets its next token with its own sampling settings,
seeded generator and logits processors (sampling.py), then its own stop conditions (stopping.StopChecker).

Isolation: whatever goes wrong for one request (its logits processor or grammar raises or returns bad
logits, its sampling fails, its stop criterion raises) fails that request alone: finish_reason "error",
the exception kept in `request.error`, its blocks freed; every other request of the step goes on
untouched (tests/test_serving.py runs one workload with and without failing requests: the others' tokens
are the same, bit for bit). Bad parameters are refused by `submit` (params.py: a ValueError naming the
parameter) before anything is queued; a temperature in (0, 1e-5) decodes greedily, as vLLM's does.
Only a failure of the batched forward pass itself (a bug, not a request's fault) raises from `step()`.

Liveness: every policy finishes every request `submit` accepts, within sum(prompt tokens + max_tokens)
steps (scheduler.py says why); a step that schedules nothing while requests remain raises instead of
spinning.

Time: `engine.time` is the engine's clock in seconds. Each step advances it by the step's measured
duration; `advance_to(t)` moves it forward over idle time. A workload replayed against it therefore
charges exactly the compute it used, and a server can keep it on the wall clock by calling
`advance_to(time.perf_counter() - t0)` before each step.

A long-running caller (the HTTP server) keeps the engine's books bounded: `forget(rid)` drops a finished
request's record, `Engine(step_log=n)` keeps the last n step records, and `stats()` is a cheap snapshot.

Out of scope (vLLM has them): a separate process for the engine core and a detokenizer, async output
streaming, n > 1 / best-of, logprobs, guided decoding, speculative decoding inside the engine, and
multi-LoRA batching.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch

from ..sampling import check_generator, next_token
from ..stopping import StopChecker
from . import params
from .block_pool import BlockPool
from .compiled_step import compiled_step_for
from .model_runner import SequenceChunk, default_decode_attention, forward_step
from .paged_cache import PagedKVCache
from .request import FINISHED, Request
from .row_tiles import invariant_widths
from .scheduler import Scheduler
from .static_scheduler import StaticScheduler
from .step_view import DECODE_ATTENTION


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
    num_running: int  # requests holding blocks after the step's scheduling
    live_tokens: int  # filled slots in the blocks in use (a block shared by a prefix counts once)
    context_tokens: int  # tokens of context the requests attend to, summed (shared prefixes counted per request)
    allocated_slots: int  # token slots in blocks handed out (blocks in use * block_size)
    reserved_slots: int  # what contiguous reservation of prompt + max_tokens would hold for the same requests
    preempted: int = 0  # requests preempted (their blocks taken back) while this step was scheduled


class Engine:
    def __init__(
        self,
        model,
        num_blocks: int,
        block_size: int = 16,
        max_num_seqs: int = 32,
        max_num_batched_tokens: int | None = None,
        enable_prefix_caching: bool = False,
        chunked_prefill: bool = True,
        policy: str = "continuous",
        step_log: int | None = None,
        decode_attention: str | None = None,
        batch_invariant: bool = False,
        compile_step: bool | str = False,
    ):
        """policy: "continuous", or "static" (the baseline, static_scheduler.py). step_log: keep the last
        step_log StepRecords in `steps` (None: every one). decode_attention: "in_place" (blocks read where
        they lie), "gather" (a dense copy first), None: the default for this model (model_runner.py). Each
        parameter is checked (params.py).

        batch_invariant: True makes a request's logits, and so its greedy tokens, bit for bit the same
        whatever else runs in its steps (alone, or among max_num_seqs - 1 others), on a given machine.
        Without it a row's logits can change with its neighbours: the BLAS picks its blocking, and so the
        order of each dot product's sum, by the number of rows M of the step, and a near-tie then flips a
        greedy token. How: every matmul runs on tiles whose number of rows stays in a range the library is
        measured to treat alike (row_tiles.py: on x86 with MKL, from a few rows up; where no such range
        is found, exactly max_num_seqs rows), a prompt is computed in the same chunks of max_num_batched_tokens -
        max_num_seqs tokens (the whole prompt without chunked prefill) whatever else runs, a preempted
        request replays the same pieces (scheduler.py), and attention is one request at a time. Cost: the
        measurement, once per process (about a second); zero rows padding a step smaller than the range;
        a prompt chunk that does not fit a step's leftover budget waits a step instead of being cut; and,
        where no range is found, every step padded to max_num_seqs rows, the tail of a workload included
        (helpers/serving/bench.py measures the tokens/s). Left out: the same request on another machine,
        thread count or torch build (other kernels), another max_num_seqs or max_num_batched_tokens, or
        with sampling's own randomness shared (a request without a seed draws from torch's global
        generator, whose state depends on the others); prefix caching and the static policy are refused
        in this mode (a cached prefix was computed in another request's chunks).

        compile_step: True runs every step of two or more new tokens (decodes and prompt chunks) through one
        torch.compile'd graph with the library's matmuls (compiled_step.py; compiled here, before the first
        step, shared by every engine on the model, kept in the on-disk compile cache); "autotune" with inductor's own
        autotuned matmuls instead (faster at small batches, but compiled afresh in every process, tens of
        seconds on a small CPU). Other steps, and every step where compiling failed, run eagerly. Off by
        default (tests and notebooks build engines in many processes); the serving bench and the server CLI
        use "autotune". `compiled_steps` counts the steps it ran."""
        params.check_kv_pool(model, num_blocks, block_size, max_num_seqs)
        max_num_batched_tokens = params.check_scheduling(
            model.cfg, max_num_seqs, max_num_batched_tokens, enable_prefix_caching, chunked_prefill, policy, step_log
        )
        fixed_chunk = params.check_batch_invariant(
            model, batch_invariant, policy, enable_prefix_caching, chunked_prefill, max_num_seqs, max_num_batched_tokens
        )
        self.batch_invariant = batch_invariant
        # every matmul's number of rows in the mode: from lo to hi (row_tiles.py)
        self.row_widths = invariant_widths(model, max_num_batched_tokens, max_num_seqs) if batch_invariant else None
        self.model, self.block_size, self.step_log = model, block_size, step_log
        if decode_attention is None:
            decode_attention = default_decode_attention(model, block_size)
        if decode_attention not in DECODE_ATTENTION:
            raise params.InvalidParameter(
                "decode_attention",
                f"decode_attention must be one of {DECODE_ATTENTION} or None; got {decode_attention!r}",
            )
        self.decode_attention = decode_attention
        if not (isinstance(compile_step, bool) or compile_step == "autotune"):
            raise params.InvalidParameter(
                "compile_step", f"compile_step must be False, True or 'autotune'; got {compile_step!r}"
            )
        mode = "autotune" if compile_step == "autotune" else "library"
        self.compiled = compiled_step_for(model, mode) if compile_step is not False else None
        if self.compiled is not None and self.compiled.error is None and block_size not in self.compiled.block_sizes:
            self.compiled.warmup(block_size)  # compile now (once per block size): no step's clock should pay it
        self.compiled_steps = 0
        self.cache = PagedKVCache.for_model(model, num_blocks, block_size)
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        args = (self.pool, block_size, max_num_seqs, max_num_batched_tokens, chunked_prefill)
        self.scheduler = (
            StaticScheduler(*args, context_limit=model.cfg.max_seq_len)
            if policy == "static"
            else Scheduler(*args, fixed_chunk=fixed_chunk)
        )
        self.requests: dict[str, Request] = {}
        self.steps: list[StepRecord] = []
        self.num_steps = 0  # every step so far (the log may keep fewer)
        self.time = 0.0
        self._ids = itertools.count()
        self.reset_timings()

    # --- the public API ---------------------------------------------------------------------------
    def submit(
        self,
        prompt,
        max_tokens: int,
        *,
        sampling=None,
        seed: int | None = None,
        eos_id: int | None = None,
        stop_sequences=(),
        stop_criteria=(),
        logits_processors=(),
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> str:
        """Queue a request; returns its id.

        prompt: a list of token ids, a 1-D tensor or a (1, T) tensor (one request; a batch is refused).
        sampling: a SamplingConfig, None for greedy; a temperature in (0, params.GREEDY_BELOW) is greedy.
        seed: seeds the request's own generator (None: torch's global one).
        Every parameter is checked before anything is queued: a params.InvalidParameter (a ValueError whose
        `.param` names it) if it is of the wrong type or range, or if prompt + max_tokens exceeds the
        context window or needs more KV blocks than the pool has (it could never run)."""
        cfg = self.model.cfg
        prompt = params.check_prompt(prompt, self.model)
        params.check_lengths(len(prompt), max_tokens, cfg.max_seq_len, self.block_size, self.pool.num_blocks)
        sampling = params.check_sampling(sampling)
        params.check_seed(seed)
        stop_sequences = params.check_stops(eos_id, stop_sequences, stop_criteria, cfg.vocab_size)
        logits_processors = params.check_processors(logits_processors)
        request_id = params.check_request_id(request_id)
        arrival_time = params.check_arrival_time(arrival_time)
        if request_id in self.requests:
            raise params.InvalidParameter("request_id", f"request_id {request_id!r} is already in use")
        stop = None
        if eos_id is not None or stop_sequences or stop_criteria:
            stop = StopChecker(eos_id, stop_sequences, list(stop_criteria))
        generator = torch.Generator(device=self.model.device).manual_seed(seed) if seed is not None else None
        check_generator(generator)
        request_id = str(next(self._ids)) if request_id is None else request_id
        r = self.scheduler.request_type(
            request_id,
            prompt,
            max_tokens,
            sampling,
            generator,
            stop,
            logits_processors,
            self.time if arrival_time is None else arrival_time,
        )
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

    def forget(self, request_id: str) -> None:
        """Drop a finished request's record (a server calls this once it has delivered the result)."""
        if not self.get(request_id).finished:
            raise ValueError(f"request {request_id!r} has not finished: cancel it first")
        del self.requests[request_id]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def advance_to(self, t: float) -> None:
        """Move the engine's clock forward to t (over idle time); never backwards."""
        self.time = max(self.time, float(t))

    def step(self) -> list[StepOutput]:
        """Schedule, run one forward pass, sample, check stops. Returns what changed, per request."""
        t0, start = time.perf_counter(), self.time
        preemptions = self.scheduler.num_preemptions
        scheduled = self.scheduler.schedule()
        if self.scheduler.num_preemptions != preemptions:  # preempted requests' blocks are gone: so is their KV
            for r in self.scheduler.waiting:
                self.cache.release(r.request_id)
        preempted = self.scheduler.num_preemptions - preemptions
        t_scheduled = time.perf_counter()
        if not scheduled:
            if self.has_unfinished():  # a bug guard: a live scheduler always schedules someone
                raise RuntimeError("the scheduler scheduled nothing while requests remain")
            return []
        chunks = []
        for s in scheduled:
            r = s.request
            ids = r.ids(r.num_computed, r.num_computed + s.num_tokens)
            chunks.append(
                SequenceChunk(
                    ids,
                    r.num_computed,
                    r.block_table,
                    r.num_computed + s.num_tokens == r.num_tokens,
                    None if r.finished else r.request_id,
                )
            )  # a padded row's KV is nobody's
        t_chunks = time.perf_counter()
        if self.compiled is not None and self.compiled.applies(chunks, self.decode_attention, self.row_widths):
            logits, argmax, finite = self.compiled(self.cache, chunks, greedy=True)  # (n_sampled, V), lists
            greedy = (argmax, finite)  # each sampled row's argmax and finite flag, computed in the graph
            self.compiled_steps += 1
        else:
            greedy = None
            logits = forward_step(
                self.model, self.cache, chunks, self.decode_attention, self.timings, self.row_widths
            )  # (n_sampled, V)
        t_forward = time.perf_counter()
        sampled = [s.request for s, c in zip(scheduled, chunks) if c.want_logits]
        tokens = self._sample(sampled, logits, greedy)
        t_sampled = time.perf_counter()
        self.time += t_sampled - t0  # the step's compute; its tokens appear when it ends
        for s in scheduled:
            s.request.num_computed += s.num_tokens
            self.scheduler.register_full_blocks(s.request)
        self._log_step(start, scheduled, preempted)
        outputs = []
        for r, tok in zip(sampled, tokens):
            if r.finished:  # a static batch's padded row: computed, thrown away
                self.scheduler.discard(r, tok)
                continue
            if isinstance(tok, BaseException):  # this request's own sampling failed: it alone ends
                r.error = tok
                self._finish(r, "error")
                outputs.append(StepOutput(r.request_id, [], True, r.finish_reason))
                continue
            r.output.append(tok)
            r.token_times.append(self.time)
            reason = self._stop_reason(r)
            if reason is not None:
                self._finish(r, reason)
            outputs.append(StepOutput(r.request_id, [tok], r.finished, r.finish_reason))
        t_end = time.perf_counter()
        tm = self.timings
        tm["steps"] += 1
        tm["schedule"] += t_scheduled - t0
        tm["forward"] += t_forward - t_chunks
        tm["sample"] += t_sampled - t_forward
        tm["bookkeeping"] += (t_chunks - t_scheduled) + (t_end - t_sampled)
        return outputs

    def reset_timings(self) -> None:
        """Start step_breakdown()'s sums afresh (say, once the prompts are prefilled)."""
        self.timings = dict(steps=0, schedule=0.0, forward=0.0, sample=0.0, bookkeeping=0.0)

    def step_breakdown(self) -> dict[str, float]:
        """Mean seconds per step so far, by part: schedule (scheduler.py), inputs (the step's index tensors),
        attention (gathers included), matmuls and the rest of the forward pass, sample, bookkeeping (the
        engine's own Python before and after the forward pass: chunks, counters, the step log, stops)."""
        tm, n = self.timings, max(self.timings["steps"], 1)
        rest = tm["forward"] - tm.get("inputs", 0.0) - tm.get("attention", 0.0)
        parts = dict(
            schedule=tm["schedule"],
            inputs=tm.get("inputs", 0.0),
            attention=tm.get("attention", 0.0),
            matmuls_and_rest=rest,
            sample=tm["sample"],
            bookkeeping=tm["bookkeeping"],
        )
        return {k: v / n for k, v in parts.items()}

    def run(self) -> dict[str, list[int]]:
        """Step until every submitted request is done; returns each one's output ids."""
        while self.has_unfinished():
            self.step()
        return {rid: r.output for rid, r in self.requests.items()}

    def stats(self) -> dict:
        """A cheap snapshot for a server's /metrics: requests and blocks now."""
        return dict(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_blocks_total=self.pool.num_blocks,
            kv_blocks_free=self.pool.num_free,
            kv_blocks_used=self.pool.num_used,
            block_size=self.block_size,
            steps=self.num_steps,
            preemptions=self.scheduler.num_preemptions,
        )

    def metrics(self) -> dict:
        """Totals over the step log (every step unless `step_log` bounds it; see StepRecord)."""
        steps, done = self.steps, [r for r in self.requests.values() if r.finished and r.token_times]
        generated = sum(len(r.output) for r in self.requests.values())
        alloc = sum(s.allocated_slots for s in steps)
        return dict(
            steps=len(steps),
            generated_tokens=generated,
            engine_time_s=self.time,
            busy_time_s=sum(s.duration for s in steps),
            kv_utilisation=sum(s.live_tokens for s in steps) / alloc if alloc else float("nan"),
            peak_running=max((s.num_running for s in steps), default=0),
            preemptions=self.scheduler.num_preemptions,
            recomputed_tokens=self.scheduler.recomputed_tokens,
            prefix_cache_hit_rate=self.pool.hits / self.pool.queries if self.pool.queries else 0.0,
            free_blocks=self.pool.num_free,
            num_blocks=self.pool.num_blocks,
            finished=len(done),
            waiting=len(self.scheduler.waiting),
            running=len(self.scheduler.running),
        )

    # --- inside a step ----------------------------------------------------------------------------
    def _log_step(self, start: float, scheduled, preempted: int = 0) -> None:
        running = self.scheduler.running
        self.num_steps += 1
        self.steps.append(
            StepRecord(
                start,
                self.time - start,
                sum(s.num_tokens for s in scheduled),
                sum(1 for s in scheduled if s.num_tokens == 1),
                len(running),
                live_tokens=self._filled_slots(),
                context_tokens=sum(r.num_computed for r in running),
                allocated_slots=self.pool.num_used * self.block_size,
                reserved_slots=sum(len(r.prompt) + r.max_tokens for r in running),
                preempted=preempted,
            )
        )
        if self.step_log is not None and len(self.steps) >= 2 * self.step_log:
            del self.steps[: -self.step_log]  # trimmed in batches: amortised O(1) a step

    def _sample(self, requests: list[Request], logits: torch.Tensor, greedy=None) -> list:
        """One token per request, each with its own settings: an int, or the exception its own sampling raised.
        Plain greedy rows (and padded rows, whose tokens are thrown away) share one argmax: `greedy`, the
        (argmax, finite) lists of every row when the compiled step computed them, else computed here."""
        out: list = [None] * len(requests)
        plain = [
            i
            for i, r in enumerate(requests)
            if r.finished or (r.sampling.greedy and not r.logits_processors and not _penalised(r.sampling))
        ]
        if plain:
            if greedy is not None:
                argmax, finite = greedy
                argmax, valid = [argmax[i] for i in plain], [finite[i] for i in plain]
            else:
                rows = logits if len(plain) == len(requests) else logits[plain]  # (n_plain, V)
                valid = torch.isfinite(rows.amax(dim=-1)).tolist()  # no NaN or +inf, not all -inf
                argmax = rows.argmax(dim=-1).tolist()
            for i, t, ok in zip(plain, argmax, valid):
                out[i] = (
                    t
                    if ok or requests[i].finished
                    else ValueError("the model's logits for this request contain NaN or inf")
                )
        for i, r in enumerate(requests):
            if out[i] is None:
                try:
                    out[i] = self._sample_one(r, logits[i : i + 1])
                except Exception as e:  # its processor, grammar or settings failed: this request alone
                    out[i] = e
        return out

    def _sample_one(self, r: Request, row: torch.Tensor) -> int:
        ids = torch.tensor([r.prompt + r.output], dtype=torch.long, device=row.device)  # (1, T)
        V = row.shape[-1]
        for proc in r.logits_processors:
            row = proc(ids, row)
            if not isinstance(row, torch.Tensor) or tuple(row.shape) != (1, V):
                raise ValueError(
                    f"logits processor {proc!r} returned {type(row).__name__} of shape "
                    f"{tuple(getattr(row, 'shape', ()))}; expected a tensor of shape (1, {V})"
                )
        return int(next_token(row, r.sampling, r.generator, ids if _penalised(r.sampling) else None)[0, 0])

    def _filled_slots(self) -> int:
        """Slots holding computed tokens in the blocks in use, a block shared by several requests once. Only
        full blocks are ever shared (the prefix cache hands out full blocks), so: the distinct full blocks,
        plus each request's part-full last block (per request, not per block: the step stays O(requests))."""
        full: set[int] = set()
        partial: list[tuple[int, int]] = []
        bs = self.block_size
        for r in self.scheduler.running:
            n_full = min(r.num_computed // bs, len(r.block_table))
            full.update(r.block_table[:n_full])
            if n_full < len(r.block_table) and r.num_computed > n_full * bs:
                partial.append((r.block_table[n_full], r.num_computed - n_full * bs))
        return bs * len(full) + sum(n for b, n in partial if b not in full)

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
        self.cache.release(r.request_id)
        if abort or reason == "error":
            self.scheduler.abort(r)
        else:
            self.scheduler.finish(r)
        if r.status != FINISHED:
            raise RuntimeError("request left in the scheduler after finishing")


def _penalised(s) -> bool:
    return s.repetition_penalty != 1.0 or bool(s.presence_penalty or s.frequency_penalty)
