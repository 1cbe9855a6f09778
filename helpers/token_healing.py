"""Token healing: fix the prompt-boundary problem by letting the model re-choose the prompt's last token.

    kept, removed = heal_prompt(tok, ids)                   # back up the last token: its bytes are `removed`
    ids = generate_healed(model, tok, ids, max_new_tokens=20)  # greedy, constrained to re-produce `removed`

A prompt that ends mid-word or in whitespace ("return " with its trailing space, or a newline plus
an indent) ends in a token the model rarely saw in that position: in training text the tokenizer
glues a space to the *next* word (" a"), so a lone " " before a word almost never occurs. Healing
removes the last token(s) and constrains the next generated tokens so that their bytes re-produce
the removed bytes exactly (a token may end past them, " a" for a removed " ", or inside them,
"\\n   " for a removed "\\n    "). Once the removed bytes are covered, generation is unconstrained.

Out of scope: sampling (healing here is greedy), batches, and backing up more than a few tokens.
"""

from __future__ import annotations

import torch

from .generate import generate
from .tokenizer import Tokenizer


def heal_prompt(tok: Tokenizer, ids, n_back: int = 1) -> tuple[list[int], bytes]:
    """Drop the last `n_back` tokens of `ids`; return (kept ids, the bytes those tokens spelled).

    A leading begin-of-text token is never backed up (it spells no bytes)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError("ids must be one sequence of int token ids (a list or a 1-D tensor), e.g. tok.encode(text)")
    ids = list(ids)
    if not isinstance(n_back, int) or isinstance(n_back, bool) or n_back < 1:
        raise ValueError(f"n_back must be an int >= 1; got {n_back!r}")
    first_text = 1 if ids and ids[0] == tok.bos_id else 0
    if len(ids) - first_text < n_back:
        raise ValueError(f"ids has {len(ids) - first_text} text tokens; cannot back up n_back={n_back}")
    kept, backed_up = ids[:-n_back], ids[-n_back:]
    if any(i in tok.special_tokens.values() for i in backed_up):
        raise ValueError("ids: cannot back up a special token (it spells no bytes)")
    return kept, tok.decode_bytes(backed_up)


def healing_mask(tok: Tokenizer, remaining: bytes) -> torch.Tensor:
    """(vocab_size,) bool: True for the tokens that agree with `remaining`, the removed bytes not yet
    re-produced: the token starts with them or is a prefix of them. Special tokens are never allowed."""
    if not isinstance(remaining, (bytes, bytearray)) or not remaining:
        raise ValueError(f"remaining must be non-empty bytes; got {remaining!r}")
    allowed = torch.zeros(tok.vocab_size, dtype=torch.bool)
    for i, b in tok.vocab.items():  # the 256 bytes and the merges; specials are not in vocab
        allowed[i] = b.startswith(remaining) or remaining.startswith(b)
    return allowed


@torch.no_grad()
def generate_healed(model, tok: Tokenizer, ids, max_new_tokens: int, n_back: int = 1) -> list[int]:
    """Greedy generation after token healing: the prompt minus its last `n_back` tokens, then tokens
    constrained by `healing_mask` until the removed bytes are re-produced, then `generate` as usual.

    Returns every id (prompt included); its text starts with the original prompt's text.
    max_new_tokens counts the unconstrained tokens after the healed ones."""
    kept, remaining = heal_prompt(tok, ids, n_back)
    out = list(kept)
    while remaining:  # each step consumes at least one byte, so this ends
        logits = model(torch.tensor([out], device=model.device))[0, -1]  # (V,)
        logits = logits.masked_fill(~healing_mask(tok, remaining).to(logits.device), float("-inf"))
        token = int(logits.argmax())
        out.append(token)
        spelled = tok.vocab[token]
        remaining = remaining[len(spelled) :] if remaining.startswith(spelled) else b""
    if max_new_tokens == 0:
        return out
    return generate(model, out, max_new_tokens=max_new_tokens)[0].tolist()
