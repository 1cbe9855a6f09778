"""Static batching: the baseline continuous batching replaces (`Engine(..., policy="static")`).

A batch is admitted only when the last one has completely finished, and a finished request's row keeps
running, its tokens thrown away into `request.padded`, until the longest request of its batch is done,
as a padded (B, T) batch would. Each step computes every row of the batch (prompts whole, no token
budget), which is what makes it cost more than continuous batching for the same outputs.

Rules that keep it live on a tight pool (a padded row once preempted a live one, then itself, and was
put back in the queue needing more blocks than the pool had, so `run()` never returned):

- live rows are scheduled first, oldest first; padded rows after them, with free blocks only;
- a live row that needs a block takes it from padded rows first (they stop early: their tokens would
  be thrown away anyway), then from newer live rows (preempted, recomputed in a later batch);
- a padded row is never preempted back into the queue: without a free block, or at the context
  window, it simply stops;
- the batch is over when no live row is left; its padded rows are released at once.

So the oldest live row always fits and computes a token every step, and `run()` ends within the same
bound as continuous batching: sum(prompt tokens + max_tokens) steps.

Left out: padding prompts to a common length (the rows' prompts are computed at their own lengths; only
the decode phase is padded), which changes the cost but not the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .request import FINISHED, RUNNING, Request
from .scheduler import ScheduledChunk, Scheduler


@dataclass
class PaddedRequest(Request):
    """A request in a static batch: after it finishes, its row may keep running as padding."""

    padding: bool = False  # finished, but its row keeps running until the batch ends
    padded: list[int] = field(default_factory=list)  # the tokens such a row computes after it finished

    @property
    def all_ids(self) -> list[int]:
        return self.prompt + self.output + self.padded

    def ids(self, start: int, end: int) -> list[int]:
        return self.all_ids[start:end]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output) + len(self.padded)


class StaticScheduler(Scheduler):
    request_type = PaddedRequest

    def __init__(
        self,
        pool,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        chunked_prefill: bool = True,
        context_limit: int = 1 << 62,
    ):
        super().__init__(pool, block_size, max_num_seqs, max_num_batched_tokens, chunked_prefill)
        self.context_limit = context_limit  # a padded row stops here: it has no window left to grow into

    def schedule(self) -> list[ScheduledChunk]:
        self._end_batch_if_over()
        if not self.running:
            return self._admit_batch()
        out: list[ScheduledChunk] = []
        for r in [o for o in self.running if not o.padding]:  # oldest first
            if r.status != RUNNING:
                continue  # preempted below to make room for an older row
            n = r.num_tokens - r.num_computed
            if not self._make_room(r, r.blocks_for(r.num_computed + n, self.block_size) - len(r.block_table)):
                break  # it had to preempt itself: every newer live row is gone too
            out.append(ScheduledChunk(r, n))
        for r in [o for o in self.running if o.padding]:
            need = r.blocks_for(r.num_computed + 1, self.block_size) - len(r.block_table)
            if r.num_tokens >= self.context_limit or need > self.pool.num_free:
                self._remove(r)  # padding stops early; it never waits for blocks or re-queues
                continue
            r.block_table += self.pool.allocate(need)
            out.append(ScheduledChunk(r, 1))
        self._end_batch_if_over()
        return out

    def _make_room(self, r: PaddedRequest, need: int) -> bool:
        """Allocate `need` blocks for live row r: padded rows go first, then newer live rows, then r itself."""
        while need > self.pool.num_free:
            padded = [o for o in self.running if o.padding]
            if padded:
                self._remove(padded[-1])
                continue
            victim = self.running[-1]  # the newest live row (rows older than r are never after it)
            self.preempt(victim)
            if victim is r:
                return False
        r.block_table += self.pool.allocate(need)
        return True

    def _admit_batch(self) -> list[ScheduledChunk]:
        """A new batch: waiting requests in order, whole prompts, while places and blocks allow."""
        out: list[ScheduledChunk] = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            r = self.waiting[0]
            n_hit, hit_blocks_free = self._peek_prefix(r)
            n = r.num_tokens - n_hit * self.block_size
            if not self._take(r, n_hit, hit_blocks_free, n):
                break
            out.append(ScheduledChunk(r, n))
        return out

    def _end_batch_if_over(self) -> None:
        if self.running and all(o.padding for o in self.running):
            for o in list(self.running):
                self._remove(o)

    def finish(self, r: PaddedRequest) -> None:
        """r has stopped: its row runs on as padding while a live row of its batch remains."""
        if r in self.running and any(not o.padding and o is not r for o in self.running):
            r.padding, r.status = True, FINISHED
            return
        self._remove(r)
        self._end_batch_if_over()

    def abort(self, r: PaddedRequest) -> None:
        self._remove(r)
        self._end_batch_if_over()

    def discard(self, r: PaddedRequest, token: int) -> None:
        r.padded.append(token)

    def _remove(self, r: PaddedRequest) -> None:
        super()._remove(r)
        r.padding = False
