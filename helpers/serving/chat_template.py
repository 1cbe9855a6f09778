"""The chat template: how a list of messages becomes the one token sequence a language model reads.

A chat model is a plain next-token predictor; "roles" exist only as text (or special tokens) that a
template writes around each message, and the model was fine-tuned on conversations written that way.
The course model is a code model that was never chat-tuned, so the template below is the minimal one
the endpoint needs to show the mechanics: it puts each message under a role header and ends with the
assistant's header, so that the model's continuation is "the assistant's reply".

    <|bos|>### system
    You are a helpful assistant.
    ### user
    Write a function that reverses a string.
    ### assistant
    <- generation starts here; it stops at the next "\\n### " (the start of another turn) or at <|eos|>

The role headers are ordinary text (Python-comment-like, so a code model has seen similar lines); only
<|bos|> is a special token, which `encode` never produces from text a user sends, so a message cannot
forge it. Real templates (Llama 3's `<|start_header_id|>user<|end_header_id|>`, ChatML's
`<|im_start|>user`) use special tokens for every header and live in the model's tokenizer config.

Left out: tool calls, images, names on messages, and generation prompts other than the assistant's.
"""
from __future__ import annotations

ROLES = ("system", "user", "assistant")
TURN_HEADER = "### {role}\n"
TURN_STOP = "\n### "  # the beginning of any next turn: the reply ends there


def render_chat(messages: list[dict]) -> str:
    """The prompt text (without <|bos|>, which the tokenizer adds) for a conversation.

    messages: [{"role": "system" | "user" | "assistant", "content": str}, ...], at least one user message.
    Raises ValueError naming the offending message otherwise."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} objects")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) - {"role", "content"} or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] must be an object with exactly 'role' and 'content'")
        if m["role"] not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}; got {m['role']!r}")
        if not isinstance(m["content"], str):
            raise ValueError(f"messages[{i}].content must be a string")
        parts.append(TURN_HEADER.format(role=m["role"]) + m["content"].rstrip("\n") + "\n")
    if not any(m["role"] == "user" for m in messages):
        raise ValueError("messages must contain at least one message with role 'user'")
    return "".join(parts) + TURN_HEADER.format(role="assistant")
