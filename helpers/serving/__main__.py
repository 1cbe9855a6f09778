"""Serve the course model behind an OpenAI-compatible API (chapter 14).

    python -m helpers.serving                      # http://127.0.0.1:8000/v1
    python -m helpers.serving --port 8123 --max-num-seqs 16

Then, from any OpenAI client:

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.completions.create(model="course-target", prompt="def fib(n):", max_tokens=32, temperature=0)

It listens on 127.0.0.1 unless told otherwise: the server has no authentication. The endpoints and what
they accept are in server.py and openai_api.py. `--parent-pid` ties its life to another process's
(launch.ServerProcess passes its own): when that process ends, however it ends, the server exits.

Left out: TLS, several workers, reloading on code changes.
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
    p.add_argument(
        "--max-pending",
        type=int,
        default=64,
        help="requests in flight (running + waiting) before new ones get HTTP 429",
    )
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument(
        "--no-compile-step",
        action="store_true",
        help="run every step eagerly (by default steps of two or more tokens run compiled, compiled at start-up)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads for the engine")
    p.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process has gone")
    p.add_argument(
        "--parent-death-signal",
        action="store_true",
        help="also ask Linux to signal us when the parent thread that started us ends",
    )
    args = p.parse_args(argv)

    from .launch import die_with_parent

    if args.parent_pid is not None:  # before the slow imports: a parent killed during them is noticed too
        watch = die_with_parent(args.parent_pid, use_signal=args.parent_death_signal)

    import torch
    import uvicorn

    from ..checkpoint import load_model
    from .server import create_app

    torch.set_num_threads(args.threads)
    # The engine thread and the HTTP event loop share the GIL. By default a thread waiting for it may
    # wait 5 ms before the holder is asked to let go, once per hand-over: several times per token. A
    # shorter interval lets the event loop answer between the engine's Python steps.
    sys.setswitchinterval(float(os.environ.get("LLM_COURSE_SWITCH_INTERVAL", "0.0005")))
    model, tok = load_model("target", device=args.device)
    app = create_app(
        model,
        tok,
        num_blocks=args.num_blocks,
        max_num_seqs=args.max_num_seqs,
        max_pending=args.max_pending,
        enable_prefix_caching=not args.no_prefix_caching,
        compile_step="autotune" if not args.no_compile_step and args.device == "cpu" else False,
    )
    # open streams get 2 s to finish when the server is told to stop; then it stops anyway
    server = uvicorn.Server(
        uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=2)
    )
    if args.parent_pid is not None:
        watch.on_exit = lambda: setattr(server, "should_exit", True)
    print(f"serving {app.state.model_name} on http://{args.host}:{args.port}/v1", flush=True)
    server.run()


if __name__ == "__main__":
    main()
