"""The OpenAI wire format: request bodies (validated), response objects and the error shape.

Requests are validated strictly, as OpenAI's API does: wrong types are not coerced ("0.7" is not a
temperature), values outside OpenAI's documented ranges are refused, and unknown parameters are
errors rather than silently ignored. `repetition_penalty`, for example, is a HuggingFace parameter, not
an OpenAI one: send it (with `top_k` and `min_p`) inside the documented extension object
`extensions`, the way vLLM takes extra sampling parameters.

Every error is OpenAI's JSON shape, {"error": {"message", "type", "param", "code"}}, with the name of
the offending parameter in `param` as the client spelled it ("stream", "extensions.top_k",
"messages[1].role"), taken from where validation failed, never guessed from a message. `parse_body`
turns raw bytes into a validated request or such an error (invalid UTF-8, malformed JSON, a wrong type,
a value out of range, an unknown field).

Left out: `best_of`, `echo`, `suffix`, `logit_bias`, `user`, prompts given as token ids or as lists,
tool calls and response formats.
"""

from __future__ import annotations

import json
import time
import typing
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .params import SEED_MAX, SEED_MIN

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
    seed: Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)] | None = None  # what torch.Generator accepts
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

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict:
        return error_body(self.message, self.param, self.type, self.code)


def error_body(
    message: str, param: str | None = None, type: str = "invalid_request_error", code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


NOT_OPENAI = ("repetition_penalty", "top_k", "min_p", "ignore_eos")


def parse_body(raw: bytes, model: type[BaseModel]) -> BaseModel:
    """Bytes of a request body -> a validated `model`, or an APIError (400) naming the field at fault."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(
            400, f"the body is not valid UTF-8 (byte {e.start}); JSON bodies must be UTF-8", code="invalid_encoding"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise APIError(
            400, f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}", code="invalid_json"
        ) from None
    except RecursionError:
        raise APIError(400, "malformed JSON: nested too deeply", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the body must be a JSON object; got a JSON {type(data).__name__}", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errors = e.errors()  # the first field at fault; of a union's errors, the one that got furthest in,
        # and of those one about the value rather than its type ("at most 4 items" over "should be a string")
        same_field = [x for x in errors if x["loc"][:1] == errors[0]["loc"][:1]]
        furthest = max(same_field, key=lambda x: (len(x["loc"]), not x["type"].endswith("_type")))
        raise validation_error(model, furthest) from None


def validation_error(model: type[BaseModel], err: dict) -> APIError:
    """One pydantic error -> OpenAI's 400, `param` the field's path as the client wrote it."""
    param = field_path(model, err.get("loc", ()))
    if err.get("type") == "extra_forbidden":
        name = param.rsplit(".", 1)[-1]
        message = f"unknown parameter {param!r}"
        if name in NOT_OPENAI and "." not in param:
            message += f': {name} is not an OpenAI parameter; send it as {{"extensions": {{"{name}": ...}}}}'
        return APIError(400, message, param=param, code="unknown_parameter")
    if err.get("type") == "missing":
        return APIError(400, f"{param} is required", param=param, code="missing_parameter")
    return APIError(400, f"{param}: {err.get('msg')} (got {err.get('input')!r:.80})", param=param, code="invalid_value")


def field_path(model, loc) -> str:
    """A pydantic error location -> "field", "extensions.top_k", "messages[0].role". Walks the model's fields,
    so the tags pydantic adds for the members of a union ("str", "list[str]") are left out."""
    path, current = "", model
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
            continue
        fields = getattr(current, "model_fields", {})
        if part in fields or fields:  # a field of this object (or an unknown one, for extra_forbidden)
            path += f".{part}" if path else part
            current = _inner_model(fields[part].annotation) if part in fields else None
        # otherwise a tag pydantic adds for a member of a union ("str", "list[str]"): not the client's
    return path


def _inner_model(annotation):
    """The BaseModel inside an annotation such as ChatMessage, list[ChatMessage] or StreamOptions | None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_object(rid: str, model: str, choices: list[dict], usage_: dict | None, chunk: bool = False) -> dict:
    """A text_completion (chunk = one streamed piece has the same shape, with partial text)."""
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        **({"usage": usage_} if usage_ is not None or not chunk else {}),
    }


def chat_object(rid: str, model: str, choices: list[dict], usage_: dict | None, chunk: bool = False) -> dict:
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chunk else "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        **({"usage": usage_} if usage_ is not None or not chunk else {}),
    }
