"""Decoding constrained to a regular expression: a byte-level automaton turned into token masks.

    pattern --parse--> syntax tree --Thompson--> NFA --subsets--> DFA (trimmed) --vocabulary--> masks

    g = compile_regex(pattern)                     # ByteDFA: one state per "what may still follow"
    tg = TokenGrammar(g, token_bytes(tok), eos_id)  # next_state (S, V) and allowed (S, V), all states at once
    proc = GrammarProcessor(tg, prompt_len, max_new_tokens)
    generate(model, prompt, n, logits_processors=[proc], eos_id=tok.eos_id)

A token is allowed in a state if every one of its bytes keeps the automaton alive: after them the
DFA is in a state from which an accepting state can still be reached (dead states are trimmed, so
"alive" means "can still finish"). End-of-text is allowed exactly in accepting states. The masks of
every state are computed once, when the grammar meets the vocabulary (that table is the cache);
a decode step is then one lookup per row and one masked_fill.

With `max_new_tokens` the processor also refuses a token after which the output could no longer be
finished within the tokens left, so every output ends complete (it needs the shortest completion, in
tokens, of each state: `TokenGrammar.tokens_to_finish`).

The regular-expression subset: literals, `.`, classes `[a-z0-9_]` and `[^...]`, escapes `\\d \\w \\s`
`\\n \\t \\r \\xHH` and escaped metacharacters, groups `( )` and `(?: )`, alternation `|`, and the
quantifiers `* + ? {m} {m,} {m,n}`. The whole output must match (no `^`/`$` needed). The pattern is
read as bytes: non-ASCII literals match their UTF-8 bytes, while `.` and negated classes match only
ASCII (bytes 0-127), so a constrained output is always valid UTF-8.

Out of scope: anchors, backreferences, lookaround, lazy quantifiers, Unicode classes, and grammars
that need a stack (arbitrarily nested JSON); `json_object_pattern` writes a flat JSON object of
typed fields as a regular expression instead, as outlines does for JSON schemas.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

ASCII = frozenset(range(128))
DIGITS = frozenset(b"0123456789")
WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
SPACE = frozenset(b" \t\n\r\f\v")
MAX_REPEAT = 256  # {m,n} is expanded into copies; a larger bound would blow up the automaton


# ---- parsing: pattern -> syntax tree ------------------------------------------------------------
# nodes: ("bytes", frozenset), ("cat", [nodes]), ("alt", [nodes]), ("repeat", node, min, max or None)

class _Parser:
    def __init__(self, pattern: str):
        self.p, self.i = pattern, 0

    def fail(self, why: str):
        raise ValueError(f"pattern {self.p!r}: {why} at position {self.i}")

    def peek(self):
        return self.p[self.i] if self.i < len(self.p) else None

    def parse(self):
        node = self.alternation()
        if self.i < len(self.p):
            self.fail("unbalanced ')'" if self.p[self.i] == ")" else f"unexpected {self.p[self.i]!r}")
        return node

    def alternation(self):
        branches = [self.concatenation()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.concatenation())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def concatenation(self):
        items = []
        while self.peek() is not None and self.peek() not in "|)":
            items.append(self.repetition())
        return ("cat", items)

    def repetition(self):
        node = self.atom()
        while self.peek() is not None and self.peek() in "*+?{":
            c = self.p[self.i]
            if c == "{":
                m = re.compile(r"\{(\d+)(,(\d*))?\}").match(self.p, self.i)
                if not m:
                    self.fail("'{' must be a repeat count {m}, {m,} or {m,n} (escape a literal brace as \\{)")
                lo = int(m.group(1))
                hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
                if hi is not None and hi < lo:
                    self.fail(f"repeat count {{{lo},{hi}}} has max < min")
                if max(lo, hi or 0) > MAX_REPEAT:
                    self.fail(f"repeat counts above {MAX_REPEAT} are not supported")
                self.i = m.end()
            else:
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            if self.peek() == "?":
                self.fail("lazy quantifiers (*?, +?) are not supported")
            node = ("repeat", node, lo, hi)
        return node

    def atom(self):
        c = self.p[self.i]
        if c == "(":
            self.i += 1
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.peek() == "?":
                self.fail("lookaround and named groups are not supported")
            node = self.alternation()
            if self.peek() != ")":
                self.fail("missing ')'")
            self.i += 1
            return node
        if c in "*+?{":
            self.fail(f"nothing to repeat before {c!r}")
        if c in "^$":
            self.fail("anchors are not supported (the whole output always has to match)")
        self.i += 1
        if c == ".":
            return ("bytes", ASCII - {ord("\n")})
        if c == "[":
            return ("bytes", self.char_class())
        if c == "\\":
            return self.escape()
        return _literal(c)

    def escape(self):
        if self.i >= len(self.p):
            self.fail("pattern ends with a lone backslash")
        c = self.p[self.i]
        self.i += 1
        classes = {"d": DIGITS, "w": WORD, "s": SPACE, "D": ASCII - DIGITS, "W": ASCII - WORD, "S": ASCII - SPACE}
        if c in classes:
            return ("bytes", classes[c])
        if c in "ntrfv":
            return ("bytes", frozenset({ord({"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}[c])}))
        if c == "x":
            if not re.fullmatch(r"[0-9a-fA-F]{2}", self.p[self.i:self.i + 2]):
                self.fail("\\x needs two hex digits")
            self.i += 2
            return ("bytes", frozenset({int(self.p[self.i - 2:self.i], 16)}))
        if c.isalnum():
            self.fail(f"unsupported escape \\{c}" + (" (backreferences are not supported)" if c.isdigit() else ""))
        return _literal(c)

    def char_class(self) -> frozenset:
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        chosen: set[int] = set()
        first = True
        while True:
            c = self.peek()
            if c is None:
                self.fail("missing ']'")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            lo = self.class_item()
            if isinstance(lo, frozenset):  # \d, \w, \s inside a class
                chosen |= lo
            elif self.peek() == "-" and self.p[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self.class_item()
                if isinstance(hi, frozenset) or hi < lo:
                    self.fail("bad range in a character class")
                chosen.update(range(lo, hi + 1))
            else:
                chosen.add(lo)
        return frozenset(ASCII - chosen) if negate else frozenset(chosen)

    def class_item(self) -> int | frozenset:
        c = self.p[self.i]
        if ord(c) > 127:
            self.fail(f"non-ASCII character {c!r} inside a class is not supported")
        self.i += 1
        if c != "\\":
            return ord(c)
        byteset = self.escape()[1]
        return next(iter(byteset)) if len(byteset) == 1 else byteset


def _literal(c: str):
    data = c.encode("utf-8")
    if len(data) == 1:
        return ("bytes", frozenset(data))
    return ("cat", [("bytes", frozenset({b})) for b in data])


def parse_regex(pattern: str):
    """The syntax tree of `pattern` (nested tuples); a ValueError saying what and where if it is malformed."""
    if not isinstance(pattern, str):
        raise ValueError(f"pattern must be a str; got {type(pattern).__name__}")
    parser = _Parser(pattern)
    return parser.parse()


# ---- syntax tree -> NFA -> DFA -------------------------------------------------------------------

class _NFA:
    def __init__(self):
        self.eps: list[list[int]] = []  # state -> states reachable by an empty move
        self.moves: list[list[tuple[frozenset, int]]] = []  # state -> (bytes, next state)

    def new(self) -> int:
        self.eps.append([])
        self.moves.append([])
        return len(self.eps) - 1

    def build(self, node) -> tuple[int, int]:
        """Thompson's construction: a fragment with one entry and one exit state."""
        kind = node[0]
        start, end = self.new(), self.new()
        if kind == "bytes":
            self.moves[start].append((node[1], end))
        elif kind == "cat":
            here = start
            for child in node[1]:
                s, e = self.build(child)
                self.eps[here].append(s)
                here = e
            self.eps[here].append(end)
        elif kind == "alt":
            for child in node[1]:
                s, e = self.build(child)
                self.eps[start].append(s)
                self.eps[e].append(end)
        else:  # repeat: `lo` required copies, then (hi - lo) optional ones, or a loop if hi is None
            _, child, lo, hi = node
            here = start
            for _ in range(lo):
                s, e = self.build(child)
                self.eps[here].append(s)
                here = e
            if hi is None:
                s, e = self.build(child)
                self.eps[here].append(s)
                self.eps[e].append(s)
                self.eps[e].append(end)
            else:
                for _ in range(hi - lo):
                    s, e = self.build(child)
                    self.eps[here].append(s)
                    self.eps[here].append(end)
                    here = e
            self.eps[here].append(end)
        return start, end

    def closure(self, states) -> frozenset:
        seen, stack = set(states), list(states)
        while stack:
            for t in self.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)


