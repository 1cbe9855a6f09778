"""The completion endpoints' work: a validated body in, the engine's tokens out as text, plain or streamed.

    completions = Completions(worker, tokenizer, model_name, context_window)
    await completions.respond(request, body, prompt_text, chat=False, logprobs=None)

For each request: tokenize, turn the body into one engine request per choice (`engine_requests`, also
what the soak test uses to replay a request through an engine alone), take places in the bounded queue,
submit, then either stream server-sent events or collect the whole answer. Text is held back while it
could still turn out to be the start of a stop string or half a UTF-8 character (ChoiceText).

Hanging up: a task waits for the connection's `http.disconnect` for as long as the request runs, for
streamed and plain requests alike, and cancels every choice the moment it arrives: the engine thread
frees their blocks before its next step.

Semantics worth knowing: `presence_penalty` and `frequency_penalty` count generated tokens only (as OpenAI
and vLLM do), `seed` seeds choice i with seed + i, `logprobs` are those of the model's raw distribution
(before penalties, temperature and top-p), as vLLM returns by default, and a temperature in (0, 1e-5)
is greedy (the engine's rule).

Left out: `best_of`, `echo`, `suffix`, `logit_bias`, tool calls.
"""

from __future__ import annotations

import asyncio
import json
import time

from fastapi.responses import JSONResponse, StreamingResponse

from ..sampling import SamplingConfig, apply_penalties, validate_sampling
from ..stopping import TextStop, cut_at_stop_string
from .chat_template import TURN_STOP
from .openai_api import APIError, SamplingParams, chat_object, completion_object, error_body, new_id, usage
from .params import InvalidParameter
from .worker import EngineWorker, TokenEvent

CLIENT_FIELDS = ("max_tokens", "seed")  # engine parameters a client sets under the same name


