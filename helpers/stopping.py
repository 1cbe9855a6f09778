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
    StopChecker(eos_id, stop_sequences, criteria) all of a loop's stop conditions after each new token: every
                                                  decode loop (generate, the serving engine) uses this one

Out of scope: confidence-based early exit (that skips layers, it does not end generation) and
beam-search "early stopping".
"""

from __future__ import annotations

import torch


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
        text = self.tokenizer.decode(generated[-self.lookback :])
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


class StopChecker:
    """Decides after each new token whether generation is over (end-of-text, a stop sequence, or a
    stop criterion: a callable that gets the generated ids and returns True to stop)."""

    def __init__(self, eos_id: int | None = None, stop_sequences=(), stop_criteria=()):
        self.eos_id = eos_id
        self.stop_sequences = as_stop_sequences(stop_sequences)
        self.stop_criteria = list(stop_criteria)
        if not all(callable(c) for c in self.stop_criteria):
            raise ValueError("stop_criteria must be callables criterion(generated_ids) -> bool")
        self.reason = None

    def __call__(self, generated: list[int]) -> bool:
        if self.eos_id is not None and generated and generated[-1] == self.eos_id:
            self.reason = "eos"
        for s in self.stop_sequences:
            if len(generated) >= len(s) and generated[-len(s) :] == s:
                self.reason = "stop_sequence"
        if self.reason is None:
            for criterion in self.stop_criteria:
                if criterion(generated):
                    self.reason = criterion
                    break
        return self.reason is not None


def as_stop_sequences(stop_sequences) -> list[list[int]]:
    """stop_sequences as lists of ints. A string would otherwise be taken apart into characters that never
    equal a token id, so the stop would silently never fire."""
    text_stop = (
        "stop_sequences must be lists of token ids, e.g. [tok.encode('\\n')]; to stop at a string "
        "use stop_criteria=[TextStop(tok, [...])] from helpers.stopping"
    )
    if isinstance(stop_sequences, (str, bytes)) or any(isinstance(s, (str, bytes)) for s in stop_sequences):
        raise ValueError(f"{text_stop}; got a string in {stop_sequences!r}")
    out = []
    for s in stop_sequences:
        s = s.tolist() if isinstance(s, torch.Tensor) else s
        if not isinstance(s, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in s):
            raise ValueError(f"{text_stop}; got {s!r} (a list of sequences is needed even for one: [[id, ...]])")
        if len(s) == 0:
            raise ValueError("stop_sequences must not contain an empty sequence")
        out.append(list(s))
    return out


def stop_checker(batch_size, eos_id, stop_sequences, stop_criteria=()):
    """A StopChecker for a batch-1 loop, None when there is nothing to check; refuses batch size > 1 (one
    checker follows one sequence; the serving engine gives each request its own)."""
    if eos_id is None and not stop_sequences and not stop_criteria:
        return None
    if batch_size != 1:
        raise ValueError(f"eos_id / stop_sequences / stop_criteria need batch size 1; got batch size {batch_size}")
    return StopChecker(eos_id, stop_sequences, stop_criteria)
