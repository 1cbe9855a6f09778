"""Byte-level BPE tokenizer: text <-> token ids, offline and byte-exact.

Every string (and every byte string, valid UTF-8 or not) round-trips exactly:
``tok.decode(tok.encode(text)) == text`` and ``tok.decode_bytes(tok.encode_bytes(b)) == b``.
The first 256 ids are the raw bytes, so nothing is ever "unknown"; the next ids are merges learned
from the training corpus; the last ids are special tokens (begin- and end-of-text), which
``encode`` never produces from ordinary text: you add them explicitly with ``bos=True`` / ``eos=True``.

Out of scope: Unicode normalisation, chat templates, and speed (encoding is pure Python, with a
per-chunk cache that makes a 10 MB corpus take tens of seconds).
"""

from __future__ import annotations

import json
import numbers
import re
from collections import Counter
from pathlib import Path

# Text is first split into chunks (words with their leading space, numbers, punctuation runs,
# whitespace runs); merges never cross a chunk boundary. The pattern is GPT-2's, written for
# Python's built-in `re` ([^\W\d] is "a Unicode letter or underscore").
SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d]\w*| ?\d{1,3}| ?[^\s\w]+|\s+(?!\S)|\s+"""
SPECIAL_TOKENS = ("<|bos|>", "<|eos|>")


class Tokenizer:
    def __init__(self, merges: list[tuple[int, int]], special_tokens=SPECIAL_TOKENS):
        self.merges = {tuple(pair): 256 + i for i, pair in enumerate(merges)}  # (a, b) -> new id
        self.vocab = {i: bytes([i]) for i in range(256)}  # id -> bytes
        for (a, b), idx in self.merges.items():
            self.vocab[idx] = self.vocab[a] + self.vocab[b]
        n = 256 + len(self.merges)
        self.special_tokens = {s: n + i for i, s in enumerate(special_tokens)}  # str -> id
        self.bos_id = self.special_tokens["<|bos|>"]
        self.eos_id = self.special_tokens["<|eos|>"]
        self.vocab_size = n + len(self.special_tokens)
        self._pattern = re.compile(SPLIT_PATTERN)
        self._cache: dict[bytes, list[int]] = {}

    # ---- encoding -------------------------------------------------------------------------
    def _encode_chunk(self, chunk: bytes) -> list[int]:
        cached = self._cache.get(chunk)
        if cached is not None:
            return cached
        ids = list(chunk)
        while len(ids) >= 2:
            # merge the adjacent pair that was learned earliest (lowest new id)
            pair = min(zip(ids, ids[1:]), key=lambda p: self.merges.get(p, float("inf")))
            new_id = self.merges.get(pair)
            if new_id is None:
                break
            ids = merge_pair(ids, pair, new_id)
        if len(self._cache) < 500_000:
            self._cache[chunk] = ids
        return ids

    def encode_bytes(self, data: bytes, bos: bool = False, eos: bool = False) -> list[int]:
        """Bytes -> ids. Invalid UTF-8 is fine: each chunk is split as text, then encoded as bytes."""
        if not isinstance(data, (bytes, bytearray)):
            raise ValueError(f"data must be bytes; got {type(data).__name__}")
        text = bytes(data).decode("utf-8", errors="surrogateescape")
        ids = [self.bos_id] if bos else []
        for chunk in self._pattern.findall(text):
            ids.extend(self._encode_chunk(chunk.encode("utf-8", errors="surrogateescape")))
        if eos:
            ids.append(self.eos_id)
        return ids

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """Text -> ids. Special-token strings in `text` are encoded as ordinary bytes.

        Lone surrogates U+DC80..U+DCFF (how Python's "surrogateescape" carries undecodable bytes in a
        str) are encoded as the bytes they stand for.
        """
        if not isinstance(text, str):
            raise ValueError(f"text must be a str; got {type(text).__name__} (use encode_bytes for bytes)")
        try:
            data = text.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError as e:
            raise ValueError(f"text is not valid Unicode (a lone surrogate at index {e.start})") from None
        return self.encode_bytes(data, bos=bos, eos=eos)

    # ---- decoding -------------------------------------------------------------------------
    def decode_bytes(self, ids, skip_special: bool = True) -> bytes:
        id_to_special = {v: k for k, v in self.special_tokens.items()}
        out = []
        for i in _as_int_list(ids):
            if i in self.vocab:
                out.append(self.vocab[i])
            elif i in id_to_special:
                if not skip_special:
                    out.append(id_to_special[i].encode())
            else:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
        return b"".join(out)

    def decode(self, ids, skip_special: bool = True) -> str:
        """Ids -> text. Bytes that are not valid UTF-8 (a sequence cut mid-character) become U+FFFD."""
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", errors="replace")

    def token_strings(self, ids) -> list[str]:
        """One readable string per id (for showing how text was split)."""
        id_to_special = {v: k for k, v in self.special_tokens.items()}
        return [id_to_special.get(i) or self.vocab[i].decode("utf-8", errors="replace") for i in _as_int_list(ids)]

    # ---- persistence ----------------------------------------------------------------------
    def save(self, path) -> None:
        merges = sorted(self.merges.items(), key=lambda kv: kv[1])
        doc = {
            "type": "byte-level-bpe",
            "split_pattern": SPLIT_PATTERN,
            "special_tokens": list(self.special_tokens),
            "merges": [list(p) for p, _ in merges],
        }
        Path(path).write_text(json.dumps(doc, separators=(",", ":")) + "\n")

    @classmethod
    def load(cls, path) -> "Tokenizer":
        doc = json.loads(Path(path).read_text())
        if doc.get("split_pattern") != SPLIT_PATTERN:
            raise ValueError(f"{path}: its split pattern differs from this code's SPLIT_PATTERN")
        return cls([tuple(p) for p in doc["merges"]], tuple(doc["special_tokens"]))

    def __repr__(self):
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, specials={list(self.special_tokens)})"
        )


def merge_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """ids with every non-overlapping occurrence of `pair`, left to right, replaced by new_id (one BPE merge)."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


