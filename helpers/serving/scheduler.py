"""The scheduler: each step, which requests run and how many of their tokens, within a KV budget in blocks.

Iteration-level ("continuous") batching: the batch is rebuilt at every step. A request joins as soon
as blocks and the per-step token budget allow, and leaves the step after it finishes, so nobody waits
for the longest request of a batch.

One step, in the order of vLLM's scheduler:

1. running requests first, oldest first: each gets the tokens it still has to compute (1 when
   decoding; with chunked prefill at most what is left of `max_num_batched_tokens`). If its next
   block cannot be had, the newest running request is preempted (its blocks freed, recomputed later)
   until it can, possibly itself;
2. then waiting requests, first come first served, while there is room (`max_num_seqs`), budget and
   blocks: a prompt whose first blocks are in the prefix cache starts after them.

Without chunked prefill a prompt must fit the step's budget whole; a long one makes that step long,
and every running request waits for it (the inter-token latency spike chunking removes).

Liveness: the oldest running request is never preempted (victims are taken newest first and it alone
always fits, as `Engine.submit` refuses a request whose KV could not fit the pool), and it gets the
budget first, so every step computes at least one of its tokens. A request that is oldest stays so until
it ends, so `run()` ends within sum(prompt tokens + max_tokens) steps over all requests.

Fixed chunks (`fixed_chunk=n`, the engine's batch-invariant mode): a request's tokens are computed in the
same pieces whatever else runs, so its arithmetic never depends on its neighbours: its prompt in chunks
of n from position 0 (the last one ending at the prompt's end), then one token a step; a piece that does
not fit this step's budget waits for a later step instead of being cut. A preempted request replays the
same pieces (its generated tokens one a step again), so its recomputed keys and values are bit for bit
the ones it had.

static_scheduler.py holds the baseline continuous batching replaces (`policy="static"`).

Out of scope (vLLM has them): priorities and fairness, swapping to CPU instead of recompute, a free-block
watermark, lookahead slots for speculative decoding, structured-output and LoRA-aware admission,
waiting for remote KV (disaggregated prefill), and async scheduling overlapped with the forward pass.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .block_pool import ROOT_HASH, BlockPool, block_hash
from .request import FINISHED, RUNNING, WAITING, Request


@dataclass
class ScheduledChunk:
    request: Request
    num_tokens: int  # tokens computed for it this step


class Scheduler:
    """Continuous batching. The engine builds its requests as `request_type` (the static baseline's differ)."""

    request_type = Request

    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        chunked_prefill: bool = True,
        fixed_chunk: int | None = None,
    ):
        self.pool, self.block_size = pool, block_size
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.fixed_chunk = fixed_chunk  # None, or the prompt chunk of the batch-invariant mode
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last one is preempted first
        self.num_preemptions = 0
        self.recomputed_tokens = 0  # tokens whose KV preemption threw away (each is computed again later)

    def add(self, r: Request) -> None:
        self.waiting.append(r)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one step -------------------------------------------------------------------------------
    def schedule(self) -> list[ScheduledChunk]:
        out, budget, preempted = self._schedule_running(self.max_num_batched_tokens)
        if not preempted:  # a step that had to preempt admits nobody (vLLM's rule)
            out += self._admit(budget)
        return out

    def _schedule_running(self, budget: int) -> tuple[list[ScheduledChunk], int, bool]:
        out: list[ScheduledChunk] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            n = self._tokens_to_compute(r, budget)
            if n == 0:
                i += 1
                continue
            need = r.blocks_for(r.num_computed + n, self.block_size) - len(r.block_table)
            while need > self.pool.num_free:
                victim = self.running[-1]  # newest first: never one scheduled earlier in this loop
                self.preempt(victim)
                preempted = True
                if victim is r:
                    break
            if r.status != RUNNING:
                break  # it preempted itself: everything after it is gone too
            r.block_table += self.pool.allocate(need)
            out.append(ScheduledChunk(r, n))
            budget -= n
            i += 1
        return out, budget, preempted

    def _admit(self, budget: int) -> list[ScheduledChunk]:
        """Waiting requests, first come first served, while places, budget and blocks allow."""
        out: list[ScheduledChunk] = []
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            r = self.waiting[0]
            n_hit, hit_blocks_free = self._peek_prefix(r)
            computed = n_hit * self.block_size
            n = r.num_tokens - computed
            if self.fixed_chunk is not None:
                n = self._fixed_piece(r, computed)
                if n > budget:
                    break
            elif self.chunked_prefill:
                n = min(n, budget)
            elif n > budget:
                break
            if not self._take(r, n_hit, hit_blocks_free, n):
                break
            out.append(ScheduledChunk(r, n))
            budget -= n
        return out

    def _take(self, r: Request, n_hit: int, hit_blocks_free: int, n: int) -> bool:
        """Move r from waiting to running with blocks for its cached prefix and n more tokens, if they fit."""
        computed = n_hit * self.block_size
        need = r.blocks_for(computed + n, self.block_size) - n_hit
        if need > self.pool.num_free - hit_blocks_free:
            return False
        self.waiting.popleft()
        hits = self.pool.lookup(r.block_hashes[:n_hit]) if n_hit else []
        r.block_table = hits + self.pool.allocate(need)
        r.num_computed = computed
        r.num_cached_tokens = max(r.num_cached_tokens, computed)
        r.status = RUNNING
        self.running.append(r)
        return True

    def _tokens_to_compute(self, r: Request, budget: int) -> int:
        left = r.num_tokens - r.num_computed  # 1 when decoding; more while (re)prefilling
        if self.fixed_chunk is not None:
            n = self._fixed_piece(r, r.num_computed)
            return n if n <= budget else 0
        if self.chunked_prefill:
            return min(left, budget)
        return left if left <= budget else 0

    def _fixed_piece(self, r: Request, computed: int) -> int:
        """The next piece of r in the fixed-chunk order: a prompt chunk (chunk boundaries at multiples of
        fixed_chunk, the last at the prompt's end), or one token past the prompt."""
        in_prompt = len(r.prompt) - computed
        return min(self.fixed_chunk, in_prompt) if in_prompt > 0 else 1

    def _peek_prefix(self, r: Request) -> tuple[int, int]:
        """(cached full blocks at the start of r's tokens, how many of them are free now). At least one
        token is always left to compute: the last one's logits give the next token."""
        if not self.pool.enable_prefix_caching:
            return 0, 0
        self._extend_hashes(r, r.num_tokens // self.block_size)
        usable = (r.num_tokens - 1) // self.block_size
        n_hit, n_free = 0, 0
        for h in r.block_hashes[:usable]:
            b = self.pool.cached.get(h)
            if b is None:
                break
            n_hit += 1
            n_free += self.pool.ref_count[b] == 0
        return n_hit, n_free

    # --- after the forward pass -------------------------------------------------------------------
    def register_full_blocks(self, r: Request) -> None:
        """Give every block of r that is now full of computed tokens its chained hash (prefix caching)."""
        if not self.pool.enable_prefix_caching:
            return
        full = min(r.num_computed // self.block_size, len(r.block_table))
        self._extend_hashes(r, full)
        for j in range(full):
            self.pool.register(r.block_table[j], r.block_hashes[j])

    def _extend_hashes(self, r: Request, n_blocks: int) -> None:
        """Chained hashes of r's first n_blocks full blocks (computed once, then extended)."""
        bs, ids = self.block_size, None
        while len(r.block_hashes) < n_blocks:
            ids = r.all_ids if ids is None else ids
            j = len(r.block_hashes)
            parent = r.block_hashes[-1] if r.block_hashes else ROOT_HASH
            r.block_hashes.append(block_hash(parent, ids[j * bs : (j + 1) * bs]))

    def preempt(self, r: Request) -> None:
        """Take r's blocks back; it waits at the front of the queue and recomputes its tokens later."""
        self.running.remove(r)
        self.pool.release(r.block_table)
        self.recomputed_tokens += r.num_computed
        r.block_table, r.num_computed, r.status = [], 0, WAITING
        r.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(r)

    def finish(self, r: Request) -> None:
        """r has stopped: free its blocks."""
        self._remove(r)

    def abort(self, r: Request) -> None:
        """Drop r now, wherever it is (cancel, or an error in its own sampling or stop criterion)."""
        self._remove(r)

    def discard(self, r: Request, token: int) -> None:
        """A token sampled for a request that had already finished: continuous batching never computes one."""
        raise RuntimeError(f"request {r.request_id} was scheduled after it finished")

    def _remove(self, r: Request) -> None:
        if r in self.running:
            self.running.remove(r)
            self.pool.release(r.block_table)
        elif r in self.waiting:
            self.waiting.remove(r)
        r.block_table = []
        r.status = FINISHED
