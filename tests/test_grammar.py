"""helpers.regex_automaton and helpers.grammar: the automaton against Python's `re`, the token masks
against a brute-force walk and against xgrammar (the same regular expression compiled for the same
vocabulary), constrained outputs that always parse, and clear errors for grammars that cannot work."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch

from helpers.generate import generate
from helpers.grammar import GrammarProcessor, TokenGrammar, json_object_pattern, token_bytes
from helpers.regex_automaton import compile_regex
from helpers.sampling import SamplingConfig

PATTERNS = [
    r"ab|b{4}",
    r"[a-c]+x?",
    r"(0|[1-9][0-9]*)(\.[0-9]+)?",
    r'"[ !#-\[\]-~]*"',
    r"a{2,4}",
    r"(?:ab)*c",
    r"\d+\s\w",
    r"[^a]b",
    r"x.y",
    r"[a\-z]",
    r"[\d.]+",
    r"a|",
    r"(a|b)*abb",
    r"é+",
    r"\{\}",
]
ALPHABET = 'abcxyz0129. "\\-{}\n'
CITY = json_object_pattern({"city": "string", "population": "integer", "capital": "boolean"})


@pytest.mark.parametrize("pattern", PATTERNS)
def test_automaton_agrees_with_re(pattern):
    dfa = compile_regex(pattern)
    rng = random.Random(0)
    alphabet = ALPHABET + ("é" if "é" in pattern else "")
    for _ in range(3000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7)))
        assert dfa.matches(s) == (re.fullmatch(pattern, s) is not None), s


def brute_force_mask(dfa, vocab, eos_id, state):
    """Walk each token's bytes one at a time from `state`: allowed iff it never dies."""
    allowed = torch.zeros(len(vocab), dtype=torch.bool)
    for i, data in enumerate(vocab):
        if data is None:
            allowed[i] = i == eos_id and bool(dfa.accepting[state])
        else:
            allowed[i] = dfa.step(state, data) != dfa.DEAD
    return allowed


@pytest.fixture(scope="module")
def tok():
    from helpers import load_tokenizer

    return load_tokenizer()


@pytest.mark.parametrize("pattern", [CITY, r"(0|[1-9][0-9]*)(\.[0-9]+)?", r"(a|b)*abb"])
def test_masks_equal_brute_force_in_every_state(tok, pattern):
    vocab = token_bytes(tok)
    grammar = TokenGrammar(compile_regex(pattern), vocab, tok.eos_id)
    for state in range(grammar.dfa.n_states):
        assert torch.equal(grammar.mask(state), brute_force_mask(grammar.dfa, vocab, tok.eos_id, state)), state


def xgrammar_mask(matcher, bitmask, vocab_size):
    matcher.fill_next_token_bitmask(bitmask)
    words = bitmask[0].numpy().view(np.uint32)  # bit j of word w is token 32 w + j
    bits = (words[:, None] >> np.arange(32, dtype=np.uint32)) & 1
    return torch.from_numpy(bits.astype(bool).reshape(-1)[:vocab_size])


@pytest.mark.parametrize(
    "pattern", [CITY, r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", r"(true|false|null)", r"\[([0-9]{1,3}(, [0-9]{1,3}){0,4})?\]"]
)
def test_masks_equal_xgrammar_along_random_walks(tok, pattern):
    xgr = pytest.importorskip("xgrammar")
    vocab = token_bytes(tok)
    info = xgr.TokenizerInfo(
        [b if b is not None else b"" for b in vocab],
        xgr.VocabType.RAW,
        vocab_size=tok.vocab_size,
        stop_token_ids=[tok.eos_id],
    )
    compiled = xgr.GrammarCompiler(info).compile_grammar(xgr.Grammar.from_regex(pattern))
    ours = TokenGrammar(compile_regex(pattern), vocab, tok.eos_id)
    rng = random.Random(0)
    checked = 0
    for _ in range(5):
        matcher = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, tok.vocab_size)
        state = 0
        while True:
            mask = ours.mask(state)
            assert torch.equal(mask, xgrammar_mask(matcher, bitmask, tok.vocab_size)), state
            checked += 1
            token = rng.choice(mask.nonzero().flatten().tolist())
            if token == tok.eos_id:
                break
            assert matcher.accept_token(token)
            state = int(ours.next_state[state, token])
    assert checked >= 10