class Completions:
    def __init__(self, worker: EngineWorker, tokenizer, model_name: str, context_window: int):
        self.worker, self.tok, self.model_name, self.ctx = worker, tokenizer, model_name, context_window
        self.max_token_bytes = max(len(tokenizer.decode_bytes([i])) for i in range(tokenizer.vocab_size))

    # --- the body -> engine requests ---------------------------------------------------------------
    def engine_requests(
        self, body: SamplingParams, prompt_text: str, prompt_field: str, extra_stops: list[str]
    ) -> tuple[list[int], list[dict]]:
        """Tokenize and turn the body into the engine's keyword arguments, one set per choice."""
        if body.model != self.model_name:
            raise APIError(
                400,
                f"model {body.model!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )
        if len(prompt_text.encode("utf-8")) > self.ctx * self.max_token_bytes:  # more tokens than the window
            raise APIError(
                400,
                f"the prompt is longer than the context window of {self.ctx} tokens",
                param=prompt_field,
                code="context_length_exceeded",
            )
        prompt_ids = self.tok.encode(prompt_text, bos=True)
        ext = body.extensions
        sampling = sampling_config(
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=ext.top_k,
            min_p=ext.min_p,
            repetition_penalty=ext.repetition_penalty,
        )
        stops = body.stop_strings() + extra_stops
        choices = []
        for i in range(body.n):
            procs = []
            if body.presence_penalty or body.frequency_penalty:
                procs.append(generated_only_penalties(len(prompt_ids), body.presence_penalty, body.frequency_penalty))
            choices.append(
                dict(
                    max_tokens=body.max_tokens,
                    sampling=sampling,
                    seed=None if body.seed is None else body.seed + i,
                    eos_id=None if ext.ignore_eos else self.tok.eos_id,
                    stop_criteria=[TextStop(self.tok, stops)] if stops else [],
                    logits_processors=procs,
                )
            )
        return prompt_ids, choices

    async def _start(self, prompt_ids, choices, logprobs, prompt_field: str) -> list[tuple[str, asyncio.Queue]]:
        """Submit every choice; returns [(request_id, events)]. Releases its places if any is refused."""
        self.worker.reserve(len(choices))
        loop = asyncio.get_running_loop()
        started = []
        try:
            for kwargs in choices:
                future, events = self.worker.submit(prompt_ids, kwargs, logprobs, loop)
                started.append((await asyncio.wrap_future(future), events))
        except BaseException as e:
            for rid, _ in started:
                self.worker.cancel(rid)
            self.worker.release(len(choices))
            if isinstance(e, InvalidParameter) and e.param in ("prompt", *CLIENT_FIELDS):
                code = "context_length_exceeded" if "context window" in str(e) or "KV blocks" in str(e) else None
                raise APIError(400, str(e), param=prompt_field if e.param == "prompt" else e.param, code=code) from None
            raise
        return started

    # --- responding --------------------------------------------------------------------------------
    async def respond(self, request, body: SamplingParams, prompt_text: str, chat: bool, logprobs: int | None):
        prompt_field = "messages" if chat else "prompt"
        prompt_ids, choices = self.engine_requests(body, prompt_text, prompt_field, [TURN_STOP] if chat else [])
        started = await self._start(prompt_ids, choices, logprobs, prompt_field)
        run = _Run(self, body, started, chat, logprobs, len(prompt_ids))
        watcher = asyncio.create_task(run.cancel_on_disconnect(request.receive))
        if body.stream:
            return StreamingResponse(
                run.stream(watcher),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await run.collect(watcher)


class _Run:
    """One HTTP request's choices while they run: their events, their text, and their cleanup."""

    def __init__(self, owner: Completions, body: SamplingParams, started, chat: bool, logprobs, n_prompt: int):
        self.owner, self.body, self.started, self.chat, self.logprobs = owner, body, started, chat, logprobs
        stops = body.stop_strings() + ([TURN_STOP] if chat else [])
        self.texts = [ChoiceText(owner.tok, stops) for _ in started]
        self.done = [False] * len(started)
        self.rid = new_id("chatcmpl" if chat else "cmpl")
        self.make = chat_object if chat else completion_object
        self.n_prompt = n_prompt
        self.hung_up = False

    async def cancel_on_disconnect(self, receive) -> None:
        """Wait for the client to go away; then cancel every choice still running, at once."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self.hung_up = True
        self.cancel_unfinished(time.perf_counter())

    def cancel_unfinished(self, seen_at: float | None = None) -> None:
        for (rid, _), finished in zip(self.started, self.done):
            if not finished:
                self.owner.worker.cancel(rid, seen_at)

    def close(self, watcher: asyncio.Task) -> None:
        watcher.cancel()
        self.cancel_unfinished(None if self.hung_up else time.perf_counter())
        self.owner.worker.release(len(self.started))

    def chunk(self, choices: list[dict], usage_: dict | None = None) -> str:
        return f"data: {json.dumps(self.make(self.rid, self.owner.model_name, choices, usage_, chunk=True))}\n\n"

    async def stream(self, watcher: asyncio.Task):
        tok, logprobs = self.owner.tok, self.logprobs
        try:
            if self.chat:
                for i in range(len(self.started)):
                    yield self.chunk([{"index": i, "delta": {"role": "assistant"}, "finish_reason": None}])
            getters = {asyncio.ensure_future(ev.get()): i for i, (_, ev) in enumerate(self.started)}
            try:
                while getters:
                    ready, _ = await asyncio.wait(getters, return_when=asyncio.FIRST_COMPLETED)
                    for fut in ready:
                        i = getters.pop(fut)
                        event: TokenEvent = fut.result()
                        self.done[i] = event.finished
                        if event.error or event.finish_reason == "cancelled":
                            yield f"data: {json.dumps(event_error(event).body())}\n\n"
                            continue
                        text = self.texts[i]
                        text.add(event.token)
                        delta = text.delta(event.finished)
                        reason = finish_reason(event.finish_reason) if event.finished else None
                        if delta or reason or (logprobs is not None and event.token is not None):
                            if self.chat:
                                choice = {
                                    "index": i,
                                    "delta": {"content": delta} if delta else {},
                                    "finish_reason": reason,
                                }
                            else:
                                choice = {"index": i, "text": delta, "finish_reason": reason, "logprobs": None}
                                if logprobs is not None and event.token is not None:
                                    choice["logprobs"] = logprobs_piece(
                                        tok, [event], text.sent - len(delta), [tok.decode([event.token])]
                                    )
                            yield self.chunk([choice])
                        if not event.finished:
                            getters[asyncio.ensure_future(self.started[i][1].get())] = i
            finally:
                for fut in getters:
                    fut.cancel()
            if self.body.stream_options is not None and self.body.stream_options.include_usage:
                yield self.chunk([], usage(self.n_prompt, sum(len(t.ids) for t in self.texts)))
            yield "data: [DONE]\n\n"
        finally:  # also when the client went away: cancel what is still running, free its blocks
            self.close(watcher)

    async def collect(self, watcher: asyncio.Task):
        reasons: list[str | None] = [None] * len(self.started)
        seen: list[list[TokenEvent]] = [[] for _ in self.started]
        try:
            for i, (_, events) in enumerate(self.started):
                while not self.done[i]:
                    event = await events.get()
                    if self.hung_up:
                        return JSONResponse(error_body("client disconnected"), status_code=499)
                    if event.error or event.finish_reason == "cancelled":
                        raise event_error(event)
                    self.texts[i].add(event.token)
                    if event.token is not None:
                        seen[i].append(event)
                    self.done[i], reasons[i] = event.finished, event.finish_reason
        finally:
            self.close(watcher)
        tok, out = self.owner.tok, []
        for i, t in enumerate(self.texts):
            text = t.delta(True)
            if self.chat:
                out.append(
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": finish_reason(reasons[i]),
                    }
                )
                continue
            lp = None
            if self.logprobs is not None:
                kept = seen[i][: _tokens_within(tok, t.ids, len(text))]
                lp = logprobs_piece(tok, kept, 0, [tok.decode([e.token]) for e in kept])
            out.append({"index": i, "text": text, "logprobs": lp, "finish_reason": finish_reason(reasons[i])})
        n_out = sum(len(t.ids) for t in self.texts)
        return self.make(self.rid, self.owner.model_name, out, usage(self.n_prompt, n_out))


def event_error(event: TokenEvent) -> APIError:
    """What a request that ended without finishing tells its client: never the client's fault (a 5xx)."""
    if event.finish_reason == "cancelled":
        return APIError(503, "the server cancelled this request", type="server_error", code="request_cancelled")
    return APIError(500, f"generation failed: {event.error}", type="server_error", code="generation_failed")


def sampling_config(**settings) -> SamplingConfig:
    """The body's sampling settings as a SamplingConfig; a value it refuses is a 400 naming the field."""
    for name, value in settings.items():
        try:
            validate_sampling(**{name: value})
        except ValueError as e:
            field = name if name in ("temperature", "top_p") else f"extensions.{name}"
            raise APIError(400, str(e), param=field) from None
    return SamplingConfig(**settings)


def generated_only_penalties(prompt_len: int, presence: float, frequency: float):
    """OpenAI's presence and frequency penalties over generated tokens only (sampling.apply_penalties, which
    counts whatever ids it is given, gets the ids after the prompt)."""

    def penalise(ids, logits):  # (1, T), (1, V)
        return apply_penalties(logits, ids[:, prompt_len:], presence_penalty=presence, frequency_penalty=frequency)

    return penalise


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

    def delta(self, finished: bool) -> str:
        text = self.tok.decode(self.ids)
        if finished:
            safe = cut_at_stop_string(text, self.stops) if self.stops else text
        else:
            safe = text.rstrip("\ufffd")
            safe = safe[: max(self.sent, len(safe) - self.hold)]
        out = safe[self.sent :]
        self.sent = max(self.sent, len(safe))
        return out


def finish_reason(engine_reason: str | None) -> str | None:
    if engine_reason is None:
        return None
    return "length" if engine_reason == "length" else "stop"


def logprobs_piece(tok, events: list[TokenEvent], offset: int, texts: list[str]) -> dict:
    return {
        "tokens": texts,
        "token_logprobs": [e.logprob for e in events],
        "top_logprobs": [{tok.decode([t]): v for t, v in (e.top_logprobs or {}).items()} for e in events]
        if events and events[0].top_logprobs is not None
        else None,
        "text_offset": [offset + sum(len(t) for t in texts[:k]) for k in range(len(texts))],
    }


def _tokens_within(tokenizer, ids: list[int], n_chars: int) -> int:
    """How many of ids it takes to produce at least n_chars characters (the tokens a cut text keeps)."""
    for k in range(len(ids) + 1):
        if len(tokenizer.decode(ids[:k])) >= n_chars:
            return k if n_chars else 0
    return len(ids)
