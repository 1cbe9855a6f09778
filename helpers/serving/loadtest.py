"""A bounded load test: N streamed requests from C concurrent clients, each timed token by token.

    records = run_load(base_url, prompts, concurrency=16, n_requests=64, max_tokens=16)
    summary(records)   # throughput, TTFT and inter-token latency p50 / p99, errors

Each client sends its next request as soon as its last one finished (a closed loop, like C users who
each wait for an answer). Every request has a time cap (`request_timeout`), so a stuck server ends the
test with errors instead of hanging it. Times are measured at the client: TTFT is from sending the
request to the first streamed text, inter-token latency the gaps between streamed tokens.

Left out: open-loop arrivals (Poisson), ramp-up, and coordinated-omission corrections.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestRecord:
    status: int
    start: float
    token_times: list[float] = field(default_factory=list)
    tokens: int = 0  # completion tokens the server reported
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def itls(self) -> list[float]:
        return list(np.diff(self.token_times)) if len(self.token_times) > 1 else []


async def _one(http, url: str, body: dict, timeout: float) -> RequestRecord:
    rec = RequestRecord(status=0, start=time.perf_counter())
    try:
        async with asyncio.timeout(timeout):
            async with http.stream("POST", url, json=body) as r:
                rec.status = r.status_code
                if r.status_code != 200:
                    rec.error = (await r.aread()).decode()[:200]
                    return rec
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        rec.tokens = chunk["usage"]["completion_tokens"]
                    for c in chunk.get("choices", []):
                        # with logprobs=0 every token arrives in its own chunk, text or not
                        n = len(c["logprobs"]["tokens"]) if c.get("logprobs") else int(bool(c.get("text")))
                        rec.token_times += [time.perf_counter()] * n
    except TimeoutError:
        rec.error = f"no answer within {timeout} s"
    return rec


def run_load(
    base_url: str,
    prompts: list[str],
    concurrency: int,
    n_requests: int,
    max_tokens: int,
    temperature: float = 0.0,
    request_timeout: float = 30.0,
    model: str = "course-target",
    logprobs: bool = False,
) -> tuple[list[RequestRecord], float]:
    """Returns (records, wall seconds). Request i uses prompts[i % len(prompts)] and seed i.

    logprobs=True asks for every token's log-probability, so each token arrives in its own chunk and
    `token_times` has one entry per token (a check that none is lost); it also makes the engine sample
    each request on its own. Without it each streamed piece of text is timed, and the server's usage
    report counts the tokens."""
    import httpx

    async def main():
        queue = list(range(n_requests))
        records: list[RequestRecord] = []
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(timeout=request_timeout, limits=limits) as http:

            async def client():
                while queue:
                    i = queue.pop(0)
                    body = {
                        "model": model,
                        "prompt": prompts[i % len(prompts)],
                        "max_tokens": max_tokens,
                        "temperature": temperature,
                        "seed": i,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                        "extensions": {"ignore_eos": True},
                    }
                    if logprobs:
                        body["logprobs"] = 0
                    records.append(await _one(http, base_url + "/completions", body, request_timeout))

            t0 = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(concurrency)))
            return records, time.perf_counter() - t0

    return run_async(main())


def run_async(coro):
    """asyncio.run(coro), also where an event loop already runs in this thread (Jupyter's): then on another."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # a plain script: no event loop yet
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def summary(records: list[RequestRecord], wall: float) -> dict:
    ok = [r for r in records if r.status == 200 and r.error is None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [x for r in ok for x in r.itls]
    pct = lambda xs, q: float(np.percentile(xs, q)) * 1e3 if xs else float("nan")
    return {
        "requests": len(records),
        "ok": len(ok),
        "errors_5xx": sum(r.status >= 500 for r in records),
        "errors_other": sum(r.status != 200 and r.status < 500 for r in records)
        + sum(r.error is not None and r.status == 200 for r in records),
        "tokens": sum(r.tokens for r in ok),
        "tokens_per_s": sum(r.tokens for r in ok) / wall,
        "ttft_p50_ms": pct(ttft, 50),
        "ttft_p99_ms": pct(ttft, 99),
        "itl_p50_ms": pct(itl, 50),
        "itl_p99_ms": pct(itl, 99),
    }
