"""An OpenAI-compatible HTTP server over the engine (chapter 14): `python -m helpers.serve`.

    POST /v1/completions        text in, text out (OpenAI's legacy completions), streamed or not
    POST /v1/chat/completions   messages in (chat_template.py turns them into one prompt), a reply out
    GET  /v1/models             the one model served
    GET  /health                200 while the engine thread is alive
    GET  /metrics               running / waiting requests, KV blocks used / free, tokens/s

What a server adds on top of the engine:
- one engine thread: the engine is not thread-safe, so HTTP handlers (on the asyncio event loop) send it
  commands through a queue and receive each new token through a per-request asyncio queue;
- streaming as server-sent events (`data: {json}` chunks, then `data: [DONE]`), with text held back
  while it could still turn out to be the start of a stop string or an incomplete UTF-8 character;
- cancellation: a client that disconnects cancels its request, and its KV blocks return to the pool;
- backpressure: at most `max_pending` requests in the engine (running or waiting); beyond that a new
  request gets 429 at once, so memory stays bounded however many clients connect;
- validation: OpenAI's parameter types and ranges, errors in OpenAI's JSON shape (openai_api.py);
  bodies over `max_body_bytes` are refused before they are read, and a prompt too long for the context
  window is refused before it is tokenized when its byte count alone proves it (a token is at most
  `tokenizer.max_token_bytes` bytes).

Semantics worth knowing: `presence_penalty` and `frequency_penalty` count generated tokens only (as OpenAI
and vLLM do), `seed` seeds choice i with seed + i, and `logprobs` are those of the model's raw
distribution (before penalties, temperature and top-p), as vLLM returns by default.

Left out: authentication, multiple models, request priorities, a separate detokenizer process,
prometheus-format metrics, and HTTP/2.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import queue
import threading
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from ..sampling import SamplingConfig, apply_penalties
from ..stopping import TextStop, cut_at_stop_string
from .chat_template import TURN_STOP, render_chat
from .openai_api import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingParams,
    chat_object,
    completion_object,
    error_body,
    new_id,
    usage,
)

MODEL_NAME = "course-target"


# --- the engine thread --------------------------------------------------------------------------------------
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
    """Owns the engine and runs it in one thread; everything else talks to it through `submit` / `cancel`."""

    def __init__(self, engine, max_pending: int = 64):
        self.engine, self.max_pending = engine, max_pending
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._listeners: dict[str, _Listener] = {}
        self._pending = 0  # requests accepted and not yet finished (read by handlers, so under the lock)
        self._lock = threading.Lock()
        self._stop = False
        self._recent: deque = deque()  # (time, tokens) of recent steps, for tokens/s
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
        """Take n places in the bounded queue, or raise 429 at once."""
        with self._lock:
            if self._pending + n > self.max_pending:
                raise APIError(429, f"the server is at capacity ({self.max_pending} requests in flight); "
                               "retry later", type="server_overloaded", code="queue_full")
            self._pending += n

    def release(self, n: int) -> None:
        with self._lock:
            self._pending -= n

    def submit(self, prompt_ids: list[int], kwargs: dict, logprobs: int | None,
               loop: asyncio.AbstractEventLoop) -> tuple[concurrent.futures.Future, asyncio.Queue]:
        """Queue one engine request; the future resolves to its id (or raises the engine's ValueError)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        events: asyncio.Queue = asyncio.Queue()
        self._commands.put(("submit", prompt_ids, kwargs, _Listener(loop, events, logprobs), future))
        self._wake.set()
        return future, events

    def cancel(self, request_id: str) -> None:
        self._commands.put(("cancel", request_id))
        self._wake.set()

    def metrics(self) -> dict:
        e = self.engine
        now = time.perf_counter()
        recent = [n for t, n in list(self._recent) if now - t <= 10.0]
        span = min(10.0, now - self.t0)
        return {"running": len(e.scheduler.running), "waiting": len(e.scheduler.waiting),
                "pending": self._pending, "max_pending": self.max_pending,
                "kv_blocks_total": e.pool.num_blocks, "kv_blocks_free": e.pool.num_free,
                "kv_blocks_used": e.pool.num_blocks - e.pool.num_free, "block_size": e.block_size,
                "tokens_per_s": sum(recent) / span if span > 0 else 0.0,
                "engine_alive": self.thread.is_alive()}

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
                rid = cmd[1]
                if rid in self._listeners:
                    self.engine.cancel(rid)
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
        listener.loop.call_soon_threadsafe(listener.events.put_nowait, event)
        if out.finished:
            self._forget(out.request_id)

    def _forget(self, rid: str) -> None:
        """Drop a finished request's bookkeeping, so a long-running server does not grow."""
        self._listeners.pop(rid, None)
        self.engine.requests.pop(rid, None)
        if len(self.engine.steps) > 4096:
            del self.engine.steps[:-1024]

    def _fail_all(self, message: str) -> None:
        for rid, listener in list(self._listeners.items()):
            try:
                self.engine.cancel(rid)
            except Exception:
                pass
            listener.loop.call_soon_threadsafe(listener.events.put_nowait,
                                               TokenEvent(None, True, "error", error=message))
            self._forget(rid)


def _capture(listener: _Listener):
    def capture(ids, logits):  # (1, T), (1, V)
        listener.captured.append(torch.log_softmax(logits[0].float(), dim=-1))
        return logits
    return capture


def _generated_only_penalties(prompt_len: int, presence: float, frequency: float):
    """OpenAI's presence and frequency penalties over generated tokens only (sampling.apply_penalties, which
    counts whatever ids it is given, gets the ids after the prompt)."""
    def penalise(ids, logits):  # (1, T), (1, V)
        return apply_penalties(logits, ids[:, prompt_len:], presence_penalty=presence, frequency_penalty=frequency)
    return penalise


# --- text, as it streams --------------------------------------------------------------------------
class ChoiceText:
    """One choice's generated ids and the part of their text that is safe to send.

    Text is held back while it may still be the start of a stop string (the last len(stop) - 1
    characters) or an incomplete UTF-8 character (a trailing U+FFFD); at the end the text is cut before
    the stop string that fired, as OpenAI does."""

    def __init__(self, tokenizer, stops: list[str]):
        self.tok, self.stops = tokenizer, stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0  # characters already sent

    def add(self, token: int | None) -> None:
        if token is not None:
            self.ids.append(token)

    def text(self) -> str:
        return self.tok.decode(self.ids)

    def delta(self, finished: bool) -> str:
        text = self.text()
        if finished:
            safe = cut_at_stop_string(text, self.stops) if self.stops else text
        else:
            safe = text.rstrip("\ufffd")
            safe = safe[:max(self.sent, len(safe) - self.hold)]
        out = safe[self.sent:]
        self.sent = max(self.sent, len(safe))
        return out


def finish_reason(engine_reason: str | None) -> str | None:
    if engine_reason is None:
        return None
    return "length" if engine_reason == "length" else "stop"


# --- the app ---------------------------------------------------------------------------------------
class _BodyLimit:
    """Refuse request bodies over `limit` bytes: by Content-Length before reading, else while reading."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await _send_json(send, 413, error_body(f"request body is {int(length):,} bytes; the limit is "
                                                          f"{self.limit:,}", code="body_too_large"))
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise APIError(413, f"request body over the limit of {self.limit:,} bytes",
                                   code="body_too_large")
            return message

        return await self.app(scope, limited, send)


async def _send_json(send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def create_app(model, tokenizer, *, num_blocks: int = 1024, block_size: int = 16, max_num_seqs: int = 32,
               max_pending: int = 64, max_body_bytes: int = 1 << 20, enable_prefix_caching: bool = True,
               model_name: str = MODEL_NAME) -> FastAPI:
    """The FastAPI app serving `model`; its engine thread starts and stops with the app."""
    from .engine import Engine

    engine = Engine(model, num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                    enable_prefix_caching=enable_prefix_caching)
    worker = EngineWorker(engine, max_pending=max_pending)
    ctx = model.cfg.max_seq_len
    max_token_bytes = max(len(tokenizer.decode_bytes([i])) for i in range(tokenizer.vocab_size))

    @asynccontextmanager
    async def lifespan(app):
        worker.start()
        yield
        worker.stop()

    app = FastAPI(title="LLM inference, executed: the course model behind OpenAI's API", lifespan=lifespan)
    app.state.worker, app.state.engine, app.state.model_name = worker, engine, model_name

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc: RequestValidationError):
        err = exc.errors()[0]
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if err.get("type") == "json_invalid":
            return JSONResponse(error_body(f"malformed JSON: {err.get('msg')}", None), status_code=400)
        if err.get("type") == "extra_forbidden":
            name = loc[-1] if loc else None
            message = f"unknown parameter {name!r}"
            if name in ("repetition_penalty", "top_k", "min_p"):
                message += (f": {name} is not an OpenAI parameter; send it as "
                            f'{{"extensions": {{"{name}": ...}}}}')
            return JSONResponse(error_body(message, name, code="unknown_parameter"), status_code=400)
        param = ".".join(x for x in loc if not x.isdigit() and not x.startswith(("str", "list", "int", "float")))
        return JSONResponse(error_body(f"{param or 'body'}: {err.get('msg')}", param or None), status_code=400)

    @app.get("/health")
    async def health():
        alive = worker.thread.is_alive()
        return JSONResponse({"status": "ok" if alive else "engine stopped"}, status_code=200 if alive else 503)

    @app.get("/metrics")
    async def metrics():
        return worker.metrics()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "llm-inference-executed"}]}

    def engine_requests(body: SamplingParams, prompt_text: str, extra_stops: list[str]) -> tuple[list[int], list]:
        """Tokenize and turn the body into the engine's keyword arguments, one set per choice."""
        if body.model != model_name:
            raise APIError(400, f"model {body.model!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found")
        if len(prompt_text.encode("utf-8")) > ctx * max_token_bytes:  # more tokens than the window, proven
            raise APIError(400, f"the prompt is longer than the context window of {ctx} tokens", param="prompt",
                           code="context_length_exceeded")
        prompt_ids = tokenizer.encode(prompt_text, bos=True)
        if len(prompt_ids) + body.max_tokens > ctx:
            raise APIError(400, f"prompt ({len(prompt_ids)} tokens) + max_tokens ({body.max_tokens}) exceeds the "
                           f"context window of {ctx} tokens", param="max_tokens", code="context_length_exceeded")
        ext = body.extensions
        sampling = SamplingConfig(temperature=body.temperature, top_p=body.top_p, top_k=ext.top_k,
                                  min_p=ext.min_p, repetition_penalty=ext.repetition_penalty)
        stops = body.stop_strings() + extra_stops
        choices = []
        for i in range(body.n):
            procs = []
            if body.presence_penalty or body.frequency_penalty:
                procs.append(_generated_only_penalties(len(prompt_ids), body.presence_penalty,
                                                       body.frequency_penalty))
            choices.append(dict(max_tokens=body.max_tokens, sampling=sampling,
                                seed=None if body.seed is None else body.seed + i,
                                eos_id=None if ext.ignore_eos else tokenizer.eos_id,
                                stop_criteria=[TextStop(tokenizer, stops)] if stops else [],
                                logits_processors=procs))
        return prompt_ids, choices

    async def start(prompt_ids, choices, logprobs):
        """Submit every choice; returns [(request_id, events)]. Releases its places if any is refused."""
        worker.reserve(len(choices))
        loop = asyncio.get_running_loop()
        started = []
        try:
            for kwargs in choices:
                future, events = worker.submit(prompt_ids, kwargs, logprobs, loop)
                started.append((await asyncio.wrap_future(future), events))
        except ValueError as e:
            for rid, _ in started:
                worker.cancel(rid)
            worker.release(len(choices))
            raise APIError(400, str(e), param="max_tokens" if "max_tokens" in str(e) else "prompt")
        except BaseException:
            for rid, _ in started:
                worker.cancel(rid)
            worker.release(len(choices))
            raise
        return started

    def logprobs_piece(events: list[TokenEvent], offset: int, texts: list[str]) -> dict:
        return {"tokens": texts, "token_logprobs": [e.logprob for e in events],
                "top_logprobs": [{tokenizer.decode([t]): v for t, v in (e.top_logprobs or {}).items()}
                                 for e in events] if events and events[0].top_logprobs is not None else None,
                "text_offset": [offset + sum(len(t) for t in texts[:k]) for k in range(len(texts))]}

    async def run(request: Request, body: SamplingParams, prompt_text: str, chat: bool, logprobs: int | None):
        prompt_ids, choices = engine_requests(body, prompt_text, [TURN_STOP] if chat else [])
        started = await start(prompt_ids, choices, logprobs)
        rid_out = new_id("chatcmpl" if chat else "cmpl")
        stops = body.stop_strings() + ([TURN_STOP] if chat else [])
        texts = [ChoiceText(tokenizer, stops) for _ in started]
        make = chat_object if chat else completion_object
        n_prompt = len(prompt_ids)

        async def cleanup(done: list[bool]):
            for (rid, _), finished in zip(started, done):
                if not finished:
                    worker.cancel(rid)
            worker.release(len(started))

        if body.stream:
            async def sse():
                done = [False] * len(started)
                try:
                    if chat:
                        for i in range(len(started)):
                            yield _sse(make(rid_out, model_name, [{"index": i, "delta": {"role": "assistant"},
                                                                   "finish_reason": None}], None, chunk=True))
                    getters = {asyncio.ensure_future(ev.get()): i for i, (_, ev) in enumerate(started)}
                    while getters:
                        finished_set, _ = await asyncio.wait(getters, return_when=asyncio.FIRST_COMPLETED)
                        for fut in finished_set:
                            i = getters.pop(fut)
                            event: TokenEvent = fut.result()
                            if event.error:
                                done[i] = True
                                yield _sse(error_body(f"generation failed: {event.error}", type="server_error"))
                                continue
                            texts[i].add(event.token)
                            done[i] = event.finished
                            delta = texts[i].delta(event.finished)
                            reason = finish_reason(event.finish_reason) if event.finished else None
                            if delta or reason or (logprobs is not None and event.token is not None):
                                if chat:
                                    choice = {"index": i, "delta": {"content": delta} if delta else {},
                                              "finish_reason": reason}
                                else:
                                    choice = {"index": i, "text": delta, "finish_reason": reason, "logprobs": None}
                                    if logprobs is not None and event.token is not None:
                                        tok_text = [tokenizer.decode([event.token])]
                                        choice["logprobs"] = logprobs_piece([event], texts[i].sent - len(delta),
                                                                            tok_text)
                                yield _sse(make(rid_out, model_name, [choice], None, chunk=True))
                            if not event.finished:
                                getters[asyncio.ensure_future(started[i][1].get())] = i
                    if body.stream_options is not None and body.stream_options.include_usage:
                        n_out = sum(len(t.ids) for t in texts)
                        yield _sse(make(rid_out, model_name, [], usage(n_prompt, n_out), chunk=True))
                    yield "data: [DONE]\n\n"
                finally:  # also when the client went away: cancel what is still running, free its blocks
                    for fut in list(locals().get("getters", {})):
                        fut.cancel()
                    await cleanup(done)

            return StreamingResponse(sse(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        done = [False] * len(started)
        reasons: list[str | None] = [None] * len(started)
        events_seen: list[list[TokenEvent]] = [[] for _ in started]
        try:
            for i, (rid, events) in enumerate(started):
                while not done[i]:
                    try:
                        event = await asyncio.wait_for(events.get(), timeout=0.25)
                    except asyncio.TimeoutError:
                        if await request.is_disconnected():
                            return JSONResponse(error_body("client disconnected"), status_code=499)
                        continue
                    if event.error:
                        raise APIError(500, f"generation failed: {event.error}", type="server_error")
                    texts[i].add(event.token)
                    if event.token is not None:
                        events_seen[i].append(event)
                    done[i], reasons[i] = event.finished, event.finish_reason
        finally:
            await cleanup(done)
        out_choices = []
        for i, t in enumerate(texts):
            text = t.delta(True)
            if chat:
                out_choices.append({"index": i, "message": {"role": "assistant", "content": text},
                                    "finish_reason": finish_reason(reasons[i])})
            else:
                lp = None
                if logprobs is not None:
                    kept = events_seen[i][:_tokens_within(tokenizer, t.ids, len(text))]
                    lp = logprobs_piece(kept, 0, [tokenizer.decode([e.token]) for e in kept])
                out_choices.append({"index": i, "text": text, "logprobs": lp,
                                    "finish_reason": finish_reason(reasons[i])})
        n_out = sum(len(t.ids) for t in texts)
        return make(rid_out, model_name, out_choices, usage(n_prompt, n_out))

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest):
        return await run(request, body, body.prompt, chat=False, logprobs=body.logprobs)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest):
        try:
            prompt = render_chat([m.model_dump() for m in body.messages])
        except ValueError as e:
            raise APIError(400, str(e), param="messages")
        return await run(request, body, prompt, chat=True, logprobs=None)

    if max_body_bytes:
        app.add_middleware(_BodyLimit, limit=max_body_bytes)
    return app


def _tokens_within(tokenizer, ids: list[int], n_chars: int) -> int:
    """How many of ids it takes to produce at least n_chars characters (the tokens a cut text keeps)."""
    for k in range(len(ids) + 1):
        if len(tokenizer.decode(ids[:k])) >= n_chars:
            return k if n_chars else 0
    return len(ids)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"
