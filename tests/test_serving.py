"""The serving engine (helpers/serving) against helpers.generate, request by request.

Every configuration below runs the same greedy requests through the engine and compares each output
with `generate` on that request alone. Batched matmuls and masked attention round differently from
batch-1 ones, so a greedy token may flip where the top two logits are within rounding of each other.
Where an output differs, the test proves that is what happened: at the first differing token it
compares the engine's logits (recorded by a logits processor) with the reference's, and requires
(a) the two logit vectors differ by no more than float32 rounding of this model (< 1e-3), and
(b) the reference's top-2 margin is within twice that difference (the most a flip can need).
Divergences are counted across the whole file and must stay rare.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import LogitRecorder

from helpers import generate, load_model
from helpers.sampling import SamplingConfig
from helpers.serving import BlockPool, Engine, block_hash, prefix_hashes

N_NEW = 16
DIVERGENCES = {"requests": 0, "diverged": 0}


@pytest.fixture(scope="module")
def model_and_prompts():
    torch.manual_seed(0)
    model, tok = load_model("target")
    from helpers.data import validation_text

    ids = tok.encode(validation_text()[:30_000])
    rng = random.Random(0)
    prompts = []
    for _ in range(10):
        n = rng.randint(3, 70)
        s = rng.randint(0, len(ids) - n)
        prompts.append(ids[s : s + n])
    shared = ids[100:148]  # 48 tokens: three full blocks of 16
    prompts += [shared + ids[1000 + 9 * j : 1000 + 9 * j + 5 + j] for j in range(4)]
    refs = [generate(model, p, N_NEW)[0, len(p) :].tolist() for p in prompts]
    return model, prompts, refs


def check_against_reference(model, prompts, refs, outputs, recorders):
    for p, ref, out, rec in zip(prompts, refs, outputs, recorders):
        DIVERGENCES["requests"] += 1
        assert len(out) == len(ref)
        if out == ref:
            continue
        j = next(i for i, (a, b) in enumerate(zip(out, ref)) if a != b)
        with torch.no_grad():
            ref_logits = model(torch.tensor([p + ref[:j]]), last_only=True)[0, -1]  # (V,)
        eng_logits = rec.rows[-1] if len(rec.rows) <= j else rec.rows[j]
        diff = (eng_logits - ref_logits).abs().max().item()
        top2 = ref_logits.topk(2).values
        margin = (top2[0] - top2[1]).item()
        assert diff < 1e-3, f"logits differ by {diff:.2e} at token {j}: not rounding, a bug"
        assert margin <= 2 * diff + 1e-7, f"token {j} flipped with a top-2 margin {margin:.2e} > 2 x {diff:.2e}"
        DIVERGENCES["diverged"] += 1


def run_engine(model, prompts, order=None, stagger=0, **kw):
    args = dict(num_blocks=256, block_size=16, max_num_seqs=8)
    args.update(kw)
    engine = Engine(model, **args)
    order = list(range(len(prompts))) if order is None else order
    recorders = [LogitRecorder() for _ in prompts]
    ids = {}
    for n, i in enumerate(order):
        ids[i] = engine.submit(prompts[i], N_NEW, logits_processors=[recorders[i]])
        for _ in range(stagger if n % 3 == 2 else 0):  # some requests arrive while others run
            engine.step()
    engine.run()
    assert engine.pool.num_free == engine.pool.num_blocks, "blocks leaked"
    assert all(c == 0 for c in engine.pool.ref_count)
    assert engine.cache.lengths == {}, "the paged cache kept a finished sequence's length"
    return engine, [engine.get(ids[i]).output for i in range(len(prompts))], recorders


CONFIGS = {
    "batch 8, block 16": dict(),
    "batch 1": dict(max_num_seqs=1),
    "batch 3, block 4, staggered": dict(max_num_seqs=3, block_size=4, stagger=2),
    "block 1, reversed": dict(block_size=1, order="reversed"),
    "tight pool: preemption": dict(num_blocks=24, block_size=4, max_num_seqs=8),
    "prefix caching": dict(enable_prefix_caching=True),
    "prefix caching, tight pool, block 8": dict(enable_prefix_caching=True, num_blocks=30, block_size=8),
    "chunked prefill, budget 7": dict(max_num_batched_tokens=7, order="shuffled", stagger=1),
    "no chunking": dict(chunked_prefill=False),
    "static batching": dict(policy="static", max_num_seqs=4),
    "gather attention (the dense-copy baseline)": dict(decode_attention="gather"),
    "compiled step": dict(compile_step=True),
    "compiled step, tight pool: preemption, block 4": dict(compile_step=True, num_blocks=24, block_size=4),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_engine_equals_generate_alone(model_and_prompts, name):
    model, prompts, refs = model_and_prompts
    kw = dict(CONFIGS[name])
    order = kw.pop("order", None)
    if order == "reversed":
        order = list(range(len(prompts)))[::-1]
    elif order == "shuffled":
        order = random.Random(1).sample(range(len(prompts)), len(prompts))
    engine, outputs, recorders = run_engine(model, prompts, order, **kw)
    check_against_reference(model, prompts, refs, outputs, recorders)
    m = engine.metrics()
    if kw.get("compile_step"):  # the compiled graph really ran the steps of two or more rows (compiled_step.py)
        rows = [s.num_tokens for s in engine.steps]
        assert engine.compiled.error is None and engine.compiled_steps == sum(n >= 2 for n in rows) > 0
    if "preemption" in name:
        assert m["preemptions"] > 0 and m["recomputed_tokens"] > 0
        assert sum(s.preempted for s in engine.steps) == m["preemptions"]
    if "prefix" in name:
        assert sum(engine.get(str(i)).num_cached_tokens for i in range(len(prompts))) >= 3 * 16


def test_divergences_are_rare():
    # runs after the parametrized tests in file order; printed with -s
    print(f"\nbatch-invariance divergences: {DIVERGENCES['diverged']} of {DIVERGENCES['requests']} requests")
    assert DIVERGENCES["diverged"] <= max(1, DIVERGENCES["requests"] // 10)


def test_prefix_cache_hit_skips_prefill(model_and_prompts):
    model, prompts, _ = model_and_prompts
    engine = Engine(model, num_blocks=64, block_size=16, enable_prefix_caching=True)
    first = engine.submit(prompts[-1], N_NEW)
    engine.run()
    second = engine.submit(prompts[-2], N_NEW)  # shares the 48-token prefix
    engine.run()
    assert engine.get(first).num_cached_tokens == 0
    assert engine.get(second).num_cached_tokens == 48


def test_block_pool_lru_and_refcounts():
    pool = BlockPool(4, enable_prefix_caching=True)
    a = pool.allocate(2)
    h = prefix_hashes(list(range(8)), 4)
    for b, hh in zip(a, h):
        pool.register(b, hh)
    pool.release(a)
    assert pool.num_free == 4
    assert pool.lookup(h) == a and pool.num_free == 2  # a hit takes the blocks back out of the free queue
    pool.release(a)
    pool.allocate(3)  # the two never-used blocks first, then the least recently freed: a[1] (freed first)
    assert pool.evictions == 1 and pool.lookup(h) == [a[0]]


def test_chained_hash_depends_on_the_parent():
    assert block_hash(b"", [1, 2]) != block_hash(block_hash(b"", [9, 9]), [1, 2])
    assert prefix_hashes([1, 2, 3, 4, 5], 2) == prefix_hashes([1, 2, 3, 4, 6], 2)  # last block is not full


def test_rejections_name_the_limit_before_taking_blocks(model_and_prompts):
    model, _, _ = model_and_prompts
    engine = Engine(model, num_blocks=8, block_size=16)
    with pytest.raises(ValueError, match="max_seq_len=1024"):
        engine.submit(list(range(1000)), 30)
    with pytest.raises(ValueError, match="num_blocks=8"):
        engine.submit(list(range(100)), 100)
    with pytest.raises(ValueError, match="max_tokens"):
        engine.submit([1, 2], 0)
    with pytest.raises(ValueError, match="prompt"):
        engine.submit([], 4)
    with pytest.raises(ValueError, match="token ids"):
        engine.submit([1, 99999], 4)
    with pytest.raises(ValueError, match="sampling"):
        engine.submit([1, 2], 4, sampling=0.7)
    assert engine.pool.num_free == 8 and not engine.has_unfinished()
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Engine(model, num_blocks=8, chunked_prefill=False, max_num_batched_tokens=64)


def test_cancel_frees_blocks(model_and_prompts):
    model, prompts, refs = model_and_prompts
    engine = Engine(model, num_blocks=64, block_size=4)
    a, b = engine.submit(prompts[0], N_NEW), engine.submit(prompts[1], N_NEW)
    for _ in range(4):
        engine.step()
    held = engine.pool.num_used
    engine.cancel(a)
    assert engine.get(a).finish_reason == "cancelled" and engine.pool.num_used < held
    engine.run()
    assert engine.get(b).output == refs[1] and engine.pool.num_free == 64
    waiting = engine.submit(prompts[2], N_NEW)
    engine.cancel(waiting)  # cancelled before it ever ran
    assert not engine.has_unfinished() and engine.pool.num_free == 64


def test_a_failing_stop_criterion_fails_only_its_request(model_and_prompts):
    model, prompts, refs = model_and_prompts

    def broken(generated):
        if len(generated) == 3:
            raise RuntimeError("criterion bug")
        return False

    engine = Engine(model, num_blocks=128)
    ok = [engine.submit(p, N_NEW) for p in prompts[:3]]
    bad = engine.submit(prompts[3], N_NEW, stop_criteria=[broken])
    engine.run()
    assert engine.get(bad).finish_reason == "error" and isinstance(engine.get(bad).error, RuntimeError)
    assert len(engine.get(bad).output) == 3
    assert [engine.get(r).output for r in ok] == refs[:3]
    assert engine.pool.num_free == 128


def test_stop_conditions_and_processors(model_and_prompts):
    model, prompts, refs = model_and_prompts
    engine = Engine(model, num_blocks=128)
    eos = engine.submit(prompts[0], N_NEW, eos_id=refs[0][4])
    seq = engine.submit(prompts[1], N_NEW, stop_sequences=[refs[1][2:4]])
    banned = refs[2][0]

    def ban(ids, logits):
        logits = logits.clone()
        logits[:, banned] = float("-inf")
        return logits

    proc = engine.submit(prompts[2], N_NEW, logits_processors=[ban])
    engine.run()
    assert engine.get(eos).output == refs[0][: refs[0].index(refs[0][4]) + 1]
    assert engine.get(eos).finish_reason == "eos"
    assert engine.get(seq).finish_reason == "stop_sequence"
    assert banned not in engine.get(proc).output


def test_seeded_sampling_is_reproducible_and_matches_generate(model_and_prompts):
    model, prompts, _ = model_and_prompts
    s = SamplingConfig(temperature=0.8, top_k=50)
    alone = Engine(model, num_blocks=64, max_num_seqs=1)
    r = alone.submit(prompts[0], N_NEW, sampling=s, seed=7)
    alone.run()
    g = generate(model, prompts[0], N_NEW, sampling=s, generator=torch.Generator().manual_seed(7))
    assert alone.get(r).output == g[0, len(prompts[0]) :].tolist()
    runs = []
    for _ in range(2):
        e = Engine(model, num_blocks=128)
        ids = [e.submit(p, N_NEW, sampling=s, seed=i) for i, p in enumerate(prompts[:4])]
        e.run()
        runs.append([e.get(i).output for i in ids])
    assert runs[0] == runs[1]


def test_static_batching_pads_to_the_longest(model_and_prompts):
    model, prompts, _ = model_and_prompts
    engine = Engine(model, num_blocks=128, max_num_seqs=4, policy="static")
    lengths = [4, 8, 12, 16]
    ids = [engine.submit(p, n) for p, n in zip(prompts[:4], lengths)]
    engine.run()
    assert [len(engine.get(i).output) for i in ids] == lengths
    assert [len(engine.get(i).padded) for i in ids] == [16 - n for n in lengths]  # rows kept running
    assert engine.pool.num_free == 128
    assert engine.cache.lengths == {}  # padded rows commit nothing: their KV is nobody's


def test_generate_takes_processors_and_a_step(model_and_prompts):
    model, prompts, refs = model_and_prompts
    from helpers.generate import decode_one_token

    seen = []

    def ban_first(ids, logits):
        seen.append(tuple(ids.shape))
        logits = logits.clone()
        logits[:, refs[0][0]] = float("-inf")
        return logits

    out = generate(model, prompts[0], 4, logits_processors=[ban_first])[0, len(prompts[0]) :].tolist()
    assert out[0] != refs[0][0] and seen == [(1, len(prompts[0]) + i) for i in range(4)]
    calls = []

    def counting_step(m, token, cache):
        calls.append(1)
        return decode_one_token(m, token, cache)

    assert generate(model, prompts[0], N_NEW, step=counting_step)[0, len(prompts[0]) :].tolist() == refs[0]
    assert len(calls) == N_NEW - 1
    with pytest.raises(ValueError, match="logits_processors"):
        generate(model, prompts[0], 2, logits_processors=ban_first)


# --- isolation: one request's failure is its own ----------------------------------------------------------
class FailsAt:
    """A logits processor that misbehaves on its n-th call: raises, or returns NaN, a wrong shape, all -inf."""

    def __init__(self, n: int, how: str):
        self.n, self.how, self.calls = n, how, 0

    def __call__(self, ids, logits):
        self.calls += 1
        if self.calls < self.n:
            return logits
        if self.how == "raises":
            raise RuntimeError("processor bug")
        if self.how == "nan":
            return torch.full_like(logits, float("nan"))
        if self.how == "shape":
            return logits[0]
        if self.how == "all -inf":  # what a grammar that allows no token does
            return torch.full_like(logits, float("-inf"))
        if self.how == "huge":  # a finite logit past what a penalty < 1 can keep in float32 (S-18)
            return logits.clamp(0, 1) * 1e37 + 3e38  # (1, V) in [3e38, 3.1e38]
        raise AssertionError(self.how)


def stop_raises_at(n):
    def criterion(generated):
        if len(generated) == n:
            raise RuntimeError("criterion bug")
        return False

    return criterion


def good_requests(prompts):
    """Greedy and seeded sampled requests, with and without penalties: the ones that must not change."""
    s = SamplingConfig(temperature=0.8, top_k=50)
    return [
        dict(prompt=prompts[0]),
        dict(prompt=prompts[1], sampling=s, seed=1),
        dict(prompt=prompts[4]),
        dict(prompt=prompts[5], sampling=SamplingConfig(temperature=0.0, repetition_penalty=1.3)),
        dict(prompt=prompts[6], sampling=s, seed=2),
        dict(prompt=prompts[11]),
    ]


def bad_requests():  # fresh processors each time: they count their calls
    return {
        "processor raises": dict(logits_processors=[FailsAt(3, "raises")]),
        "processor returns NaN": dict(logits_processors=[FailsAt(2, "nan")]),
        "processor returns a wrong shape": dict(logits_processors=[FailsAt(1, "shape")]),
        "grammar dead end (all -inf)": dict(logits_processors=[FailsAt(4, "all -inf")]),
        "stop criterion raises": dict(stop_criteria=[stop_raises_at(2)]),
    }


def degenerate_requests():  # accepted with a defined meaning: they finish normally
    return {
        "temperature 1e-300 (greedy)": dict(sampling=SamplingConfig(temperature=1e-300)),
        "repetition_penalty 1e-300": dict(sampling=SamplingConfig(temperature=0.7, repetition_penalty=1e-300), seed=3),
        "logits past float32 with penalty 0.5": dict(
            logits_processors=[FailsAt(1, "huge")],
            seed=4,
            sampling=SamplingConfig(temperature=1.0, repetition_penalty=0.5),
        ),
    }


def run_mix(model, good, bad, **engine_kw):
    engine = Engine(model, num_blocks=128, block_size=8, max_num_seqs=8, **engine_kw)
    ids, bad_ids = [], []
    for i, g in enumerate(good):
        g = dict(g)
        ids.append(engine.submit(g.pop("prompt"), N_NEW, **g))
        if i < len(bad):  # bad requests interleaved with the good ones, some arriving mid-flight
            p, kw = bad[i]
            bad_ids.append(engine.submit(p, N_NEW, **kw))
            engine.step()
    engine.run()
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.has_unfinished()
    return [engine.get(r).output for r in ids], [engine.get(r) for r in bad_ids]


@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_a_bad_request_changes_no_other_request(model_and_prompts, policy):
    """The same workload with and without failing requests: every other request's output is bit-identical,
    each failing request ends alone with finish_reason "error" and its exception, and every block is back."""
    model, prompts, refs = model_and_prompts
    good = good_requests(prompts)
    alone, _ = run_mix(model, good, [], policy=policy)
    bad = [(prompts[7 + i % 3], kw) for i, kw in enumerate(bad_requests().values())]
    mixed, failed = run_mix(model, good, bad, policy=policy)
    assert mixed == alone
    for r, name in zip(failed, bad_requests()):
        assert r.finish_reason == "error" and isinstance(r.error, Exception), name
    assert "processor bug" in str(failed[0].error) and "NaN" in str(failed[1].error)
    assert "shape" in str(failed[2].error) and "-inf" in str(failed[3].error)
    assert len(failed[0].output) == 2 and len(failed[4].output) == 2  # what came before the failure stays
    assert alone[0] == refs[0] and alone[2] == refs[4]  # and the good ones are generate's


def test_degenerate_values_have_a_defined_meaning(model_and_prompts):
    model, prompts, refs = model_and_prompts
    good = good_requests(prompts)
    alone, _ = run_mix(model, good, [])
    degenerate = [(prompts[0], kw) for kw in degenerate_requests().values()]
    mixed, done = run_mix(model, good, degenerate)
    assert mixed == alone
    assert all(r.finish_reason == "length" and len(r.output) == N_NEW for r in done)
    assert done[0].output == refs[0] and done[0].sampling.temperature == 0  # below 1e-5: greedy


def test_greedy_with_a_penalty_equals_generate(model_and_prompts):
    """A greedy request with a repetition penalty is not a plain argmax row: the penalty applies, as in generate."""
    model, prompts, _ = model_and_prompts
    s = SamplingConfig(temperature=0.0, repetition_penalty=1.5)
    engine = Engine(model, num_blocks=64)
    rid = engine.submit(prompts[0], N_NEW, sampling=s)
    engine.run()
    assert engine.get(rid).output == generate(model, prompts[0], N_NEW, sampling=s)[0, len(prompts[0]) :].tolist()


# --- input checks: a ValueError naming the parameter, before anything is queued -------------------------
SUBMIT_BAD = [
    (dict(prompt=torch.tensor([[1, 2], [3, 4]])), "prompt"),
    (dict(prompt=torch.tensor([1.0, 2.0])), "prompt"),
    (dict(prompt=[1, True]), "prompt"),
    (dict(prompt=[1, 2**70]), "prompt"),
    (dict(prompt=[1, -1]), "prompt"),
    (dict(prompt="def f"), "prompt"),
    (dict(prompt=list(range(1, 1025)), max_tokens=1), "prompt"),
    (dict(max_tokens=True), "max_tokens"),
    (dict(max_tokens=2.0), "max_tokens"),
    (dict(max_tokens=2**70), "max_tokens"),
    (dict(max_tokens=-1), "max_tokens"),
    (dict(max_tokens=500), "max_tokens"),  # 8 blocks of 16: it could never run
    (dict(sampling=0.7), "sampling"),
    (dict(sampling={"temperature": 0.7}), "sampling"),
    (dict(seed=True), "seed"),
    (dict(seed=2**64), "seed"),
    (dict(seed=1.5), "seed"),
    (dict(eos_id="<|eos|>"), "eos_id"),
    (dict(eos_id=True), "eos_id"),
    (dict(eos_id=10**6), "eos_id"),
    (dict(stop_sequences="\n"), "stop_sequences"),
    (dict(stop_sequences=[[1, 99999]]), "stop_sequences"),
    (dict(stop_criteria=lambda g: False), "stop_criteria"),
    (dict(stop_criteria=[1]), "stop_criteria"),
    (dict(logits_processors=lambda i, x: x), "logits_processors"),
    (dict(logits_processors=5), "logits_processors"),
    (dict(request_id=1.5), "request_id"),
    (dict(request_id=""), "request_id"),
    (dict(arrival_time=float("nan")), "arrival_time"),
    (dict(arrival_time=-1.0), "arrival_time"),
    (dict(arrival_time=True), "arrival_time"),
]


@pytest.mark.parametrize("kw,param", SUBMIT_BAD, ids=[f"{p}-{i}" for i, (_, p) in enumerate(SUBMIT_BAD)])
def test_submit_names_the_bad_parameter(model_and_prompts, kw, param):
    from helpers.serving.params import InvalidParameter

    model, _, _ = model_and_prompts
    engine = Engine(model, num_blocks=8, block_size=16)
    args = dict(prompt=[1, 2, 3], max_tokens=4) | kw
    with pytest.raises(InvalidParameter) as info:
        engine.submit(args.pop("prompt"), args.pop("max_tokens"), **args)
    assert info.value.param == param and param in str(info.value)
    assert not engine.has_unfinished() and not engine.requests and engine.pool.num_free == 8


ENGINE_BAD = [
    (dict(num_blocks=True), "num_blocks"),
    (dict(num_blocks=0), "num_blocks"),
    (dict(num_blocks=10**12), "num_blocks"),
    (dict(num_blocks=4.0), "num_blocks"),
    (dict(block_size=2048), "block_size"),
    (dict(block_size=None), "block_size"),
    (dict(max_num_seqs=False), "max_num_seqs"),
    (dict(max_num_batched_tokens=True), "max_num_batched_tokens"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    (dict(enable_prefix_caching="yes"), "enable_prefix_caching"),
    (dict(chunked_prefill=1), "chunked_prefill"),
    (dict(policy="fifo"), "policy"),
    (dict(step_log=0), "step_log"),
    (dict(chunked_prefill=False, max_num_batched_tokens=64), "max_num_batched_tokens"),
]


@pytest.mark.parametrize("kw,param", ENGINE_BAD, ids=[f"{p}-{i}" for i, (_, p) in enumerate(ENGINE_BAD)])
def test_engine_names_the_bad_parameter(model_and_prompts, kw, param):
    from helpers.serving.params import InvalidParameter

    model, _, _ = model_and_prompts
    with pytest.raises(InvalidParameter) as info:
        Engine(model, **(dict(num_blocks=8) | kw))
    assert info.value.param == param and param in str(info.value)
    with pytest.raises(InvalidParameter, match="model must be"):
        Engine("target", num_blocks=8)


# --- liveness and the books a server needs ----------------------------------------------------------------
def test_static_batching_finishes_on_a_tight_pool(model_and_prompts):
    """The reproducer that never returned: a finished row padded itself out of its batch, was queued again
    needing 41 of 40 blocks, and everybody waited behind it."""
    model, prompts, _ = model_and_prompts
    engine = Engine(model, num_blocks=40, block_size=16, max_num_seqs=2, policy="static")
    ids = [engine.submit(prompts[0][:10], n) for n in (2, 500, 5)]
    engine.run()
    assert [len(engine.get(i).output) for i in ids] == [2, 500, 5]
    assert engine.num_steps <= sum(10 + n for n in (2, 500, 5))  # the stated bound
    assert engine.pool.num_free == 40


def test_forget_stats_and_a_bounded_step_log(model_and_prompts):
    model, prompts, refs = model_and_prompts
    engine = Engine(model, num_blocks=64, step_log=5)
    rid = engine.submit(prompts[0], N_NEW)
    with pytest.raises(ValueError, match="has not finished"):
        engine.forget(rid)
    assert engine.stats()["waiting"] == 1
    engine.run()
    assert engine.get(rid).output == refs[0]
    engine.forget(rid)
    assert not engine.requests and len(engine.steps) < 10 and engine.num_steps == N_NEW
    assert engine.stats() | {"steps": 0} == dict(
        running=0,
        waiting=0,
        kv_blocks_total=64,
        kv_blocks_free=64,
        kv_blocks_used=0,
        block_size=16,
        steps=0,
        preemptions=0,
    )
