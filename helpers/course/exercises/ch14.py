"""Checks for chapter 14's exercises (worked solutions: notebooks/solutions/14_serving_api_solutions.ipynb)."""
from __future__ import annotations

import math

from . import FROM_NOTEBOOK, exercise


def check_1(answer=FROM_NOTEBOOK):
    def right(a):
        from ...checkpoint import load_tokenizer
        from ...serving.chat_template import render_chat

        tok = load_tokenizer()
        full = len(tok.encode(render_chat([{"role": "user", "content": "hi"}]), bos=True))
        assert isinstance(a, int) and not isinstance(a, bool), "an int (a number of tokens)"
        return a == full - len(tok.encode("hi"))
    return exercise("14.1", answer, right, hint="render_chat([{'role': 'user', 'content': 'hi'}])",
                    name="template_overhead")


def check_2(answer=FROM_NOTEBOOK):
    def right(a):
        from ...serving.openai_api import CompletionRequest

        assert isinstance(a, dict), "a dict: the JSON body"
        req = CompletionRequest(**a)  # raises (a wrong answer) if the server would refuse it
        return (req.model == "course-target" and req.temperature == 0.8 and req.top_p == 0.9
                and req.max_tokens == 48 and req.extensions.repetition_penalty == 1.1)
    return exercise("14.2", answer, right, hint="the server's extensions object", name="roleplay_body")


def check_3(answer=FROM_NOTEBOOK):
    def stub(f):  # the exercise cell's function, its body still `return ...`
        return callable(f) and f(1, 1.0) is ...

    def right(f):
        assert callable(f), "a function of C and X"
        return all(math.isclose(f(c, x), c / x, rel_tol=1e-9) for c, x in [(1, 250.0), (16, 900.0), (32, 1200.0)])
    return exercise("14.3", answer, right, hint="C tokens are in flight; X leave per second", name="per_client_itl",
                    stub=stub)
