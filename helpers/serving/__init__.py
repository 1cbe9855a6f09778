"""Serving many requests at once: a continuous-batching engine over a paged KV cache (chapter 13), and
an OpenAI-compatible HTTP server over it (chapter 14).

    block_pool.py    which KV blocks are free, reference counts, prefix-cache hashes, LRU eviction
    paged_cache.py   the block-structured K/V tensors: write by slot, gather through a block table
    model_runner.py  one forward pass over a ragged batch (prefill chunks and decodes together)
    step_view.py     that batch as a cache view the model's own forward takes: positions, attend per request
    paged_attention.py  decode attention read in place through the block tables (a small C kernel)
    compiled_step.py the engine's step as one torch.compile graph, that kernel a custom op in it
    row_tiles.py     batch-invariant matmuls: the row counts measured to give every row the same bits
    request.py       one request's state: tokens, blocks, sampling settings, timings
    scheduler.py     each step's batch: admission, token budget, chunked prefill, preemption
    static_scheduler.py  the static-batching baseline (policy="static"), as a subclass
    params.py        each parameter of Engine() and submit() checked: InvalidParameter names it
    engine.py        submit / step / cancel / metrics: the API a server is built on
    workload.py      synthetic workloads replayed through sequential, static and continuous serving
    goodput.py       one workload at rising load through four designs: TTFT, TPOT, goodput, the knee
    baselines.py     what the bench sets the engine beside: FastGenerator one by one, transformers' batching
    bench.py         python -m helpers.serving.bench: the chapter's targets, measured
    step_profile.py  one decode step timed in place, gathered, dense and compiled; an engine step by part
    chat_template.py messages -> one prompt (the minimal template the chat endpoint uses)
    openai_api.py    OpenAI's request bodies (validated), response objects and error shape
    worker.py        the engine thread: commands in, tokens out, cancellation between steps
    completions.py   the endpoints' work: body -> engine requests, streamed or plain, hang-ups cancelled
    server.py        the FastAPI app: routes, body limit, every error in OpenAI's shape
    __main__.py      python -m helpers.serving: the server on 127.0.0.1, tied to its parent process
    launch.py        ServerProcess (dies with its starter), free_port, stop_process
    loadtest.py      a bounded closed-loop load test with per-token client-side timings
    soak.py          python -m helpers.serving.soak: many requests, some bad, some hang-ups; the books checked

    from helpers.serving import Engine
    engine = Engine(model, num_blocks=256, block_size=16, max_num_seqs=32, enable_prefix_caching=True)
    rid = engine.submit(prompt_ids, max_tokens=64)
    outputs = engine.run()          # {request_id: generated ids}
"""

from .block_pool import BlockPool, block_hash, prefix_hashes
from .engine import Engine, StepOutput, StepRecord
from .paged_cache import PagedKVCache
from .request import Request

__all__ = ["BlockPool", "block_hash", "prefix_hashes", "Engine", "StepOutput", "StepRecord", "PagedKVCache", "Request"]