def test_every_constrained_sample_parses(shipped):
    target, _, tok = shipped
    grammar = TokenGrammar(compile_regex(CITY), token_bytes(tok), tok.eos_id)
    prompt = tok.encode("answer = ", bos=True)
    n = 48
    proc = GrammarProcessor(grammar, len(prompt), max_new_tokens=n)
    out = generate(
        target,
        torch.tensor([prompt] * 32),
        n,
        sampling=SamplingConfig(temperature=1.5),
        generator=torch.Generator().manual_seed(0),
        logits_processors=[proc],
    )
    texts = [tok.decode(row[len(prompt) :]) for row in out]
    for text in texts:
        value = json.loads(text)
        assert list(value) == ["city", "population", "capital"] and isinstance(value["capital"], bool)
    assert len(set(texts)) > 20  # sampling still varies inside the grammar


def test_budget_forces_completion():
    """An unbounded pattern still ends complete when the budget runs out: tokens are one byte here."""
    vocab = [bytes([i]) for i in range(256)] + [None]
    grammar = TokenGrammar(compile_regex(r"\[(x, )*x\]"), vocab, eos_id=256)
    assert int(grammar.tokens_to_finish[0]) == 3
    g = torch.Generator().manual_seed(0)
    for budget in range(3, 12):
        proc = GrammarProcessor(grammar, prompt_len=1, max_new_tokens=budget)
        ids = torch.zeros(1, 1, dtype=torch.long)
        for _ in range(budget):
            logits = proc(ids, torch.randn(1, 257, generator=g))
            ids = torch.cat([ids, logits.softmax(-1).multinomial(1, generator=g)], dim=1)
            if ids[0, -1] == 256:
                break
        text = bytes(t for t in ids[0, 1:].tolist() if t < 256)
        assert grammar.dfa.matches(text), (budget, text)


@pytest.mark.parametrize(
    "pattern, message",
    [
        ("(ab", "missing '\\)'"),
        ("ab)", "unbalanced"),
        ("*a", "nothing to repeat"),
        ("a{3,1}", "max < min"),
        ("[abc", "missing '\\]'"),
        (r"a\1", "backreferences"),
        ("^a", "anchors"),
        (r"[^\x00-\x7f]", "matches no string"),
        ("a{1000}", "above 256"),
        ("a*?", "lazy"),
        ("a{", "repeat count"),
        ("(?=a)", "lookaround"),
        (3, "must be a str"),
    ],
)
def test_bad_grammar_says_why(pattern, message):
    with pytest.raises(ValueError, match=message):
        compile_regex(pattern)


def test_prompts_the_grammar_can_never_complete(tok):
    grammar = TokenGrammar(compile_regex(CITY), token_bytes(tok), tok.eos_id)
    with pytest.raises(ValueError, match="at byte 2"):
        GrammarProcessor(grammar, prompt_len=1, prefix='{"town": ')
    with pytest.raises(ValueError, match="needs at least"):
        GrammarProcessor(grammar, prompt_len=1, max_new_tokens=5)
    proc = GrammarProcessor(grammar, prompt_len=1, prefix='{"city": "')  # the prompt opened the object
    assert int(grammar.tokens_to_finish[proc.start]) < int(grammar.tokens_to_finish[0])
    bad = torch.tensor([[0] + tok.encode('Paris"}')])  # the object cannot end after the city
    with pytest.raises(ValueError, match="not allowed by the grammar"):
        proc(bad, torch.zeros(1, tok.vocab_size))
    with pytest.raises(ValueError, match="field"):
        json_object_pattern({"city": "date"})
    with pytest.raises(ValueError, match="eos_id"):
        TokenGrammar(compile_regex("a"), token_bytes(tok), eos_id=65)


def test_generate_refuses_a_processor_that_is_not_callable(shipped):
    target, _, _ = shipped
    with pytest.raises(ValueError, match="logits_processors"):
        generate(target, [1, 2], 3, logits_processors=["json"])
