"""The OpenAI-compatible server: driven over HTTP by the official client, in a subprocess on a free loopback
port that every test session tears down (and, for the backpressure test, in-process)."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
import torch

from helpers.serving.launch import ServerProcess

MODEL = "course-target"


@pytest.fixture(scope="module")
def server():
    with ServerProcess(max_num_seqs=16, max_pending=64) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


def engine_alone(prompt: str, max_tokens: int, temperature: float, seed: int | None) -> str:
    """The same request through an Engine in this process: what the server must return."""
    from helpers import load_model
    from helpers.sampling import SamplingConfig
    from helpers.serving import Engine

    model, tok = load_model("target", device="cpu", dtype=torch.float32)
    engine = Engine(model, num_blocks=1024, block_size=16, max_num_seqs=16, enable_prefix_caching=True)
    rid = engine.submit(tok.encode(prompt, bos=True), max_tokens, sampling=SamplingConfig(temperature=temperature),
                        seed=seed, eos_id=tok.eos_id)
    engine.run()
    return tok.decode(engine.get(rid).output)


def wait_for_idle(server, timeout=10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if (m["running"] == 0 and m["waiting"] == 0 and m["pending"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert server.get("/health") == {"status": "ok"}
    m = server.metrics()
    assert m["kv_blocks_free"] == m["kv_blocks_total"] > 0


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (0.8, 3)])
def test_streamed_and_plain_results_equal_the_engine(client, temperature, seed):
    prompt = "import os\nimport sys\n\ndef main(argv):"
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=temperature, seed=seed)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=temperature,
                                            seed=seed, stream=True))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert plain.choices[0].text == streamed == engine_alone(prompt, 24, temperature, seed)
    assert plain.usage.completion_tokens == 24 and plain.choices[0].finish_reason == "length"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_strings_are_cut_and_never_streamed(client):
    prompt = "class Stack:\n    def push(self, item):"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0).choices[0].text
    stop = "self"
    assert stop in full, full  # the test needs a continuation that contains the stop string
    for stream in (False, True):
        if stream:
            text = "".join(c.choices[0].text for c in client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stop=[stop], stream=True) if c.choices)
        else:
            text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0,
                                             stop=[stop]).choices[0].text
        assert text == full[:full.index(stop)]


def test_logprobs_are_the_models_own(client):
    from helpers import load_model

    out = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=4, temperature=0, logprobs=2)
    lp = out.choices[0].logprobs
    assert "".join(lp.tokens) == out.choices[0].text and len(lp.token_logprobs) == 4
    model, tok = load_model("target", device="cpu", dtype=torch.float32)
    ids = tok.encode("def add(a, b):", bos=True)
    with torch.no_grad():
        first = torch.log_softmax(model(torch.tensor([ids]))[0, -1], -1)
    assert abs(lp.token_logprobs[0] - first.max().item()) < 1e-4  # greedy: the top token's log-probability
    assert max(lp.top_logprobs[0].values()) == lp.token_logprobs[0]


def test_chat_endpoint_uses_the_template(client):
    reply = client.chat.completions.create(model=MODEL, max_tokens=12, temperature=0,
                                           messages=[{"role": "user", "content": "Write a hello world."}])
    assert reply.choices[0].message.role == "assistant"
    assert "\n### " not in reply.choices[0].message.content  # it stops before the next turn's header


def test_disconnect_mid_stream_cancels_and_frees_blocks(server):
    body = {"model": MODEL, "prompt": "def main():", "max_tokens": 900, "temperature": 0, "stream": True,
            "extensions": {"ignore_eos": True}}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", server.base_url + "/completions", json=body) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(line.startswith("data: {") for line in got)
            assert server.metrics()["kv_blocks_used"] > 0
        # the connection is closed here, long before 900 tokens
    m = wait_for_idle(server)
    assert m["running"] == 0 and m["pending"] == 0
    assert m["kv_blocks_free"] == m["kv_blocks_total"]


def test_load_no_5xx_no_lost_or_duplicated_tokens(server):
    """200 streamed requests from 16 concurrent clients; every token arrives exactly once."""
    prompts = ["def f(x):", "import re\n", "class A:", "for i in range(10):", "try:\n    import json"]

    async def one(http, i):
        body = {"model": MODEL, "prompt": prompts[i % len(prompts)], "max_tokens": 6 + i % 5,
                "temperature": 0.7, "seed": i, "stream": True, "logprobs": 0,
                "stream_options": {"include_usage": True}, "extensions": {"ignore_eos": True}}
        texts, tokens, usage = [], [], None
        async with http.stream("POST", server.base_url + "/completions", json=body) as r:
            if r.status_code != 200:
                return r.status_code, None
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for c in chunk["choices"]:
                    texts.append(c["text"])
                    if c["logprobs"]:
                        tokens += c["logprobs"]["tokens"]
        return 200, (body["max_tokens"], "".join(texts), tokens, usage)

    async def main():
        sem = asyncio.Semaphore(16)
        async with httpx.AsyncClient(timeout=60) as http:
            async def bounded(i):
                async with sem:
                    return await one(http, i)
            return await asyncio.gather(*(bounded(i) for i in range(200)))

    results = asyncio.run(main())
    statuses = [s for s, _ in results]
    assert all(s < 500 for s in statuses) and statuses.count(200) == 200
    for _, (max_tokens, text, tokens, usage) in results:
        assert usage["completion_tokens"] == len(tokens) == max_tokens  # each token streamed exactly once
        assert "".join(tokens) == text
    m = wait_for_idle(server)
    assert m["kv_blocks_free"] == m["kv_blocks_total"]


BAD = [
    ({"model": "gpt-4", "prompt": "x"}, "model"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 2000}, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "temperature": 3.0}, "temperature"),
    ({"model": MODEL, "prompt": "x", "temperature": "0.5"}, "temperature"),
    ({"model": MODEL, "prompt": "x", "top_p": 0}, "top_p"),
    ({"model": MODEL, "prompt": "x", "n": 0}, "n"),
    ({"model": MODEL, "prompt": "x", "presence_penalty": -3}, "presence_penalty"),
    ({"model": MODEL, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"model": MODEL, "prompt": "x", "repetition_penalty": 1.2}, "repetition_penalty"),
    ({"model": MODEL, "prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"model": MODEL, "prompt": ""}, "prompt"),
    ({"model": MODEL}, "prompt"),
]


@pytest.mark.parametrize("body,param", BAD, ids=[p for _, p in BAD])
def test_bad_requests_get_openai_errors(server, body, param):
    r = httpx.post(server.base_url + "/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"] == "invalid_request_error"


def test_the_extension_field_takes_non_openai_settings(client):
    out = client.completions.create(model=MODEL, prompt="x = 1\n", max_tokens=4, temperature=0,
                                    extra_body={"extensions": {"repetition_penalty": 1.3, "top_k": 5}})
    assert out.usage.completion_tokens == 4


def test_malformed_json_huge_bodies_and_huge_prompts_are_refused_quickly(server, client):
    r = httpx.post(server.base_url + "/completions", content=b'{"model": "course-target", "prompt": ',
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("malformed JSON")
    t0 = time.perf_counter()
    r = httpx.post(server.base_url + "/completions", content=b"x" * (10 << 20),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and "error" in r.json()
    t1 = time.perf_counter()
    r = httpx.post(server.base_url + "/completions", json={"model": MODEL, "prompt": "a " * 100_000}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    t2 = time.perf_counter()
    assert t1 - t0 < 5 and t2 - t1 < 5, (t1 - t0, t2 - t1)
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens == 2


def test_a_full_queue_answers_429_at_once():
    body = {"model": MODEL, "prompt": "def main():", "max_tokens": 900, "temperature": 0, "stream": True,
            "extensions": {"ignore_eos": True}}
    with ServerProcess(max_pending=1, num_blocks=128) as small, httpx.Client(timeout=30) as http:
        url = small.base_url + "/completions"
        with http.stream("POST", url, json=body) as r:
            lines = r.iter_lines()  # kept: a dropped iterator closes the stream (and so cancels the request)
            next(lines)  # the first request holds the only place
            assert small.metrics()["pending"] == 1
            t0 = time.perf_counter()
            refused = http.post(url, json={**body, "stream": False})
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
            assert time.perf_counter() - t0 < 2  # refused at once, not queued
        wait_for_idle(small)
        ok = http.post(url, json={**body, "stream": False, "max_tokens": 3})
        assert ok.status_code == 200  # the place came back when the stream closed
