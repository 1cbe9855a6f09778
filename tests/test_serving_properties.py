"""Liveness and isolation of the serving engine as properties, over workloads hypothesis draws.

Drawn: pool size, block size, max_num_seqs, token budget, policy, prefix caching, chunked prefill, prompt
and output lengths (prompts share prefixes, to exercise the prefix cache), and an order of events:
submit a request, run a few steps, cancel a request. For every drawn workload:

- a request that can never fit the pool is refused at submit (InvalidParameter), nothing else is;
- the engine finishes within sum(prompt tokens + max_tokens) steps over the accepted requests (the
  bound engine.py states: the oldest running request computes a token every step and is never preempted);
- every request ends, finished or cancelled, and the pool is whole again (every block free, no reference);
- every greedy request that was not cancelled equals `generate` on it alone, token for token.

The model is a tiny random one in float64, so that batching cannot flip a greedy token by rounding and
outputs are compared exactly; a few examples run the shipped model too. CI runs a fixed, derandomized
set of examples (`CI` below), so every run draws the same workloads; set LLM_COURSE_HYPOTHESIS_EXAMPLES to
explore more (derandomized too, so a failure it finds comes back on the next run).
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import random_model
from hypothesis import HealthCheck, given, settings, target
from hypothesis import event as note_event
from hypothesis import strategies as st

from helpers import generate
from helpers.model import ModelConfig
from helpers.serving import Engine
from helpers.serving.params import InvalidParameter

CTX = 48  # the tiny model's context window
CI = settings(
    max_examples=int(os.environ.get("LLM_COURSE_HYPOTHESIS_EXAMPLES", "30")),
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def tiny():
    cfg = ModelConfig.from_preset("tiny", max_seq_len=CTX)
    return random_model(cfg, seed=0, dtype=torch.float64)


@st.composite
def workloads(draw, vocab: int, ctx: int, policy: str):
    shared = draw(st.lists(st.integers(0, vocab - 1), min_size=ctx, max_size=ctx))  # prompts start alike
    requests = []
    for _ in range(draw(st.integers(1, 8))):
        n_shared = draw(st.integers(0, 30))
        tail = draw(st.lists(st.integers(0, vocab - 1), min_size=0 if n_shared else 1, max_size=12))
        prompt = (shared[:n_shared] + tail)[: ctx - 1]
        requests.append((prompt, draw(st.integers(1, min(30, ctx - len(prompt))))))
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    largest = max(-(-(len(p) + n - 1) // block_size) for p, n in requests)
    chunked = draw(st.booleans())
    engine = dict(  # pools around the largest request's need: tight ones preempt, smaller ones refuse it
        num_blocks=max(1, largest + draw(st.integers(-2, 4))),
        block_size=block_size,
        max_num_seqs=draw(st.integers(1, 5)),
        policy=policy,
        enable_prefix_caching=draw(st.booleans()),
        chunked_prefill=chunked,
        max_num_batched_tokens=draw(st.integers(1, 40)) if chunked else draw(st.sampled_from([None, ctx, 2 * ctx])),
    )
    events = draw(
        st.lists(
            st.one_of(st.tuples(st.just("steps"), st.integers(1, 4)), st.tuples(st.just("cancel"), st.integers(0, 7))),
            max_size=8,
        )
    )
    order = draw(st.permutations(["submit"] * len(requests) + [e for e in events]))
    return engine, requests, order


def fits(prompt, max_tokens, num_blocks, block_size) -> bool:
    return -(-(len(prompt) + max_tokens - 1) // block_size) <= num_blocks


def run_workload(model, engine_kw, requests, order, recorders: bool = False):
    """Replay the events; returns (engine, [(prompt, max_tokens, request id or None if refused)], bound)."""
    engine = Engine(model, **engine_kw)
    submitted, pending = [], list(requests)
    for event in order:
        if event == "submit":
            prompt, max_tokens = pending.pop(0)
            try:
                rid = engine.submit(prompt, max_tokens)
            except InvalidParameter as e:
                assert not fits(prompt, max_tokens, engine_kw["num_blocks"], engine_kw["block_size"]), e
                assert e.param in ("prompt", "max_tokens") and "could never run" in str(e)
                rid = None
            else:
                assert fits(prompt, max_tokens, engine_kw["num_blocks"], engine_kw["block_size"])
            submitted.append((prompt, max_tokens, rid))
        elif event[0] == "steps":
            for _ in range(event[1]):
                engine.step()
        elif submitted and submitted[event[1] % len(submitted)][2] is not None:
            engine.cancel(submitted[event[1] % len(submitted)][2])
    bound = sum(len(p) + n for p, n, rid in submitted if rid is not None)
    for _ in range(bound + 1):  # never an endless loop: a livelock fails the bound below instead
        if not engine.has_unfinished():
            break
        engine.step()
    assert not engine.has_unfinished(), f"still running after {engine.num_steps} steps (bound {bound})"
    assert engine.num_steps <= bound, (engine.num_steps, bound)
    assert engine.pool.num_free == engine.pool.num_blocks and not any(engine.pool.ref_count)
    return engine, submitted


def check_outputs(model, engine, submitted):
    for prompt, max_tokens, rid in submitted:
        if rid is None:
            continue
        r = engine.get(rid)
        assert r.finish_reason in ("length", "cancelled"), r.finish_reason
        if r.finish_reason == "length":
            ref = generate(model, prompt, max_tokens)[0, len(prompt) :].tolist()
            assert r.output == ref, (prompt, max_tokens)


@pytest.mark.parametrize("policy", ["continuous", "static"])
@CI
@given(data=st.data())
def test_every_workload_finishes_within_the_bound_and_equals_generate(tiny, policy, data):
    engine_kw, requests, order = data.draw(workloads(tiny.cfg.vocab_size, CTX, policy))
    engine, submitted = run_workload(tiny, engine_kw, requests, order)
    check_outputs(tiny, engine, submitted)
    target(float(engine.scheduler.num_preemptions), label="preemptions")  # steer the search to tight pools
    # what the drawn workloads exercised (pytest --hypothesis-show-statistics)
    note_event(f"preempted: {engine.scheduler.num_preemptions > 0}")
    note_event(f"refused at submit: {any(rid is None for *_, rid in submitted)}")
    note_event(f"cancelled: {any(rid and engine.get(rid).finish_reason == 'cancelled' for *_, rid in submitted)}")
    note_event(f"prefix-cache hits: {engine.pool.hits > 0}")


SHIPPED_CASES = [  # the review's reproducers and tight pools, on the shipped model
    (dict(num_blocks=40, block_size=16, max_num_seqs=2, policy="static"), [(10, 2), (10, 300), (10, 5)]),
    (
        dict(num_blocks=12, block_size=4, max_num_seqs=4, policy="static", enable_prefix_caching=True),
        [(9, 30), (17, 12), (5, 40), (30, 6)],
    ),
    (dict(num_blocks=10, block_size=8, max_num_seqs=3, max_num_batched_tokens=5), [(40, 30), (3, 20), (25, 30)]),
    (dict(num_blocks=16, block_size=16, max_num_seqs=8, chunked_prefill=False), [(100, 40)] * 4),
]


@pytest.mark.parametrize("engine_kw,shape", SHIPPED_CASES)
def test_tight_pools_on_the_shipped_model(shipped, engine_kw, shape):
    from test_serving import LogitRecorder, check_against_reference

    model, _, tok = shipped
    text = tok.encode("import os\nimport sys\n\n\ndef main(argv):\n    parser = argparse.ArgumentParser()\n" * 8)
    prompts = [text[7 * i : 7 * i + n] for i, (n, _) in enumerate(shape)]
    engine = Engine(model, **engine_kw)
    recorders = [LogitRecorder() for _ in prompts]
    ids = [engine.submit(p, m, logits_processors=[rec]) for p, (_, m), rec in zip(prompts, shape, recorders)]
    bound = sum(n + m for n, m in shape)
    while engine.has_unfinished() and engine.num_steps <= bound:
        engine.step()
    assert not engine.has_unfinished() and engine.num_steps <= bound
    assert engine.pool.num_free == engine.pool.num_blocks
    refs = [generate(model, p, m)[0, len(p) :].tolist() for p, (_, m) in zip(prompts, shape)]
    check_against_reference(model, prompts, refs, [engine.get(i).output for i in ids], recorders)
