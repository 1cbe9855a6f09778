"""A soak test with faults: many requests against the server, some of them bad, some clients hanging up.

    python -m helpers.serving.soak                  # 500 requests, a few minutes
    python -m helpers.serving.soak --requests 60    # the short version the tests and chapter 14 run

From the command line the server's engine compiles its decode step, as `python -m helpers.serving` does
(`--no-compile-step`: all eager, as the tests and chapter 14 run it).

The server runs in this process (its app on a uvicorn thread, on a free loopback port) so that the soak
can also cancel a request from the server side and replay any request through an engine alone. The
requests, drawn from a seeded generator:

- good ones (80%): completions or chat, streamed or not, greedy or seeded sampling, top-p / top-k,
  penalties, stop strings, n = 1 or 2, logprobs, 1-48 tokens;
- bad ones (10%): half malformed (invalid JSON or UTF-8, wrong types, unknown fields, out-of-range values,
  a prompt longer than the window, n above the queue bound: each must get a 4xx in OpenAI's shape),
  half degenerate but valid (temperature or repetition_penalty 1e-300: a 200 with the stated meaning);
- hang-ups (10%): a client that goes away before the answer, mid-stream, or while waiting for a plain
  answer; and a few cancels from the server side, at random moments.

Then it checks every good answer: greedy ones against `generate` on that request alone, token for token
(a difference counts as a rounding flip only where the reference's top two logits are within 1e-3 and
the server took the runner-up), seeded sampled ones against the same request through an engine alone;
and the books: every block back in the pool, no request left in the engine, resident memory after the
soak against after the warm-up.

Left out: several server processes, network faults below TCP (slow links, resets mid-header).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import torch

from ..generate import generate
from ..stopping import TextStop, cut_at_stop_string
from .chat_template import TURN_STOP, render_chat
from .engine import Engine
from .launch import free_port
from .loadtest import run_async
from .openai_api import ChatCompletionRequest, CompletionRequest, parse_body
from .server import create_app
from .worker import process_memory

PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\n\ndef main(argv):",
    "class Stack:\n    def push(self, item):",
    "for i in range(10):",
    "try:\n    import json",
    'def parse(text):\n    """',
    "x = [",
    "# sort a list\n",
    "with open(path) as f:",
    'if __name__ == "__main__":',
]
MALFORMED = [  # (raw body, status it must get)
    (b'{"model": "course-target", "prompt": ', 400),
    (b'{"model": "course-target", "prompt": "\xff"}', 400),
    (b'{"model": "course-target", "prompt": "x", "stream": "true"}', 400),
    (b'{"model": "course-target", "prompt": "x", "temperature": 3}', 400),
    (b'{"model": "course-target", "prompt": "x", "seed": 18446744073709551616}', 400),
    (b'{"model": "course-target", "prompt": "x", "repetition_penalty": 1.1}', 400),
    (b'{"model": "course-target", "prompt": "x", "n": 9}', 400),
    (b'{"model": "gpt-4", "prompt": "x"}', 400),
    (json.dumps({"model": "course-target", "prompt": "x = 1\n" * 400, "max_tokens": 1}).encode(), 400),
    (b'{"model": "course-target", "messages": [{"role": "bot", "content": "x"}]}', 400),
]


@dataclass
class Outcome:
    kind: str  # good, degenerate, malformed, hangup
    body: dict | None
    status: int = 0
    texts: list[str] = field(default_factory=list)
    error: dict | None = None


