"""Decoding constrained to a regular expression: per-state token masks, applied as a logits processor.

    dfa = compile_regex(pattern)                     # regex_automaton.py: a byte-level DFA
    grammar = TokenGrammar(dfa, token_bytes(tok), tok.eos_id)  # next_state and allowed, (S + 1, V) each
    proc = GrammarProcessor(grammar, prompt_len, max_new_tokens)
    generate(model, prompt, n, logits_processors=[proc], eos_id=tok.eos_id)

A token is allowed in a state if every one of its bytes keeps the automaton alive: after them the
DFA is in a state from which an accepting state can still be reached. End-of-text is allowed exactly
in accepting states; other special tokens never. The masks of every state are computed once, when
the grammar meets the vocabulary (that table is the cache); a decode step is then one lookup per row
and one masked_fill.

With `max_new_tokens` the processor also refuses a token after which the output could no longer be
finished within the tokens left, so every output ends complete (it uses the shortest completion, in
tokens, of each state: `TokenGrammar.tokens_to_finish`).

Out of scope: grammars that need a stack (arbitrarily nested JSON; `json_object_pattern` writes a
flat JSON object of typed fields as a regular expression instead, as outlines does for JSON schemas),
bitmask storage, and correcting the distortion masking causes (chapter 10 measures it).
"""

from __future__ import annotations

import re

import numpy as np
import torch

from .regex_automaton import ByteDFA

__all__ = ["GrammarProcessor", "TokenGrammar", "json_object_pattern", "token_bytes"]


# ---- the DFA meets the vocabulary ------------------------------------------------------------------


def token_bytes(tok) -> list[bytes | None]:
    """Each id's bytes, None for special tokens (they spell no text)."""
    return [tok.vocab.get(i) for i in range(tok.vocab_size)]


