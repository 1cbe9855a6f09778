"""Stop conditions for the generation loop, beyond max_new_tokens, end-of-text and id-level stop sequences.

A stop criterion is any callable `criterion(generated: list[int]) -> bool`, called after every new token
with the ids generated so far (the prompt excluded). Pass criteria to
`generate(..., stop_criteria=[...])` (or `generate_without_cache`); the first one that returns True ends
generation, and the criterion object remembers why.

    RepetitionStop(max_period=64, min_repeats=3)  the output now ends in a block of tokens repeated
                                                  min_repeats times in a row: the loop greedy decoding
                                                  falls into. max_period=1 is "N identical tokens in a row".
    TextStop(tokenizer, ["\\n\\n"])               a stop *string* appeared in the decoded text, however the
                                                  tokenizer happened to split it
    cut_at_stop_string(text, stops)               the text before the first stop string (APIs do not return it)
    find_loop(ids)                                where a finished sequence's final loop starts, and its period

Out of scope: confidence-based early exit (that skips layers, it does not end generation) and
beam-search "early stopping".
"""
from __future__ import annotations


def _check_int(name: str, value, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")


def ends_in_loop(ids: list[int], period: int, min_repeats: int) -> bool:
    """True if the last period * min_repeats ids are one block of `period` ids repeated min_repeats times."""
    n = period * min_repeats
    if len(ids) < n:
        return False
    tail = ids[-n:]
    return tail[:-period] == tail[period:]  # a sequence has period p iff it equals itself shifted by p


class RepetitionStop:
    """Stop when the generated ids end in a block of 1..max_period tokens repeated min_repeats times.

    The check after each token compares a few list slices (C speed), about 10-50 us, so it can run
    inside the decode loop. Real code repeats itself too (three identical lines are rare but legal),
    so a larger min_repeats trades later stops for fewer false alarms.
    """

    def __init__(self, max_period: int = 64, min_repeats: int = 3):
        _check_int("max_period", max_period, 1)
        _check_int("min_repeats", min_repeats, 2)
        self.max_period, self.min_repeats = max_period, min_repeats
        self.period: int | None = None  # set when it fires
        self.at: int | None = None  # number of generated tokens when it fired

    def __call__(self, generated: list[int]) -> bool:
        for p in range(1, min(self.max_period, len(generated) // self.min_repeats) + 1):
            if ends_in_loop(generated, p, self.min_repeats):
                self.period, self.at = p, len(generated)
                return True
        return False

    def __repr__(self):
        return f"RepetitionStop(max_period={self.max_period}, min_repeats={self.min_repeats})"


class TextStop:
    """Stop as soon as any of `stops` appears in the decoded text of the generated tokens.

    Matching text rather than token ids matters: the tokenizer may merge a stop string with its
    neighbours ("\\n\\n" followed by indentation is a single token), so an id-level stop sequence can
    miss it. Only the last few tokens are decoded each step: a stop string of m bytes lies within the
    last m tokens when it is completed.
    """

    def __init__(self, tokenizer, stops):
        if isinstance(stops, str):
            stops = [stops]
        stops = list(stops)
        if not stops or not all(isinstance(s, str) and s for s in stops):
            raise ValueError(f"stops must be a non-empty list of non-empty strings; got {stops!r}")
        self.tokenizer, self.stops = tokenizer, stops
        self.lookback = max(len(s.encode("utf-8")) for s in stops)
        self.matched: str | None = None  # the stop string that fired

    def __call__(self, generated: list[int]) -> bool:
        text = self.tokenizer.decode(generated[-self.lookback:])
        for s in self.stops:
            if s in text:
                self.matched = s
                return True
        return False

    def __repr__(self):
        return f"TextStop({self.stops!r})"


def cut_at_stop_string(text: str, stops) -> str:
    """The text before the earliest occurrence of any stop string (all of it if none occurs)."""
    if isinstance(stops, str):
        stops = [stops]
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


def find_loop(ids, max_period: int = 64, min_repeats: int = 3) -> tuple[int, int] | None:
    """(start, period) of the loop a sequence ends in, or None.

    For each period p <= max_period, the periodic tail is extended backwards as far as it goes
    (ids[i] == ids[i + p]); it counts as a loop if it covers at least min_repeats * p ids. The
    longest loop wins (earliest start), then the shortest period. A measurement for finished
    sequences: it scans the whole sequence, unlike RepetitionStop.
    """
    _check_int("max_period", max_period, 1)
    _check_int("min_repeats", min_repeats, 2)
    ids = list(ids.tolist() if hasattr(ids, "tolist") else ids)
    n, best = len(ids), None
    for p in range(1, max_period + 1):
        i = n - p - 1
        while i >= 0 and ids[i] == ids[i + p]:
            i -= 1
        start = i + 1
        if n - start >= min_repeats * p and (best is None or start < best[0]):
            best = (start, p)
    return best