def draw_request(rng: random.Random) -> tuple[str, dict | bytes]:
    """One request of the mix: (kind, JSON body or raw bytes)."""
    u = rng.random()
    if u < 0.05:
        return "malformed", rng.choice(MALFORMED)[0]
    chat = rng.random() < 0.2
    body = {"model": "course-target", "max_tokens": rng.randint(1, 48), "stream": rng.random() < 0.5}
    if chat:
        body["messages"] = [{"role": "user", "content": rng.choice(PROMPTS)}]
    else:
        body["prompt"] = rng.choice(PROMPTS)
        if rng.random() < 0.2:
            body["logprobs"] = rng.randint(0, 2)
    if u < 0.10:
        body.update(
            rng.choice(
                [
                    {"temperature": 1e-300},
                    {"temperature": 0.7, "seed": rng.randint(0, 99), "extensions": {"repetition_penalty": 1e-300}},
                ]
            )
        )
        return "degenerate", body
    if rng.random() < 0.5:
        body["temperature"] = 0.0
    else:
        body.update(temperature=rng.choice([0.3, 0.8, 1.2]), seed=rng.randint(0, 2**32), top_p=rng.choice([1.0, 0.9]))
        body["n"] = rng.choice([1, 1, 2])
        if rng.random() < 0.3:
            body["extensions"] = {"top_k": rng.choice([5, 20])}
    if rng.random() < 0.2:
        body.update(presence_penalty=0.3, frequency_penalty=0.5)
    if rng.random() < 0.15:
        body.setdefault("extensions", {})["repetition_penalty"] = 1.3
    if rng.random() < 0.2:
        body["stop"] = rng.choice(["\n", ":", ["\n\n", "return"]])
    if u < 0.20:  # a long request, so that the client leaves while it runs
        body.update(max_tokens=rng.randint(100, 300), n=1)
        body.setdefault("extensions", {})["ignore_eos"] = True
        return "hangup", body
    return "good", body


async def send(http: httpx.AsyncClient, base: str, kind: str, body, rng: random.Random) -> Outcome:
    chat = b'"messages"' in body if isinstance(body, bytes) else "messages" in body
    url = base + ("/chat/completions" if chat else "/completions")
    out = Outcome(kind, body if isinstance(body, dict) else None)
    if isinstance(body, bytes):
        r = await http.post(url, content=body, headers={"content-type": "application/json"})
        out.status, out.error = r.status_code, r.json().get("error")
        return out
    hang_after = rng.choice([0.0, rng.uniform(0.02, 0.5)]) if kind == "hangup" else None  # 0: before sending
    try:
        async with asyncio.timeout(hang_after if hang_after is not None else 120):
            if body["stream"]:
                async with http.stream("POST", url, json=body) as r:
                    out.status = r.status_code
                    texts = [""] * body.get("n", 1)
                    async for line in r.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            out.error = chunk["error"]
                            break
                        for c in chunk["choices"]:
                            texts[c["index"]] += c["delta"].get("content", "") if "delta" in c else c["text"]
                    out.texts = texts
            else:
                r = await http.post(url, json=body)
                out.status = r.status_code
                data = r.json()
                out.error = data.get("error")
                out.texts = [c["message"]["content"] if "message" in c else c["text"] for c in data.get("choices", [])]
    except TimeoutError:  # our own deadline: this client hangs up here
        out.status = -1
    return out


def classify(o: Outcome) -> str:
    if o.status == -1:
        return "hung up"
    if o.error is not None:
        code = o.error.get("code")
        if code == "request_cancelled":
            return "cancelled by the server"
        return f"{o.status} {code or o.error.get('type')}"
    return f"{o.status} ok ({o.kind})"


class References:
    """What each good answer must be: generate alone (greedy), the engine alone (seeded sampling)."""

    def __init__(self, model, tok, completions):
        self.model, self.tok, self.completions = model, tok, completions
        self.engine = Engine(model, num_blocks=256, max_num_seqs=1)

    def check(self, o: Outcome) -> str:
        chat = "messages" in o.body
        body = parse_body(json.dumps(o.body).encode(), ChatCompletionRequest if chat else CompletionRequest)
        prompt = render_chat([m.model_dump() for m in body.messages]) if chat else body.prompt
        ids, choices = self.completions.engine_requests(body, prompt, "prompt", [TURN_STOP] if chat else [])
        stops = body.stop_strings() + ([TURN_STOP] if chat else [])
        verdicts = []
        for text, kw in zip(o.texts, choices):
            if kw["sampling"].greedy:
                out = generate(
                    self.model,
                    ids,
                    kw["max_tokens"],
                    sampling=kw["sampling"],
                    eos_id=kw["eos_id"],
                    stop_criteria=[TextStop(self.tok, stops)] if stops else (),
                    logits_processors=kw["logits_processors"],
                )[0, len(ids) :].tolist()
                verdicts.append(self._compare(text, out, ids, stops))
            else:
                rid = self.engine.submit(ids, **kw)
                self.engine.run()
                out = self.engine.get(rid).output
                self.engine.forget(rid)
                verdicts.append("same" if text == self._text(out, stops) else "changed")
        return min(verdicts, key=["changed", "rounding flip", "same"].index)

    def _text(self, ids, stops) -> str:
        text = self.tok.decode(ids)
        return cut_at_stop_string(text, stops) if stops else text

    def _compare(self, text: str, ref: list[int], prompt: list[int], stops) -> str:
        if text == self._text(ref, stops):
            return "same"
        j = next((k for k in range(len(ref)) if not text.startswith(self.tok.decode(ref[: k + 1]))), None)
        if j is None:
            return "changed"
        with torch.no_grad():
            logits = self.model(torch.tensor([prompt + ref[:j]], device=self.model.device))[0, -1].float()
        top = logits.topk(2)
        flip = (top.values[0] - top.values[1]).item() < 1e-3 and text.startswith(
            self.tok.decode(ref[:j] + [int(top.indices[1])])
        )
        return "rounding flip" if flip else "changed"


