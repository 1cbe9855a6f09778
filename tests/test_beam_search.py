"""helpers.beam_search against HuggingFace's generate(num_beams=..., do_sample=False) on the same weights.

The oracle is exact: both sides run the same float32 operations on identical logits (sdpa attention
gives bit-identical logits, see hf.py), so the tokens must be identical, not merely close.
Random-weight models make near-ties rare; an end-of-text id that the model actually produces makes
hypotheses finish at different lengths, so length_penalty and early_stopping change the result.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import random_model
from transformers import LogitsProcessorList

from helpers.beam_search import beam_search, continuation_log_prob
from helpers.generate import generate
from helpers.model import ModelConfig

PROMPT = torch.tensor([[1, 2, 3, 4, 5]])
WIDTHS = [2, 3, 5]
PENALTIES = [1.0, 0.0, 2.0, -1.0]
STOPPING = [False, True, "never"]


@pytest.fixture(scope="module")
def models():
    from helpers.hf import to_hf_llama

    model = random_model(ModelConfig.from_preset("tiny"))
    return model, to_hf_llama(model)


def hf_beam(hf, prompt, n, K, lp, es, eos, processors=()):
    with torch.no_grad():
        return hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=n,
            num_beams=K,
            do_sample=False,
            length_penalty=lp,
            early_stopping=es,
            eos_token_id=eos,
            pad_token_id=eos,
            logits_processor=LogitsProcessorList(list(processors)),
        )


def eos_candidates(model):
    """Tokens the greedy continuation uses: as end-of-text they finish some hypotheses, not all."""
    greedy = generate(model, PROMPT, 12)[0, PROMPT.shape[1] :].tolist()
    return list(dict.fromkeys(greedy))[:3]


@pytest.mark.parametrize("K", WIDTHS)
def test_tokens_equal_hf_for_widths_penalties_and_stopping(models, K):
    model, hf = models
    outputs = set()
    grid = [(None, 1.0, False)] + list(itertools.product(eos_candidates(model)[:2], PENALTIES, STOPPING))
    for eos, lp, es in grid:
        ours = beam_search(model, PROMPT, 20, K, length_penalty=lp, early_stopping=es, eos_id=eos)
        theirs = hf_beam(hf, PROMPT, 20, K, lp, es, eos)
        assert torch.equal(ours, theirs), (K, lp, es, eos)
        outputs.add((eos, tuple(ours[0].tolist())))
    # the grid is not degenerate: with end-of-text, the settings pick outputs of different lengths
    lengths = {len(o) for eos, o in outputs if eos is not None}
    assert len(lengths) >= 2


def test_beam_one_is_greedy_and_wider_beams_score_at_least_as_high_here(models):
    model, _ = models
    greedy = generate(model, PROMPT, 16)
    assert torch.equal(beam_search(model, PROMPT, 16, 1), greedy)
    T = PROMPT.shape[1]
    scores = [continuation_log_prob(model, beam_search(model, PROMPT, 16, K), T) for K in (1, 4)]
    assert scores[1] >= scores[0] - 1e-4  # not a theorem for beam search, but true on this model and prompt


def test_return_score_is_the_length_penalised_sum(models):
    model, _ = models
    eos = eos_candidates(model)[0]
    out, score = beam_search(model, PROMPT, 20, 3, length_penalty=2.0, eos_id=eos, return_score=True)
    T = PROMPT.shape[1]
    n = out.shape[1] - T
    assert abs(score - continuation_log_prob(model, out, T) / n**2.0) < 1e-4


def test_with_a_logits_processor_equal_hf(models):
    """A processor that bans every odd token id, called on log-probabilities as HF does."""
    model, hf = models

    def even_only(ids, logits):
        banned = torch.zeros(logits.shape[-1], dtype=torch.bool)
        banned[1::2] = True
        return logits.masked_fill(banned, float("-inf"))

    for K in (2, 4):
        ours = beam_search(model, PROMPT, 12, K, logits_processors=[even_only])
        assert torch.equal(ours, hf_beam(hf, PROMPT, 12, K, 1.0, False, None, [even_only]))
        assert (ours[0, PROMPT.shape[1] :] % 2 == 0).all()


def test_course_model_newline_as_end_equal_hf(shipped):
    """The shipped model, one line of code per hypothesis ('\\n' ends it): identical to HF."""
    from helpers.hf import to_hf_llama

    target, _, tok = shipped
    hf = to_hf_llama(target)
    prompt = torch.tensor([tok.encode("import os\n\ndef main():\n    path = ", bos=True)])
    newline = tok.encode("\n")[0]
    for K, lp in [(2, 1.0), (4, 0.0), (4, 2.0)]:
        ours = beam_search(target, prompt, 24, K, length_penalty=lp, eos_id=newline)
        assert torch.equal(ours, hf_beam(hf, prompt, 24, K, lp, False, newline))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(num_beams=0), "num_beams"),
        (dict(num_beams=2.0), "num_beams"),
        (dict(num_beams=True), "num_beams"),
        (dict(length_penalty=float("nan")), "length_penalty"),
        (dict(length_penalty="1"), "length_penalty"),
        (dict(early_stopping="always"), "early_stopping"),
        (dict(early_stopping=1), "early_stopping"),
        (dict(eos_id=10_000), "eos_id"),
        (dict(logits_processors=[3]), "logits_processors"),
    ],
)
def test_bad_settings_name_the_parameter(models, kwargs, name):
    model, _ = models
    args = dict(num_beams=2) | kwargs
    with pytest.raises(ValueError, match=name):
        beam_search(model, PROMPT, 4, **args)


def test_batch_and_length_are_checked(models):
    model, _ = models
    with pytest.raises(ValueError, match="batch size 1"):
        beam_search(model, PROMPT.repeat(2, 1), 4, 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        beam_search(model, PROMPT, model.cfg.max_seq_len, 2)
    assert torch.equal(beam_search(model, PROMPT, 0, 2), PROMPT)
