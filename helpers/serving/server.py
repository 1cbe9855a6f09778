"""An OpenAI-compatible HTTP server over the engine (chapter 14): `python -m helpers.serving`.

    POST /v1/completions        text in, text out (OpenAI's legacy completions), streamed or not
    POST /v1/chat/completions   messages in (chat_template.py turns them into one prompt), a reply out
    GET  /v1/models             the one model served
    GET  /health                200 while the engine thread is alive
    GET  /metrics               running / waiting requests, KV blocks, tokens/s, cancellations, memory

What a server adds on top of the engine, and where it lives:
- one engine thread (worker.py): the engine is not thread-safe, so handlers send it commands;
- the endpoints' work (completions.py): tokenize, one engine request per choice, streaming as server-sent
  events, and cancellation the moment a client hangs up, streamed or not;
- backpressure: at most `max_pending` requests in the engine (running or waiting); beyond that a new
  request gets 429 at once, and one with `n` above `max_pending` gets 400 (it could never run);
- errors, all in OpenAI's shape (openai_api.py), with `param` naming the field the client sent: 400
  for a body that is not UTF-8, not JSON, or holds a bad value; 404 and 405 for a wrong path or method;
  413 for a body over `max_body_bytes`, refused by its Content-Length before it is read, or, sent in
  chunks, as soon as it passes the limit (read no further); 429 for a full queue; 500 only for a bug.

Left out: authentication, multiple models, request priorities, a separate detokenizer process,
prometheus-format metrics, and HTTP/2.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from .chat_template import render_chat
from .completions import Completions
from .engine import Engine
from .openai_api import APIError, ChatCompletionRequest, CompletionRequest, error_body, parse_body
from .worker import EngineWorker

MODEL_NAME = "course-target"


def create_app(
    model,
    tokenizer,
    *,
    num_blocks: int = 1024,
    block_size: int = 16,
    max_num_seqs: int = 32,
    max_pending: int = 64,
    max_body_bytes: int = 1 << 20,
    enable_prefix_caching: bool = True,
    model_name: str = MODEL_NAME,
    compile_step: bool | str = False,
) -> FastAPI:
    """The FastAPI app serving `model`; its engine thread starts and stops with the app. compile_step: the
    engine's compiled decode step (Engine's docstring; the command line turns it on)."""
    engine = Engine(
        model,
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=enable_prefix_caching,
        step_log=1024,
        compile_step=compile_step,
    )
    worker = EngineWorker(engine, max_pending=max_pending)
    completions = Completions(worker, tokenizer, model_name, model.cfg.max_seq_len)

    @asynccontextmanager
    async def lifespan(app):
        worker.start()
        yield
        worker.stop()

    app = FastAPI(title="LLM inference, executed: the course model behind OpenAI's API", lifespan=lifespan)
    app.state.worker, app.state.engine, app.state.completions = worker, engine, completions
    app.state.model_name = model_name
    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, server_error)

    @app.get("/health")
    async def health():
        alive = worker.thread.is_alive()
        return JSONResponse({"status": "ok" if alive else "engine stopped"}, status_code=200 if alive else 503)

    @app.get("/metrics")
    async def metrics():
        return worker.metrics()

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "llm-inference-executed"}],
        }

    @app.post("/v1/completions")
    async def complete(request: Request):
        body = parse_body(await read_body(request, max_body_bytes), CompletionRequest)
        return await completions.respond(request, body, body.prompt, chat=False, logprobs=body.logprobs)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = parse_body(await read_body(request, max_body_bytes), ChatCompletionRequest)
        try:
            prompt = render_chat([m.model_dump() for m in body.messages])
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from None
        return await completions.respond(request, body, prompt, chat=True, logprobs=None)

    return app


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or a 413 as soon as it is known to pass `limit` bytes: from Content-Length before
    reading anything, else (a chunked body) at the chunk that passes it, without reading the rest."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise APIError(413, f"request body is {int(length):,} bytes; the limit is {limit:,}", code="body_too_large")
    parts, seen = [], 0
    async for part in request.stream():
        seen += len(part)
        if seen > limit:
            raise APIError(413, f"request body over the limit of {limit:,} bytes", code="body_too_large")
        parts.append(part)
    return b"".join(parts)


async def api_error(request, exc: APIError):
    # a full queue frees within a few decode steps: clients that honour Retry-After (OpenAI's SDK does) wait 1 s
    headers = {"Retry-After": "1"} if exc.status == 429 else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def http_error(request, exc: HTTPException):
    """Starlette's own errors (no such route, wrong method) in OpenAI's shape."""
    messages = {
        404: f"no such endpoint: {request.method} {request.url.path}",
        405: f"{request.method} is not allowed on {request.url.path}",
    }
    body = error_body(
        messages.get(exc.status_code, str(exc.detail)),
        code={404: "not_found", 405: "method_not_allowed"}.get(exc.status_code),
    )
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def server_error(request, exc: Exception):
    """A bug: still OpenAI's shape, never a traceback."""
    return JSONResponse(error_body(f"internal error: {type(exc).__name__}", type="server_error"), status_code=500)
