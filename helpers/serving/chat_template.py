"""Chat templates: how a list of messages becomes the one token sequence a language model reads.

A chat model is a plain next-token predictor; "roles" exist only as text or special tokens that a
template writes around each message, and a chat model was fine-tuned on conversations written exactly
that way. Templates are Jinja programs (as in HuggingFace's `tokenizer_config.json`), rendered here in
Jinja's sandbox, with `messages` and `add_generation_prompt` as their variables:

    CHATML_TEMPLATE   <|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n   (Qwen, many others)
    LLAMA3_TEMPLATE   <|begin_of_text|><|start_header_id|>user<|end_header_id|>\\n\\nhi<|eot_id|>...
    PYFILE_TEMPLATE   the conversation written as a Python file: system and user turns as comments, the
                      assistant's turns as code (the course model was trained on Python files only)
    PLAIN_TEMPLATE    "### user\\nhi\\n### assistant\\n": plain-text headers; `render_chat` renders it, and
                      the server's /v1/chat/completions uses it (TURN_STOP ends a reply)

Special tokens. A template's markers (`<|im_start|>`) must become single special-token ids; `tok.encode`
never makes them from text (it encodes "<|im_start|>" as the bytes "<", "|", "im", ...), which is what
keeps a user from forging one. `chat_token_ids` splits the rendered text at the markers and puts in the
ids, and refuses a message whose content contains a marker (HuggingFace's transformers instead encodes
such a marker as plain text). The course tokenizer has exactly two special tokens, `<|bos|>` and
`<|eos|>`, and the course model saw them only as "a file starts" and "a file ends". It has no ids for
ChatML's markers, so CHATML_SPECIALS maps them onto those two, explicitly:

    <|im_start|> -> <|bos|>   (a new text begins: here, a turn)
    <|im_end|>   -> <|eos|>   (the text ends: here, a turn; a reply stops at this id)

That is a mapping, not training: a chat-tuned model learned what its markers mean, and the course
model never saw <|bos|> in the middle of a file. Llama 3's five markers have no counterpart here, so
LLAMA3_TEMPLATE is for rendering and counting only.

Left out: tool calls, images, names on messages, `bos_token`/`raise_exception` template globals, and
templates that need anything but `messages` and `add_generation_prompt`.
"""

from __future__ import annotations

import re

from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES = ("system", "user", "assistant")

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML_SPECIALS = {"<|im_start|>": "<|bos|>", "<|im_end|>": "<|eos|>"}  # marker -> course special token

LLAMA3_TEMPLATE = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

PYFILE_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'assistant' %}{{ m.content }}\n"
    "{% else %}# {{ m.content | replace('\n', '\n# ') }}\n{% endif %}{% endfor %}"
)

PLAIN_TEMPLATE = (
    "{% for m in messages %}### {{ m.role }}\n{{ m.content.rstrip('\\n') }}\n{% endfor %}"
    "{% if add_generation_prompt %}### assistant\n{% endif %}"
)
TURN_HEADER = "### {role}\n"
TURN_STOP = "\n### "  # the beginning of any next turn in PLAIN_TEMPLATE: the reply ends there

# HuggingFace's settings (transformers' apply_chat_template), so a model's own template renders here as there; the
# sandbox keeps a template from reaching files, private attributes or mutating its inputs
_ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)


def check_messages(messages) -> None:
    """Raise ValueError naming the offending message unless `messages` is a non-empty list of
    {"role": "system" | "user" | "assistant", "content": str} with at least one user message."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) - {"role", "content"} or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] must be an object with exactly 'role' and 'content'")
        if m["role"] not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}; got {m['role']!r}")
        if not isinstance(m["content"], str):
            raise ValueError(f"messages[{i}].content must be a string")
    if not any(m["role"] == "user" for m in messages):
        raise ValueError("messages must contain at least one message with role 'user'")


def render(template: str, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The text a Jinja chat template writes for `messages` (checked by check_messages)."""
    if not isinstance(template, str):
        raise ValueError(f"template must be a Jinja source string; got {type(template).__name__}")
    check_messages(messages)
    return _ENV.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt)


def render_chat(messages: list[dict]) -> str:
    """The server's prompt text (without <|bos|>, which the tokenizer adds): PLAIN_TEMPLATE, ending in the
    assistant's header. Raises ValueError naming the offending message on a bad conversation."""
    return render(PLAIN_TEMPLATE, messages)


def chat_token_ids(
    tok,
    messages: list[dict],
    template: str = CHATML_TEMPLATE,
    specials: dict | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Token ids of a conversation: the template's text, with each marker in `specials` (marker -> the name of
    one of `tok.special_tokens`) as that special token's id and everything else through `tok.encode`.
    specials=None means CHATML_SPECIALS; {} encodes the markers as plain text (what goes wrong when a
    template's markers are not the tokenizer's special tokens). A message whose content contains a marker
    is refused: otherwise a user could write a turn of their own."""
    specials = CHATML_SPECIALS if specials is None else specials
    unknown = [name for name in specials.values() if name not in tok.special_tokens]
    if unknown:
        raise ValueError(
            f"specials maps to {unknown}, which are not among the tokenizer's special tokens {list(tok.special_tokens)}"
        )
    text = render(template, messages, add_generation_prompt)
    if not specials:
        return tok.encode(text)
    for i, m in enumerate(messages):
        for marker in specials:
            if marker in m["content"]:
                raise ValueError(
                    f"messages[{i}].content contains the marker {marker!r}, which only the template may write"
                )
    ids = []
    for piece in re.split("(" + "|".join(map(re.escape, specials)) + ")", text):
        if piece in specials:
            ids.append(tok.special_tokens[specials[piece]])
        elif piece:
            ids.extend(tok.encode(piece))
    return ids
