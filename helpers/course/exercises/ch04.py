"""Checks for chapter 04's exercises (the autoregressive loop). Worked solutions:
notebooks/solutions/04_autoregressive_loop_solutions.ipynb. Each check prints one line (a prediction also says
what was measured) and returns nothing."""

from __future__ import annotations

from . import FROM_NOTEBOOK, exercise, prediction

# texts whose lines repeat or not in the ways a line-repeat stop must tell apart
LINE_CASES = [
    "a = 1\nb = 2\na = 1\n",
    "x = 1\n\n\ny = 2\n\n",
    "    pass\n        pass\n",
    "abc\nabcd\nab",
    "for i in x:\n    print(i)\nfor i in x:",
    "\n\n\n",
    "return\n    return\n",
]


def repeats_a_line(text: str) -> bool:
    """True when a non-blank complete line (a newline follows it) appears twice, compared without the
    whitespace around it."""
    seen = set()
    for line in (piece.strip() for piece in text.split("\n")[:-1]):  # the last piece has no newline yet
        if line in seen:
            return True
        if line:
            seen.add(line)
    return False


def check_1(model, tok, answer=FROM_NOTEBOOK) -> None:
    """RepeatedLine(tok)(generated_ids) -> bool: fires once the generated text repeats a complete line."""
    from ...generate import generate

    prompt = tok.encode("def fibonacci(n):", bos=True)
    looping = generate(model, prompt, 40)[0, len(prompt) :].tolist()  # greedy: repeats "    return n"
    sequences = [looping] + [tok.encode(text) for text in LINE_CASES]

    def right(cls):
        for ids in sequences:
            stop = cls(tok)
            for k in range(len(ids) + 1):  # every prefix, in order, as generate calls it
                want = repeats_a_line(tok.decode(ids[:k]))
                assert bool(stop(ids[:k])) == want, (
                    f"after {k} tokens of {tok.decode(ids)[:40]!r} it should {'' if want else 'not '}fire"
                )
        stop = cls(tok)
        out = generate(model, prompt, 100, stop_criteria=[stop])[0, len(prompt) :].tolist()
        assert len(out) < 100, "given to generate(stop_criteria=[...]), it never stopped a greedy loop"
        return True

    exercise(
        "04.1",
        answer,
        right,
        hint="decode the generated ids, split at '\\n', keep the complete lines, strip "
        "them, and look for a non-blank one seen before",
        name="RepeatedLine",
    )


def check_2(model, prompt, answer=FROM_NOTEBOOK) -> None:
    """A prediction checked by a measurement: seconds of generate(model, prompt, 64)."""
    from ...generate import generate
    from ...measure.timing import median, time_call

    prediction(
        "04.2",
        answer,
        lambda: median(time_call(lambda: generate(model, prompt, 64), model.device, repeats=3)),
        within=(0.5, 2),
        unit="s",
        hint="one prefill of the prompt gives the first token; each further token is one decode step",
        notice="a generation is one TTFT and then one TPOT per further token",
        name="predicted_s",
    )


def check_3(answer=FROM_NOTEBOOK) -> None:
    """Dense work (in positions) without / with a cache, for 100 tokens after a 400-token prompt."""
    expected = sum(400 + k for k in range(100)) / (400 + 99)
    exercise(
        "04.3",
        answer,
        lambda a: abs(float(a) - expected) < 1e-9,
        name="dense_ratio_after_prompt",
        hint="without a cache step k processes 400 + k - 1 positions; with one, a prefill of 400, then 1 a step",
    )
