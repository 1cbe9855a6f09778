"""Start `python -m helpers.serve` in a subprocess on a free loopback port, and stop it by its PID.

    with ServerProcess(max_num_seqs=16) as server:      # waits until /health answers
        client = OpenAI(base_url=server.base_url, api_key="unused")
        ...
    # stopped here: SIGTERM to its process, SIGKILL after a timeout

The chapter and the tests both use it, so a server never outlives the cell or test that started it.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, port: int | None = None, startup_timeout: float = 120.0, **flags):
        """flags become command-line options: max_num_seqs=16 -> --max-num-seqs 16 (True -> a bare flag)."""
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.root_url = f"http://127.0.0.1:{self.port}"
        self.startup_timeout = startup_timeout
        self.args = [sys.executable, "-m", "helpers.serve", "--host", "127.0.0.1", "--port", str(self.port)]
        for name, value in flags.items():
            option = "--" + name.replace("_", "-")
            if value is True:
                self.args.append(option)
            elif value is not False and value is not None:
                self.args += [option, str(value)]
        self.process: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile(mode="w+")

    def start(self) -> "ServerProcess":
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        self.process = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)  # its own group: nothing else gets our signals
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with code {self.process.returncode}:\n{self.output()}")
            try:
                if self.get("/health")["status"] == "ok":
                    return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"the server did not answer /health within {self.startup_timeout:.0f} s:\n{self.output()}")

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.root_url + path, timeout=5) as r:
            return json.loads(r.read())

    def metrics(self) -> dict:
        return self.get("/metrics")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self, timeout: float = 10.0) -> None:
        p = self.process
        if p is None or p.poll() is not None:
            return
        os.kill(p.pid, signal.SIGTERM)  # by its own PID
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=timeout)

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.log.close()
