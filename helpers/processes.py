"""Processes the course starts: a free loopback port, a child stopped by its own PID, and a child that
ends when its parent does. Used by the OpenAI-compatible server (serving/launch.py), the torch.distributed
workers (parallel/workers.py), the soak run and the browser test.

    port = free_port()                       # a loopback port the OS picked a moment ago
    stop_process(popen_or_process)           # SIGTERM, then SIGKILL after a timeout; nothing else signalled
    watch = die_with_parent(parent_pid)      # in the child: exit when the parent goes

die_with_parent: on Linux the kernel sends SIGTERM to the child when the parent goes (PR_SET_PDEATHSIG,
which Linux ties to the thread that started the child, so ask for it only when that was the main thread),
and on every system a thread polls the parent's PID every 0.2 s. Left out: Windows' job objects (the PID
poll is the only watch there).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

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