def settled(worker, engine) -> bool:
    """Nothing running or pending, every KV block back in the pool, no request left in the engine."""
    m = worker.metrics()
    return not (m["running"] or m["pending"]) and m["kv_blocks_free"] == m["kv_blocks_total"] and not engine.requests


def run_soak(
    model, tok, n_requests=500, concurrency=16, seed=0, server_cancels=2, warmup=64, progress=True, compile_step=False
) -> dict:
    """Serve `model` in this process, send the mix, check everything; returns the report (see `table`).
    Memory is compared with what it was after `warmup` requests of the same mix (every path taken once)."""
    import uvicorn

    app = create_app(model, tok, num_blocks=512, max_num_seqs=16, max_pending=64, compile_step=compile_step)
    worker = app.state.worker
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, name="soak-server", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the soak's server did not start")
        time.sleep(0.02)
    base = f"http://127.0.0.1:{port}/v1"
    rng = random.Random(seed)
    mix = [draw_request(rng) for _ in range(n_requests)]
    try:
        warm_rng = random.Random(seed + 1)
        warm = [draw_request(warm_rng) for _ in range(warmup)]
        run_async(_drive(base, warm, concurrency, random.Random(seed + 1), 0))  # warm-up: every path once
        rss_warm = process_memory()["rss_bytes"]
        t0 = time.perf_counter()
        outcomes = run_async(_drive(base, mix, concurrency, random.Random(seed + 2), server_cancels, worker, progress))
        wall = time.perf_counter() - t0
        # the engine thread frees a finished or hung-up request's blocks a step after its client saw the end:
        # wait (10 s at most) until it has, so a leak is what stays, not what is still on its way back
        deadline = time.monotonic() + 10
        while not settled(worker, app.state.engine) and time.monotonic() < deadline:
            time.sleep(0.05)
        books = worker.metrics()
        left_in_engine = len(app.state.engine.requests)
        steps = (app.state.engine.compiled_steps, app.state.engine.num_steps)
    finally:
        server.should_exit = True
        thread.join(30)
    refs = References(model, tok, app.state.completions)
    checks = Counter(refs.check(o) for o in outcomes if classify(o).startswith("200 ok") and o.texts)
    return {
        "requests": n_requests,
        "seconds": wall,
        "outcomes": Counter(classify(o) for o in outcomes),
        "checked": checks,
        "blocks_leaked": books["kv_blocks_total"] - books["kv_blocks_free"],
        "left_in_engine": left_in_engine,
        "compiled_steps": steps,  # (steps run by the compiled graph, all steps)
        "rss_warm": rss_warm,
        "rss_end": process_memory()["rss_bytes"],
        "peak_rss": process_memory()["peak_rss_bytes"],
        "hangups_cancelled": books["hangups"],
        "cancel_ms": sorted(x * 1e3 for x in worker.cancel_seconds),
        "errors_in_shape": all(set(o.error) == {"message", "type", "param", "code"} for o in outcomes if o.error),
    }


