"""Serve the course model behind an OpenAI-compatible API (chapter 14).

    python -m helpers.serve                      # http://127.0.0.1:8000/v1
    python -m helpers.serve --port 8123 --max-num-seqs 16

Then, from any OpenAI client:

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.completions.create(model="course-target", prompt="def fib(n):", max_tokens=32, temperature=0)

It listens on 127.0.0.1 unless told otherwise: the server has no authentication. The endpoints and what
they accept are in helpers/serving/server.py and openai_api.py.
"""
from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-num-seqs", type=int, default=32, help="requests decoded together in one step")
    p.add_argument("--num-blocks", type=int, default=1024, help="KV cache blocks of 16 tokens in the pool")
    p.add_argument("--max-pending", type=int, default=64,
                   help="requests in flight (running + waiting) before new ones get HTTP 429")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the engine")
    p.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    args = p.parse_args(argv)

    import torch
    import uvicorn

    from .checkpoint import load_model
    from .serving.server import create_app

    torch.set_num_threads(args.threads)
    # The engine thread and the HTTP event loop share the GIL. By default a thread waiting for it may
    # wait 5 ms before the holder is asked to let go, once per hand-over: several times per token. A
    # shorter interval lets the event loop answer between the engine's Python steps.
    sys.setswitchinterval(float(os.environ.get("LLM_COURSE_SWITCH_INTERVAL", "0.0005")))
    model, tok = load_model("target", device=args.device)
    app = create_app(model, tok, num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
                     max_pending=args.max_pending, enable_prefix_caching=not args.no_prefix_caching)
    print(f"serving {app.state.model_name} on http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
