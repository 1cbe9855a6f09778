"""The engine thread: owns the engine, steps it, and hands each new token to the request's HTTP handler.

The engine is not thread-safe, so HTTP handlers (on the asyncio event loop) never touch it: they send
commands (submit, cancel) through a queue, and receive each new token through a per-request asyncio
queue. The thread drains the commands before every step, so a cancel takes effect within one step.

Per-request failures stay per request (the engine isolates them: finish_reason "error"); only a failure
of a whole step, a bug, fails every request in flight, and the thread keeps serving.

    worker = EngineWorker(engine, max_pending=64)
    worker.start()
    worker.reserve(n)                                     # n places in the bounded queue, or 429 / 400
    future, events = worker.submit(prompt_ids, kwargs, logprobs=None, loop=loop)
    worker.cancel(request_id, seen_at=time.perf_counter())   # the client hung up
    worker.metrics()                                       # /metrics: the engine's stats and the server's

Left out: several engine threads (data parallelism), priorities between requests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from .openai_api import APIError


@dataclass
class TokenEvent:
    """One new token of one request, sent from the engine thread to the request's handler."""

    token: int | None  # None when the request ended without a new token (cancelled, failed)
    finished: bool
    finish_reason: str | None
    logprob: float | None = None
    top_logprobs: dict[int, float] | None = None
    error: str | None = None


@dataclass
class _Listener:
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    logprobs: int | None
    captured: list = field(default_factory=list)  # raw log-softmax rows, one per sampled token


