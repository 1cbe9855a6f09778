"""Worker processes on one machine, joined by torch.distributed (gloo, over 127.0.0.1).

    with WorkerGroup(world_size=2, timeout_s=120) as group:     # starts 2 processes, one thread each
        results = group.run(my_task, arg)                         # my_task(rank, world_size, arg) on every rank
    # here both processes have exited (killed by PID if they did not stop when asked)

A task is a module-level function (it travels to the workers by name, as spawn requires). Every rank
runs it; `run` returns the ranks' return values as a list, rank 0 first. The group is bounded in time
and fails loudly:

- each `run` (and the start-up) has a deadline; past it, every worker is killed and WorkerError raised;
- a worker that dies (crash, os._exit, killed) is noticed within a fraction of a second; the survivors,
  which would otherwise wait forever inside a collective for the dead one, are killed, and WorkerError
  names the rank, its PID, its exit code and the last lines it wrote;
- an exception inside a task ends the group the same way, with the worker's traceback;
- workers exit on their own when the process that started them goes away, even mid-task
  (`processes.die_with_parent`), or after `idle_timeout_s` without work.

The workers' stdout and stderr go to a log file (a notebook would otherwise show their C++ warnings),
quoted in error messages. The port is a free one the OS picks on 127.0.0.1; gloo talks over the
loopback interface. The same code runs on GPUs with backend="nccl" and one device per rank.

Left out: more than one machine, restarting a failed worker, GPU placement.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import queue
import socket
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

from ..processes import die_with_parent, free_port

POLL_S = 0.1


@functools.lru_cache(maxsize=1)
def worker_model():
    """The shipped course model in float32 on the CPU, loaded once per worker process and shared by
    the tasks it runs (they only read it)."""
    import torch

    from ..checkpoint import load_model

    return load_model("target", device="cpu", dtype=torch.float32)[0]


class WorkerError(RuntimeError):
    """A worker died, raised an exception, or the group ran past its deadline."""


def loopback_interface() -> str | None:
    """The loopback interface's name ('lo' on Linux, 'lo0' on macOS), for gloo; None if not found."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (AttributeError, OSError):  # not available on every platform
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


def _worker_main(
    rank,
    world_size,
    port,
    threads,
    tasks,
    results,
    log_path,
    parent_pid,
    idle_timeout_s,
    timeout_s,
    parent_death_signal,
):
    """Entry point of each worker process: silence, join the group, then run tasks until told to stop."""
    # end with the starter even in the middle of a task (a busy worker never reaches the idle check below)
    die_with_parent(parent_pid, use_signal=parent_death_signal)
    log = open(log_path, "w", buffering=1)
    os.dup2(log.fileno(), 1)  # C++ warnings from gloo go to the file, not to the notebook
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    os.environ["OMP_NUM_THREADS"] = str(threads)
    iface = loopback_interface()
    if iface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        results.put((rank, "ready", os.getpid()))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        return
    idle_since = time.monotonic()
    while True:
        try:
            job = tasks.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent_pid or time.monotonic() - idle_since > idle_timeout_s:
                break  # orphaned or forgotten: do not linger
            continue
        if job is None:  # the polite way to stop
            break
        fn, args = job
        try:
            results.put((rank, "ok", fn(rank, world_size, *args)))
        except BaseException:
            results.put((rank, "error", traceback.format_exc()))
        idle_since = time.monotonic()
    dist.destroy_process_group()
    log.flush()
    # every result has been received (the parent asked us to stop only after that): skip the slow
    # interpreter teardown of a process that imported torch
    os._exit(0)


