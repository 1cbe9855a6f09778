"""The OpenAI wire format: request bodies (validated), response objects and the error shape.

Requests are validated strictly, as OpenAI's API does: wrong types are not coerced ("0.7" is not a
temperature), values outside OpenAI's documented ranges are refused, and unknown parameters are
errors rather than silently ignored. `repetition_penalty`, for example, is a HuggingFace parameter, not
an OpenAI one: send it (with `top_k` and `min_p`) inside the documented extension object
`extensions`, the way vLLM takes extra sampling parameters.

Every error is OpenAI's JSON shape, {"error": {"message", "type", "param", "code"}}, with the name of
the offending parameter in `param`.

Left out: `best_of`, `echo`, `suffix`, `logit_bias`, `user`, prompts given as token ids or as lists,
tool calls and response formats.
"""
from __future__ import annotations

import time
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Strict = ConfigDict(extra="forbid", strict=True)
MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_N = 8
MAX_LOGPROBS = 5  # OpenAI's limit for the completions endpoint


class Extensions(BaseModel):
    """Sampling settings OpenAI does not define (HuggingFace / vLLM names), sent as {"extensions": {...}}."""
    model_config = Strict
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    ignore_eos: bool = False  # generate exactly max_tokens (load tests), as vLLM's ignore_eos


class StreamOptions(BaseModel):
    model_config = Strict
    include_usage: bool = False


class SamplingParams(BaseModel):
    """The settings both endpoints share, with OpenAI's defaults and ranges."""
    model_config = Strict
    model: str
    max_tokens: Annotated[int, Field(ge=1)] = 16
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    seed: int | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    extensions: Extensions = Extensions()

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]


class CompletionRequest(SamplingParams):
    prompt: Annotated[str, Field(min_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None


class ChatMessage(BaseModel):
    model_config = Strict
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(SamplingParams):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]


class APIError(Exception):
    """An error the server reports in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict:
        return error_body(self.message, self.param, self.type, self.code)


def error_body(message: str, param: str | None = None, type: str = "invalid_request_error",
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_object(rid: str, model: str, choices: list[dict], usage_: dict | None, chunk: bool = False) -> dict:
    """A text_completion (chunk = one streamed piece has the same shape, with partial text)."""
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, **({"usage": usage_} if usage_ is not None or not chunk else {})}


def chat_object(rid: str, model: str, choices: list[dict], usage_: dict | None, chunk: bool = False) -> dict:
    return {"id": rid, "object": "chat.completion.chunk" if chunk else "chat.completion",
            "created": int(time.time()), "model": model, "choices": choices,
            **({"usage": usage_} if usage_ is not None or not chunk else {})}
