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
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import weakref

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def stop_process(process, timeout: float = 10.0) -> None:
    """Stop one child process by its own PID: SIGTERM, then SIGKILL after `timeout` s; wait for it.
    process: a subprocess.Popen or a multiprocessing.Process. Nothing else (no process group) is signalled."""
    popen = hasattr(process, "poll")
    if process.pid is None or (process.poll() is not None if popen else not process.is_alive()):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL if hasattr(signal, "SIGKILL") else signal.SIGTERM):
        try:
            os.kill(process.pid, sig)
        except ProcessLookupError:
            return
        if popen:
            try:
                process.wait(timeout=timeout)
                return
            except subprocess.TimeoutExpired:
                continue
        process.join(timeout)
        if not process.is_alive():
            return


class ParentWatch:
    """What `die_with_parent` started: set `on_exit` to a graceful stop once there is something to stop."""

    def __init__(self, parent_pid: int, poll_s: float, grace_s: float):
        self.parent_pid, self.poll_s, self.grace_s = parent_pid, poll_s, grace_s
        self.on_exit = None  # called once when the parent has gone; without it the process exits at once
        self.thread = threading.Thread(target=self._watch, name="parent-watch", daemon=True)

    def parent_gone(self) -> bool:
        return os.getppid() != self.parent_pid  # an orphan is adopted by init (or a subreaper)

    def _watch(self) -> None:
        while not self.parent_gone():
            time.sleep(self.poll_s)
        if self.on_exit is None:
            os._exit(1)
        self.on_exit()
        time.sleep(self.grace_s)
        os._exit(1)  # the graceful stop did not finish in time


def die_with_parent(parent_pid: int, use_signal: bool = True, poll_s: float = 0.2, grace_s: float = 3.0) -> ParentWatch:
    """Make this process end when `parent_pid` (its parent) does; returns the watch (see ParentWatch)."""
    if use_signal and sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except (OSError, AttributeError):  # no prctl here: the poll below still works
            pass
    watch = ParentWatch(parent_pid, poll_s, grace_s)
    if watch.parent_gone():  # it went before the signal was asked for
        os._exit(1)
    watch.thread.start()
    return watch


class ServerProcess:
    def __init__(self, port: int | None = None, startup_timeout: float = 120.0, **flags):
        """flags become command-line options: max_num_seqs=16 -> --max-num-seqs 16 (True -> a bare flag)."""
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.root_url = f"http://127.0.0.1:{self.port}"
        self.startup_timeout = startup_timeout
        self.args = [sys.executable, "-m", "helpers.serving", "--host", "127.0.0.1", "--port", str(self.port),
                     "--parent-pid", str(os.getpid())]
        if threading.current_thread() is threading.main_thread():  # Linux signals when the starting thread ends
            self.args.append("--parent-death-signal")
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
        self.process = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)  # its own group: nothing else gets our signals
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