class WorkerGroup:
    """`world_size` worker processes in one torch.distributed group (gloo), each with `threads` threads.

    timeout_s:      deadline of the start-up and of each `run` (override per call with run(timeout_s=...)).
    idle_timeout_s: a worker given nothing to do for this long exits by itself.
    """

    def __init__(self, world_size: int = 2, timeout_s: float = 120.0, threads: int = 1, idle_timeout_s: float = 600.0):
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1; got {world_size!r}")
        if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s must be a number > 0; got {timeout_s!r}")
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1; got {threads!r}")
        self.world_size, self.timeout_s, self.threads = world_size, float(timeout_s), threads
        self.idle_timeout_s = float(idle_timeout_s)
        self.processes: list = []
        self.port: int | None = None
        self._log_dir: str | None = None
        self._closed = False

    # -- life cycle ------------------------------------------------------------------------------

    def start(self) -> "WorkerGroup":
        if self.processes:
            raise WorkerError("this WorkerGroup was already started")
        ctx = mp.get_context("spawn")  # a fresh interpreter: no state copied from the notebook's process
        self._log_dir = tempfile.mkdtemp(prefix="workers_")
        self.port = free_port()
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        for rank in range(self.world_size):
            p = ctx.Process(
                target=_worker_main,
                daemon=True,
                name=f"worker-rank{rank}",
                args=(
                    rank,
                    self.world_size,
                    self.port,
                    self.threads,
                    self._tasks[rank],
                    self._results,
                    self.log_path(rank),
                    os.getpid(),
                    self.idle_timeout_s,
                    self.timeout_s,
                    threading.current_thread() is threading.main_thread(),
                ),
            )
            p.start()
            self.processes.append(p)
        self._collect("start-up", self.timeout_s, expect="ready")
        return self

    def __enter__(self) -> "WorkerGroup":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def alive(self) -> list[bool]:
        return [p.is_alive() for p in self.processes]

    def log_path(self, rank: int) -> str:
        return str(Path(self._log_dir) / f"rank{rank}.log")

    def close(self, grace_s: float = 10.0) -> None:
        """Ask every worker to stop; kill (by PID) any still running after `grace_s`; wait for all."""
        if self._closed or not self.processes:
            self._closed = True
            return
        self._closed = True
        for q, p in zip(self._tasks, self.processes):
            if p.is_alive():
                try:
                    q.put(None)
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + grace_s
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
        self._kill_all()

    def _kill_all(self) -> None:
        self._closed = True
        for p in self.processes:
            if p.is_alive():
                p.kill()  # SIGKILL to this PID only
        for p in self.processes:
            p.join(5.0)
        for q in [*getattr(self, "_tasks", []), getattr(self, "_results", None)]:
            if q is not None:
                q.close()
                q.cancel_join_thread()

    # -- running tasks ---------------------------------------------------------------------------

    def run(self, fn, *args, timeout_s: float | None = None) -> list:
        """Run fn(rank, world_size, *args) on every worker; return the results, rank 0 first."""
        if not self.processes:
            raise WorkerError("start the WorkerGroup first (use `with WorkerGroup(...) as group:`)")
        if self._closed:
            raise WorkerError("this WorkerGroup is closed; start a new one")
        if not callable(fn) or getattr(fn, "__qualname__", "").count("<"):
            raise ValueError(f"fn must be a module-level function (workers import it by name); got {fn!r}")
        for q in self._tasks:
            q.put((fn, args))
        return self._collect(getattr(fn, "__name__", "task"), timeout_s or self.timeout_s)

    def _collect(self, what: str, timeout_s: float, expect: str = "ok") -> list:
        out: dict[int, object] = {}
        deadline = time.monotonic() + timeout_s
        while len(out) < self.world_size:
            try:
                rank, status, value = self._results.get(timeout=POLL_S)
            except queue.Empty:
                self._check_alive(what)
                if time.monotonic() > deadline:
                    waiting = sorted(set(range(self.world_size)) - set(out))
                    self._kill_all()
                    raise WorkerError(
                        f"{what} did not finish within {timeout_s:.0f} s (still waiting for "
                        f"rank {waiting}); all workers were killed"
                    ) from None
                continue
            if status == "error":
                # a rank whose peer died sees "connection closed" inside the collective: name the dead
                # worker as the cause if there is one (it may take a moment to be reaped: seconds on a busy machine)
                reap_deadline = time.monotonic() + 3.0
                while time.monotonic() < reap_deadline:
                    self._check_alive(what)
                    time.sleep(0.05)
                self._kill_all()
                raise WorkerError(f"{what} failed on rank {rank}; all workers were stopped. Its traceback:\n{value}")
            out[rank] = value
        return [out[r] for r in range(self.world_size)]

    def _check_alive(self, what: str) -> None:
        for rank, p in enumerate(self.processes):
            if p.exitcode is not None:  # exited while we were waiting for it
                pid, code = p.pid, p.exitcode
                self._kill_all()
                raise WorkerError(
                    f"worker rank {rank} (pid {pid}) died with exit code {code} during {what}; "
                    f"the other workers were killed. Its last output:\n{self._tail(rank)}"
                )

    def _tail(self, rank: int, n_lines: int = 8) -> str:
        try:
            lines = Path(self.log_path(rank)).read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n_lines:]) or "(nothing)"
