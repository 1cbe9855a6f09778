"""Checks for chapter 14's exercises (the serving API). Worked solutions:
notebooks/solutions/14_serving_api_solutions.ipynb. Each check prints one line (a prediction also says what was
measured) and returns nothing."""

from __future__ import annotations

import math

from . import FROM_NOTEBOOK, exercise, prediction

SYSTEM = "You write short Python functions."  # the chapter's conversation (section 7)
EXCHANGE = [
    {"role": "user", "content": "Reverse a string."},
    {"role": "assistant", "content": "def reverse(s):\n    return s[::-1]"},
]

# conversations a Llama 3 template must render exactly as the real one does (whitespace to trim included)
LLAMA3_CASES = [
    ([{"role": "user", "content": "hi"}], True),
    ([{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": "Sum a list."}], True),
    (
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "def f():\n    pass\n"},
            {"role": "user", "content": "again"},
        ],
        False,
    ),
]


def check_1(answer=FROM_NOTEBOOK) -> None:
    """llama3_template: a Jinja source string that renders conversations as LLAMA3_TEMPLATE does."""
    from ...serving.chat_template import LLAMA3_TEMPLATE, render

    def right(template):
        assert isinstance(template, str), f"a Jinja template as a str; got {type(template).__name__}"
        for messages, gen in LLAMA3_CASES:
            got, want = render(template, messages, gen), render(LLAMA3_TEMPLATE, messages, gen)
            if got != want:
                where = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                raise AssertionError(
                    f"for {len(messages)} message(s), add_generation_prompt={gen}, the text "
                    f"differs from character {where}: {got[where : where + 24]!r}"
                )
        return True

    exercise(
        "14.1",
        answer,
        right,
        name="llama3_template",
        hint="{% for m in messages %}...{% endfor %}, the trim filter, and {% if add_generation_prompt %}",
        notice="one template string is the whole difference between two chat formats; a model only "
        "answers well in the one it was tuned on",
    )


def chat_overhead(tok, n_exchanges: int, specials: dict | None) -> int:
    """Tokens ChatML adds (with <|bos|> first when markers are text, as the server adds it) to the system
    message and n exchanges: the prompt's tokens minus the messages' own."""
    from ...serving.chat_template import chat_token_ids

    messages = [{"role": "system", "content": SYSTEM}] + EXCHANGE * n_exchanges
    ids = chat_token_ids(tok, messages, specials=specials)
    if specials == {}:
        ids = [tok.bos_id] + ids
    return len(ids) - sum(len(tok.encode(m["content"])) for m in messages)


def check_2(answer=FROM_NOTEBOOK) -> None:
    """markers_as_text_40: ChatML's overhead with markers as text for 40 exchanges."""
    from ...checkpoint import load_tokenizer

    tok = load_tokenizer()
    want = chat_overhead(tok, 40, {})

    def right(a):
        assert isinstance(a, int) and not isinstance(a, bool), "an int (a number of tokens)"
        return a == want

    def notice(a):
        special = chat_overhead(tok, 40, None)
        return (
            f"with special tokens the same conversation carries {special} tokens of template: markers "
            f"tokenized as text cost {a / special:.1f}x as much, and are resent with every turn"
        )

    exercise(
        "14.2",
        answer,
        right,
        name="markers_as_text_40",
        notice=notice,
        hint="the cost is linear in the number of exchanges: the N = 1 value plus 39 times the per-exchange cost",
    )


def check_3(answer=FROM_NOTEBOOK) -> None:
    """per_client_itl(C, X): Little's law, seconds between two tokens of one client."""

    def stub(f):  # the exercise cell's function, its body still `return ...`
        return callable(f) and f(1, 1.0) is ...

    def right(f):
        assert callable(f), "a function of C and X"
        return all(math.isclose(f(c, x), c / x, rel_tol=1e-9) for c, x in [(1, 250.0), (16, 900.0), (32, 1200.0)])

    exercise(
        "14.3",
        answer,
        right,
        name="per_client_itl",
        stub=stub,
        hint="C tokens are in flight at any moment; X leave per second",
        notice="a client's wait per token grows with C unless X grows as fast: batching makes X grow, but "
        "less than C once the step is no longer cheap",
    )


def check_4(measure, answer=FROM_NOTEBOOK) -> None:
    """predicted_tokens_per_s_8: a prediction of the server's total tokens/s at 8 clients, checked by `measure()`."""

    def notice(measured):
        return (
            f"by Little's law each of the 8 clients then waits {8 / measured * 1e3:.1f} ms per token on average; "
            "throughput grows with the clients, but by less than their number"
        )

    prediction(
        "14.4",
        answer,
        measure,
        unit="tokens/s",
        within=(0.5, 2.0),
        name="predicted_tokens_per_s_8",
        notice=notice,
        hint="between 4 and 16 clients, on a log scale of clients: 8 is their geometric mean",
    )