@dataclass
class ByteDFA:
    """A deterministic automaton over bytes. `table[s, b]` is the next state (or DEAD = -1); every state
    left can still reach an accepting one. State 0 is the start."""
    pattern: str
    table: np.ndarray  # (S, 256) int32
    accepting: np.ndarray  # (S,) bool

    DEAD = -1

    @property
    def n_states(self) -> int:
        return self.table.shape[0]

    def step(self, state: int, data: bytes) -> int:
        for b in data:
            if state == self.DEAD:
                break
            state = int(self.table[state, b])
        return state

    def matches(self, data) -> bool:
        """Whether the whole of `data` (str or bytes) is in the language."""
        s = self.step(0, data.encode("utf-8") if isinstance(data, str) else data)
        return s != self.DEAD and bool(self.accepting[s])

    def first_rejected_byte(self, data: bytes) -> int | None:
        """Index of the byte after which no completion is possible (None if `data` is still a valid prefix)."""
        s = 0
        for i, b in enumerate(data):
            s = int(self.table[s, b])
            if s == self.DEAD:
                return i
        return None


def compile_regex(pattern: str) -> ByteDFA:
    """Parse `pattern`, build its NFA, determinise it over bytes and drop the states that cannot finish."""
    tree = parse_regex(pattern)
    nfa = _NFA()
    start, final = nfa.build(tree)
    first = nfa.closure([start])
    index, order, rows = {first: 0}, [first], []
    while len(rows) < len(order):  # subset construction, breadth first
        current = order[len(rows)]
        targets: dict[int, set[int]] = {}
        for s in current:
            for byteset, t in nfa.moves[s]:
                for b in byteset:
                    targets.setdefault(b, set()).add(t)
        row = np.full(256, -1, dtype=np.int32)
        for b, ts in targets.items():
            nxt = nfa.closure(ts)
            if nxt not in index:
                index[nxt] = len(order)
                order.append(nxt)
            row[b] = index[nxt]
        rows.append(row)
    table = np.stack(rows)
    accepting = np.array([final in s for s in order])
    # trim: keep the states from which an accepting state is reachable (a backward search)
    alive = accepting.copy()
    while True:
        grown = alive | np.array([bool(alive[r[r >= 0]].any()) for r in table])
        if (grown == alive).all():
            break
        alive = grown
    if not alive[0]:
        raise ValueError(f"pattern {pattern!r} matches no string at all, so no output could ever satisfy it")
    keep = np.flatnonzero(alive)  # state 0 stays state 0
    new_id = np.full(len(order), -1, dtype=np.int32)
    new_id[keep] = np.arange(len(keep), dtype=np.int32)
    trimmed = np.where(table[keep] >= 0, new_id[np.maximum(table[keep], 0)], -1).astype(np.int32)
    return ByteDFA(pattern, trimmed, accepting[keep])


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
                padded[i, :len(b)] = list(b)
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
                raise ValueError(f"token {i} at generated position {k} is not allowed by the grammar "
                                 f"{self.dfa.pattern!r} there")
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

    def __init__(self, grammar: TokenGrammar, prompt_len: int, max_new_tokens: int | None = None,
                 prefix: str | bytes = ""):
        self.grammar, self.prompt_len, self.max_new_tokens = grammar, prompt_len, max_new_tokens
        data = prefix.encode("utf-8") if isinstance(prefix, str) else bytes(prefix)
        bad = grammar.dfa.first_rejected_byte(data)
        if bad is not None:
            raise ValueError(f"prefix {data!r} leaves the grammar {grammar.dfa.pattern!r} at byte {bad} "
                             f"({data[bad:bad + 1]!r}), so no continuation can ever complete it")
        self.start = grammar.dfa.step(0, data)
        needed = int(grammar.tokens_to_finish[self.start])
        if max_new_tokens is not None and needed > max_new_tokens:
            raise ValueError(f"the grammar {grammar.dfa.pattern!r} needs at least {needed} tokens to complete, "
                             f"but max_new_tokens is {max_new_tokens}")
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
        masks = torch.stack([self.grammar.mask(self.state(row), tokens_left)
                             for row in ids[:, self.prompt_len:].tolist()])  # (B, V)
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
