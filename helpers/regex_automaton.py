"""Regular expressions as byte automata: pattern -> syntax tree -> NFA -> DFA, with dead states trimmed.

    dfa = compile_regex(r"0|[1-9][0-9]*")
    dfa.matches("42")            # True: the whole text must match
    dfa.step(0, b"4")            # the state after some bytes (ByteDFA.DEAD = -1 once nothing can follow)

Thompson's construction turns the syntax tree into an NFA with empty moves; the subset construction
turns that into a DFA over the 256 byte values; a backward search then drops every state from which
no accepting state can be reached, so "not dead" means "can still finish". The DFA is not minimised.

The subset: literals, `.`, classes `[a-z0-9_]` and `[^...]`, escapes `\\d \\w \\s \\n \\t \\r \\xHH` and
escaped metacharacters, groups `( )` and `(?: )`, alternation `|`, and the quantifiers
`* + ? {m} {m,} {m,n}` (bounded repeats are expanded into copies, up to 256). The pattern is read as
bytes: non-ASCII literals match their UTF-8 bytes, while `.` and negated classes match only ASCII
(bytes 0-127), so text the automaton accepts is always valid UTF-8.

Out of scope: anchors (`^`, `$`: the whole text always has to match), backreferences, lookaround,
lazy quantifiers, Unicode classes, and minimisation. grammar.py compiles the DFA against a vocabulary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

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
            if not re.fullmatch(r"[0-9a-fA-F]{2}", self.p[self.i : self.i + 2]):
                self.fail("\\x needs two hex digits")
            self.i += 2
            return ("bytes", frozenset({int(self.p[self.i - 2 : self.i], 16)}))
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
            elif self.peek() == "-" and self.p[self.i + 1 : self.i + 2] not in ("]", ""):
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