class TokenGrammar:
    """A ByteDFA compiled against a vocabulary: `next_state` (S + 1, V) and `allowed` (S + 1, V) for every
    state at once. The extra last state, DONE, follows end-of-text and allows only end-of-text again
    (rows of a batch that finished early are padded with it)."""

    def __init__(self, dfa: ByteDFA, vocab: list[bytes | None], eos_id: int):
        if not 0 <= eos_id < len(vocab) or vocab[eos_id] is not None:
            raise ValueError(f"eos_id must be the id of a special token (bytes None) in the vocabulary; got {eos_id}")
        self.dfa, self.eos_id, self.vocab_size = dfa, eos_id, len(vocab)
        S = dfa.n_states
        self.done = S
        self.next_state = self._walk_all(dfa, vocab)  # (S + 1, V) int64, -1 = dead
        self.next_state[:S, eos_id] = np.where(dfa.accepting, self.done, -1)
        self.next_state[self.done, :] = -1
        self.next_state[self.done, eos_id] = self.done
        self.allowed = torch.from_numpy(self.next_state >= 0)  # (S + 1, V) bool: the per-state masks
        self.tokens_to_finish = self._tokens_to_finish()  # (S + 1,) shortest completion, in tokens

    @staticmethod
    def _walk_all(dfa: ByteDFA, vocab) -> np.ndarray:
        """Run every token's bytes from every state at once: one gather per byte position."""
        S, V = dfa.n_states, len(vocab)
        L = max(len(b) for b in vocab if b is not None)
        PAD = 256  # a padding "byte" that leaves the state unchanged
        padded = np.full((V, L), PAD, dtype=np.int64)
        for i, b in enumerate(vocab):
            if b:
                padded[i, : len(b)] = list(b)
        table = np.full((S + 2, 257), S + 1, dtype=np.int64)  # row S: DONE; row S + 1: dead (absorbing)
        table[:S, :256] = np.where(dfa.table >= 0, dfa.table, S + 1)
        table[:S, PAD] = np.arange(S)
        state = np.broadcast_to(np.arange(S + 1)[:, None], (S + 1, V)).copy()  # (S + 1, V)
        state[S] = S + 1
        for j in range(L):
            state = table[state, padded[None, :, j]]
        special = np.array([b is None for b in vocab])
        state[:, special] = S + 1  # special tokens spell nothing: never part of the text
        return np.where(state == S + 1, -1, state)

    def _tokens_to_finish(self) -> np.ndarray:
        """Fewest tokens that take each state to an accepting one (0 when it accepts), by relaxation."""
        S = self.dfa.n_states
        dist = np.full(S + 1, np.iinfo(np.int64).max // 2, dtype=np.int64)
        dist[:S][self.dfa.accepting] = 0
        dist[self.done] = 0
        nxt = self.next_state
        while True:
            via = np.where(nxt >= 0, dist[np.maximum(nxt, 0)] + 1, dist.max()).min(axis=1)
            new = np.minimum(dist, via)
            if (new == dist).all():
                return dist
            dist = new

    def state_after(self, ids, start: int = 0) -> int:
        """The state after the token ids (a list); a ValueError naming the first id the grammar refuses."""
        state = start
        for k, i in enumerate(ids):
            nxt = int(self.next_state[state, i]) if 0 <= i < self.vocab_size else -1
            if nxt < 0:
                raise ValueError(
                    f"token {i} at generated position {k} is not allowed by the grammar {self.dfa.pattern!r} there"
                )
            state = nxt
        return state

    def mask(self, state: int, tokens_left: int | None = None) -> torch.Tensor:
        """(V,) bool: the tokens allowed in `state`; with `tokens_left`, only those after which the output
        can still be finished in the tokens that remain."""
        allowed = self.allowed[state]
        if tokens_left is None:
            return allowed
        nxt = self.next_state[state]
        finishable = np.where(nxt >= 0, self.tokens_to_finish[np.maximum(nxt, 0)] <= tokens_left - 1, False)
        return torch.from_numpy(finishable)


class GrammarProcessor:
    """A logits processor `proc(ids, logits) -> logits` (the signature of generate's and HuggingFace's):
    sets the logits of tokens the grammar forbids to -inf. ids (B, T) holds prompt + generated tokens;
    the grammar applies to what comes after the first `prompt_len` (plus an optional `prefix` of text the
    prompt already contains). Each row's state is looked up by its generated ids, so rows may be
    reordered between calls (beam search does)."""

    def __init__(
        self, grammar: TokenGrammar, prompt_len: int, max_new_tokens: int | None = None, prefix: str | bytes = ""
    ):
        self.grammar, self.prompt_len, self.max_new_tokens = grammar, prompt_len, max_new_tokens
        data = prefix.encode("utf-8") if isinstance(prefix, str) else bytes(prefix)
        bad = grammar.dfa.first_rejected_byte(data)
        if bad is not None:
            raise ValueError(
                f"prefix {data!r} leaves the grammar {grammar.dfa.pattern!r} at byte {bad} "
                f"({data[bad : bad + 1]!r}), so no continuation can ever complete it"
            )
        self.start = grammar.dfa.step(0, data)
        needed = int(grammar.tokens_to_finish[self.start])
        if max_new_tokens is not None and needed > max_new_tokens:
            raise ValueError(
                f"the grammar {grammar.dfa.pattern!r} needs at least {needed} tokens to complete, "
                f"but max_new_tokens is {max_new_tokens}"
            )
        self._states: dict[tuple, int] = {(): self.start}

    def state(self, generated: list[int]) -> int:
        key = tuple(generated)
        found = self._states.get(key)
        if found is None:
            found = self.grammar.state_after(key[-1:], start=self.state(list(key[:-1])))
            self._states[key] = found
        return found

    def __call__(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape
        if T < self.prompt_len:
            raise ValueError(f"ids have {T} positions, fewer than prompt_len={self.prompt_len}")
        tokens_left = None if self.max_new_tokens is None else self.max_new_tokens - (T - self.prompt_len)
        masks = torch.stack(
            [self.grammar.mask(self.state(row), tokens_left) for row in ids[:, self.prompt_len :].tolist()]
        )  # (B, V)
        return logits.masked_fill(~masks.to(logits.device), float("-inf"))


def json_object_pattern(fields: dict[str, str], max_string: int = 24, max_digits: int = 9) -> str:
    """A regular expression for a flat JSON object with these keys, in this order, and value types
    "string" (printable ASCII without quotes or backslashes), "integer", "number" or "boolean".
    Lengths are bounded, so every such object fits in a known number of tokens."""
    value = {
        "string": f'"[ !#-\\[\\]-~]{{0,{max_string}}}"',
        "integer": f"-?(0|[1-9][0-9]{{0,{max_digits - 1}}})",
        "number": f"-?(0|[1-9][0-9]{{0,{max_digits - 1}}})(\\.[0-9]{{1,6}})?",
        "boolean": "(true|false)",
    }
    parts = []
    for key, kind in fields.items():
        if kind not in value:
            raise ValueError(f"field {key!r} has type {kind!r}; allowed: {sorted(value)}")
        if not re.fullmatch(r"[A-Za-z0-9_ ]+", key):
            raise ValueError(f"field names must be letters, digits, '_' or spaces; got {key!r}")
        parts.append(f'"{key}": {value[kind]}')
    if not parts:
        raise ValueError("fields must name at least one field")
    return "\\{" + ", ".join(parts) + "\\}"