async def _drive(base, mix, concurrency, rng, server_cancels, worker=None, progress=False) -> list[Outcome]:
    sem = asyncio.Semaphore(concurrency)
    bar = None
    if progress:
        from ..progress import progress_bar

        bar = progress_bar(total=len(mix), desc="soak", unit="req", leave=False)

    async def one(kind, body):
        async with sem:
            out = await send(http, base, kind, body, rng)
        if bar is not None:
            bar.update(1)
        return out

    async def cancel_some():  # a server-side cancel at random moments, of whatever runs then
        for _ in range(server_cancels):
            await asyncio.sleep(rng.uniform(0.5, 3.0))
            running = worker.in_flight()
            if running:
                worker.cancel(rng.choice(running))

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as http:
        canceller = asyncio.create_task(cancel_some()) if worker is not None and server_cancels else None
        outcomes = await asyncio.gather(*(one(k, b) for k, b in mix))
        if canceller is not None:
            canceller.cancel()
    if bar is not None:
        bar.close()
    return list(outcomes)


def table(report: dict) -> str:
    """The report as the lines the CLI and chapter 14 print."""
    lines = [f"{report['requests']} requests in {report['seconds']:.1f} s", "outcome                           count"]
    lines += [f"  {k:32s}{v:6d}" for k, v in sorted(report["outcomes"].items())]
    lines.append("good answers checked against generate / the engine alone")
    lines += [f"  {k:32s}{v:6d}" for k, v in sorted(report["checked"].items())]
    mib = 2**20
    lines += [
        f"blocks leaked {report['blocks_leaked']}, requests left in the engine {report['left_in_engine']}, "
        f"errors outside OpenAI's shape {0 if report['errors_in_shape'] else 'some'}",
        f"hang-ups cancelled {report['hangups_cancelled']}; hang-up seen to blocks freed: "
        f"{_percentiles(report['cancel_ms'])}",
        f"resident memory: after warm-up {report['rss_warm'] / mib:.0f} MiB, after the soak "
        f"{report['rss_end'] / mib:.0f} MiB ({report['rss_end'] / report['rss_warm'] - 1:+.1%}), "
        f"peak {report['peak_rss'] / mib:.0f} MiB",
    ]
    return "\n".join(lines)


def _percentiles(ms: list[float]) -> str:
    if not ms:
        return "none"
    pick = [ms[min(len(ms) - 1, int(q * len(ms)))] for q in (0.5, 0.99)]  # ms is sorted
    return f"p50 {pick[0]:.1f} ms, p99 {pick[1]:.1f} ms, max {ms[-1]:.1f} ms"


def failures(report: dict) -> list[str]:
    """The targets a report misses (empty: all met)."""
    bad = [k for k in report["outcomes"] if k.startswith("5") and "request_cancelled" not in k]
    return (
        ([f"5xx answers: {bad}"] if bad else [])
        + ([f"good answers changed: {report['checked']['changed']}"] if report["checked"].get("changed") else [])
        + ([f"blocks leaked: {report['blocks_leaked']}"] if report["blocks_leaked"] else [])
        + ([f"requests left in the engine: {report['left_in_engine']}"] if report["left_in_engine"] else [])
        + ([] if report["errors_in_shape"] else ["an error outside OpenAI's shape"])
        + (
            [f"memory grew {report['rss_end'] / report['rss_warm'] - 1:.1%}"]
            if report["rss_end"] > 1.1 * report["rss_warm"]
            else []
        )
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="a soak test with faults against the course's server")
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-compile-step", action="store_true", help="the engine's steps all eager, as in the tests")
    args = p.parse_args(argv)
    from ..checkpoint import load_model

    torch.set_num_threads(1)
    model, tok = load_model("target")
    compile_step = False if args.no_compile_step else "autotune"  # as the server's command line runs it
    report = run_soak(model, tok, args.requests, args.concurrency, args.seed, compile_step=compile_step)
    print(table(report))
    print(f"engine steps run compiled: {report['compiled_steps'][0]} of {report['compiled_steps'][1]}")
    missed = failures(report)
    print("targets met" if not missed else "targets missed: " + "; ".join(missed))
    raise SystemExit(1 if missed else 0)


if __name__ == "__main__":
    main()