_IDS = "ids must be integer token ids (a list of ints or an integer tensor)"


def _as_int_list(ids) -> list[int]:
    """ids (a list, tuple, tensor or array of integer token ids) as a list of ints. Anything else is refused:
    int() would silently truncate floats (2.7 -> 2) and read a str digit by digit ("42" -> [4, 2])."""
    if isinstance(ids, (str, bytes, bytearray)):
        raise ValueError(f"{_IDS}; got a {type(ids).__name__} (text is encoded with encode(), not decoded)")
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    try:
        ids = list(ids)
    except TypeError:  # a single number (a 0-d tensor included) is not a sequence of ids
        raise ValueError(f"{_IDS}; got {type(ids).__name__} {ids!r}") from None
    for i in ids:
        if isinstance(i, (list, tuple)):
            raise ValueError(f"{_IDS}; got a nested sequence (decode one sequence at a time, e.g. ids[0])")
        if not isinstance(i, numbers.Integral) or isinstance(i, bool):
            raise ValueError(f"{_IDS}; got {type(i).__name__} {i!r}")
    return [int(i) for i in ids]


def train_bpe(text: str, vocab_size: int, special_tokens=SPECIAL_TOKENS, verbose: bool = False) -> Tokenizer:
    """Learn `vocab_size - 256 - len(special_tokens)` merges from `text` (deterministic).

    Chunks are counted once (a Counter of unique chunks), and pair counts are updated only in
    the chunks a merge touches, so this takes seconds to minutes rather than hours.
    Ties between equally frequent pairs go to the smaller pair, so the result never depends on
    dictionary order.
    """
    n_merges = vocab_size - 256 - len(special_tokens)
    if n_merges < 0:
        raise ValueError(f"vocab_size must be at least {256 + len(special_tokens)}; got {vocab_size}")
    chunk_counts = Counter(re.findall(SPLIT_PATTERN, text))
    words = [list(c.encode("utf-8", errors="surrogateescape")) for c in chunk_counts]
    freqs = list(chunk_counts.values())
    pair_counts: Counter = Counter()
    where: dict[tuple[int, int], set[int]] = {}  # pair -> indices of words containing it
    for w, (ids, f) in enumerate(zip(words, freqs)):
        for p in zip(ids, ids[1:]):
            pair_counts[p] += f
            where.setdefault(p, set()).add(w)
    merges = []
    for k in range(n_merges):
        if not pair_counts:
            break
        best = max(pair_counts.items(), key=lambda kv: (kv[1], -kv[0][0], -kv[0][1]))[0]
        new_id = 256 + k
        merges.append(best)
        for w in sorted(where.pop(best, ())):
            ids, f = words[w], freqs[w]
            for p in zip(ids, ids[1:]):  # remove this word's old pairs ...
                pair_counts[p] -= f
                if pair_counts[p] <= 0:
                    del pair_counts[p]
            ids = merge_pair(ids, best, new_id)
            words[w] = ids
            for p in zip(ids, ids[1:]):  # ... and add its new ones
                pair_counts[p] += f
                where.setdefault(p, set()).add(w)
        pair_counts.pop(best, None)
        if verbose and (k + 1) % 200 == 0:
            print(f"merge {k + 1}/{n_merges}")
    return Tokenizer(merges, special_tokens)
