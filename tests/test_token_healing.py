"""Token healing: what it backs up, which tokens it allows, and that the healed text keeps the prompt."""

import pytest
import torch

from helpers import load_tokenizer
from helpers.token_healing import generate_healed, heal_prompt, healing_mask


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_heal_prompt_backs_up_the_last_token(tok):
    ids = tok.encode("x = 1\n    ", bos=True)
    kept, removed = heal_prompt(tok, ids)
    assert kept == ids[:-1] and removed == tok.vocab[ids[-1]]
    kept2, removed2 = heal_prompt(tok, ids, n_back=2)
    assert kept2 == ids[:-2] and removed2 == tok.vocab[ids[-2]] + tok.vocab[ids[-1]]


def test_heal_prompt_refuses_bad_input(tok):
    with pytest.raises(ValueError, match="n_back"):
        heal_prompt(tok, tok.encode("abc"), n_back=0)
    with pytest.raises(ValueError, match="cannot back up"):
        heal_prompt(tok, [tok.bos_id], n_back=1)  # the begin-of-text token spells nothing
    with pytest.raises(ValueError, match="ids must be one sequence"):
        heal_prompt(tok, torch.tensor([tok.encode("abc")]))  # a (B, T) batch, not one sequence
    with pytest.raises(ValueError, match="ids must be one sequence"):
        heal_prompt(tok, "abc")
    assert heal_prompt(tok, torch.tensor(tok.encode("ab c")))[1] == b" c"
    with pytest.raises(ValueError, match="special token"):
        heal_prompt(tok, tok.encode("abc", eos=True))


def test_healing_mask_allows_tokens_that_agree_with_the_removed_bytes(tok):
    def allowed(remaining):
        return {tok.vocab[i] for i in healing_mask(tok, remaining).nonzero().flatten().tolist()}

    space = allowed(b" ")
    assert b" " in space and tok.vocab[tok.encode(" return")[0]] in space and b"a" not in space
    assert all(b.startswith(b" ") for b in space)
    indent = allowed(b"\n    ")
    assert {b"\n", b"\n   ", b"\n    "} <= indent  # prefixes of the removed bytes ...
    assert all(b.startswith(b"\n    ") or b"\n    ".startswith(b) for b in indent)  # ... or extensions
    assert healing_mask(tok, b" ").shape == (tok.vocab_size,)
    assert not healing_mask(tok, b" ")[[tok.bos_id, tok.eos_id]].any()
    with pytest.raises(ValueError, match="remaining"):
        healing_mask(tok, b"")


def test_generate_healed_keeps_the_prompt_text(shipped):
    model, _, tok = shipped
    for prompt in ["def add(a, b):\n    return ", "def add(a, b):\n    ", "import os\nimport "]:
        ids = tok.encode(prompt, bos=True)
        out = generate_healed(model, tok, ids, max_new_tokens=5)
        assert tok.decode(out).startswith(prompt)
        kept, _ = heal_prompt(tok, ids)
        assert out[: len(kept)] == kept and len(out) >= len(ids) - 1 + 5


def test_generate_healed_is_greedy_decoding_of_the_constrained_prefix(shipped):
    model, _, tok = shipped
    ids = tok.encode("def add(a, b):\n    return ", bos=True)
    out = generate_healed(model, tok, ids, max_new_tokens=0)
    kept, removed = heal_prompt(tok, ids)
    with torch.no_grad():
        logits = model(torch.tensor([kept]))[0, -1]
    logits[~healing_mask(tok, removed)] = float("-inf")
    assert out == kept + [int(logits.argmax())]
