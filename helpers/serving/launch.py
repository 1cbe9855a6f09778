"""Start `python -m helpers.serving` in a subprocess on a free loopback port; it never outlives its starter.

    with ServerProcess(max_num_seqs=16) as server:      # waits until /health answers
        client = OpenAI(base_url=server.base_url, api_key="unused")
        ...
    # stopped here: SIGTERM to its process, SIGKILL after a timeout

However the starting process ends, the server ends with it (a notebook kernel that is restarted, shut
down or killed used to leave its server running, port open, ~384 MB resident):

- an explicit stop: `stop()`, the `with` block, and a `weakref.finalize` that also runs at interpreter
  exit (a kernel restart or shutdown exits the kernel's interpreter);
- the server watches its parent (`die_with_parent`, called by the server itself): on Linux the kernel
  sends it SIGTERM when the parent goes (PR_SET_PDEATHSIG, asked for when the server is started from
  the main thread, since Linux ties it to the starting thread), and on every system a thread polls the
  parent's PID every 0.2 s; either way the server stops, and a process still alive 3 s later exits hard.

Also here, for anything that starts processes: `free_port()`, a loopback port the OS picked, and
`stop_process(p)`, which stops one child by its own PID (SIGTERM, then SIGKILL).

Left out: Windows' job objects (the PID poll is the only watch there) and restarting a crashed server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import weakref

from ..processes import ParentWatch, die_with_parent, free_port, stop_process  # noqa: F401 (re-exported)


class ServerProcess:
    def __init__(self, port: int | None = None, startup_timeout: float = 120.0, compile_step: bool = False, **flags):
        """flags become command-line options: max_num_seqs=16 -> --max-num-seqs 16 (True -> a bare flag).
        compile_step: False passes --no-compile-step (tests and chapter 14 start many servers, and each would
        compile its decode step again at start-up)."""
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.root_url = f"http://127.0.0.1:{self.port}"
        self.startup_timeout = startup_timeout
        self.args = [
            sys.executable,
            "-m",
            "helpers.serving",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--parent-pid",
            str(os.getpid()),
        ]
        if threading.current_thread() is threading.main_thread():  # Linux signals when the starting thread ends
            self.args.append("--parent-death-signal")
        if not compile_step:
            self.args.append("--no-compile-step")
        for name, value in flags.items():
            option = "--" + name.replace("_", "-")
            if value is True:
                self.args.append(option)
            elif value is not False and value is not None:
                self.args += [option, str(value)]
        self.process: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile(mode="w+")
        self._finalizer = None

    def start(self) -> "ServerProcess":
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        self.process = subprocess.Popen(
            self.args, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )  # its own group: nothing else gets our signals
        # stopped when this object goes, or at interpreter exit (a kernel restart): never referencing self
        self._finalizer = weakref.finalize(self, stop_process, self.process, 5.0)
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
        if self.process is not None:
            stop_process(self.process, timeout)
        if self._finalizer is not None:
            self._finalizer.detach()

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.log.close()