class EngineWorker:
    """Owns the engine and runs it in one thread; everything else talks to it through submit / cancel."""

    def __init__(self, engine, max_pending: int = 64):
        self.engine, self.max_pending = engine, max_pending
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._listeners: dict[str, _Listener] = {}
        self._pending = 0  # requests accepted and not yet finished (read by handlers, so under the lock)
        self._lock = threading.Lock()
        self._stop = False
        self._recent: deque = deque()  # (time, tokens) of recent steps, for tokens/s
        self.cancel_seconds: deque = deque(maxlen=256)  # hang-up seen -> blocks freed, per cancelled request
        self.num_hangups = 0  # requests cancelled because their client went away
        self.t0 = time.perf_counter()
        self.thread = threading.Thread(target=self._run, name="engine", daemon=True)

    # called from the event loop -------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self.thread.join(timeout=10)

    def reserve(self, n: int) -> None:
        """Take n places in the bounded queue: a 400 if n could never fit, a 429 at once if it is full now."""
        if n > self.max_pending:
            raise APIError(
                400,
                f"n ({n}) is more than this server ever runs at once ({self.max_pending} requests)",
                param="n",
                code="n_too_large",
            )
        with self._lock:
            if self._pending + n > self.max_pending:
                raise APIError(
                    429,
                    f"the server is at capacity ({self.max_pending} requests in flight); retry later",
                    type="server_overloaded",
                    code="queue_full",
                )
            self._pending += n

    def release(self, n: int) -> None:
        with self._lock:
            self._pending -= n

    def submit(
        self, prompt_ids: list[int], kwargs: dict, logprobs: int | None, loop: asyncio.AbstractEventLoop
    ) -> tuple[concurrent.futures.Future, asyncio.Queue]:
        """Queue one engine request; the future resolves to its id (or raises the engine's InvalidParameter)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        events: asyncio.Queue = asyncio.Queue()
        self._commands.put(("submit", prompt_ids, kwargs, _Listener(loop, events, logprobs), future))
        self._wake.set()
        return future, events

    def cancel(self, request_id: str, seen_at: float | None = None) -> None:
        """Cancel a request (no-op once it has finished). seen_at: when the hang-up that caused it was seen
        (time.perf_counter()), to measure how long its blocks took to come back."""
        self._commands.put(("cancel", request_id, seen_at))
        self._wake.set()

    def in_flight(self) -> list[str]:
        return list(self._listeners)

    def metrics(self) -> dict:
        now = time.perf_counter()
        recent = [n for t, n in list(self._recent) if now - t <= 10.0]
        span = min(10.0, now - self.t0)
        return {
            **self.engine.stats(),
            "pending": self._pending,
            "max_pending": self.max_pending,
            "tokens_per_s": sum(recent) / span if span > 0 else 0.0,
            "engine_alive": self.thread.is_alive(),
            "hangups": self.num_hangups,  # requests cancelled because their client went away, and the last
            "cancel_ms": [round(x * 1e3, 2) for x in list(self.cancel_seconds)[-32:]],  # 32: hang-up -> freed
            **process_memory(),
        }

    # inside the engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            self._drain_commands()
            if self.engine.has_unfinished():
                self.engine.advance_to(time.perf_counter() - self.t0)  # the engine's clock on the wall clock
                try:
                    outputs = self.engine.step()
                except Exception as e:  # a bug, not a request's fault: fail everything in flight, keep serving
                    self._fail_all(f"engine step failed: {type(e).__name__}: {e}")
                    continue
                self._recent.append((time.perf_counter(), sum(len(o.new_token_ids) for o in outputs)))
                while self._recent and time.perf_counter() - self._recent[0][0] > 10.0:
                    self._recent.popleft()
                for out in outputs:
                    self._deliver(out)
            else:
                self._wake.wait(0.05)
                self._wake.clear()

    def _drain_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "submit":
                _, prompt_ids, kwargs, listener, future = cmd
                procs = list(kwargs.pop("logits_processors", ()))
                if listener.logprobs is not None:
                    procs.insert(0, _capture(listener))  # first: sees the model's raw logits
                try:
                    rid = self.engine.submit(prompt_ids, logits_processors=procs, **kwargs)
                except ValueError as e:
                    future.set_exception(e)
                    continue
                self._listeners[rid] = listener
                future.set_result(rid)
            elif cmd[0] == "cancel":
                _, rid, seen_at = cmd
                listener = self._listeners.get(rid)
                if listener is None:
                    continue  # finished already
                self.engine.cancel(rid)  # its blocks are back in the pool when this returns
                if seen_at is not None:
                    self.cancel_seconds.append(time.perf_counter() - seen_at)
                    self.num_hangups += 1
                self._put(listener, TokenEvent(None, True, "cancelled"))  # for a handler still waiting
                self._forget(rid)

    def _deliver(self, out) -> None:
        listener = self._listeners.get(out.request_id)
        if listener is None:
            return
        event = TokenEvent(out.new_token_ids[0] if out.new_token_ids else None, out.finished, out.finish_reason)
        if out.finish_reason == "error":
            err = self.engine.get(out.request_id).error
            event.error = f"{type(err).__name__}: {err}"
        if listener.logprobs is not None and listener.captured and event.token is not None:
            row = listener.captured.pop()
            listener.captured.clear()
            event.logprob = float(row[event.token])
            if listener.logprobs > 0:
                top = torch.topk(row, listener.logprobs)
                event.top_logprobs = {int(i): float(v) for v, i in zip(top.values, top.indices)}
        self._put(listener, event)
        if out.finished:
            self._forget(out.request_id)

    @staticmethod
    def _put(listener: _Listener, event: TokenEvent) -> None:
        try:
            listener.loop.call_soon_threadsafe(listener.events.put_nowait, event)
        except RuntimeError:  # the event loop has closed (the server is shutting down)
            pass

    def _forget(self, rid: str) -> None:
        """Drop a finished request's bookkeeping, so a long-running server does not grow."""
        self._listeners.pop(rid, None)
        self.engine.forget(rid)

    def _fail_all(self, message: str) -> None:
        for rid, listener in list(self._listeners.items()):
            self._put(listener, TokenEvent(None, True, "error", error=message))
            self._listeners.pop(rid, None)
            try:
                self.engine.cancel(rid)
                self.engine.forget(rid)
            except Exception:  # the engine is in a state a bug left it in: keep serving the next requests
                pass


def _capture(listener: _Listener):
    def capture(ids, logits):  # (1, T), (1, V)
        listener.captured.append(torch.log_softmax(logits[0].float(), dim=-1))
        return logits

    return capture


def process_memory() -> dict:
    """This process's resident memory now and at its peak, in bytes (None where the OS does not say)."""
    try:
        import resource  # not on Windows

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    except ImportError:
        peak = None
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        rss = None
    return {"rss_bytes": rss, "peak_rss_bytes": peak}
