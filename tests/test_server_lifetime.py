"""A server started by ServerProcess ends with whatever started it, however that ends.

A notebook kernel that was restarted, shut down or killed used to leave chapter 14's server running (port
open, ~384 MB resident). Here a parent process starts a server and is SIGKILLed, and a real Jupyter
kernel starts one and is restarted, shut down and killed; each time the server's port must close and
its process exit within 5 s of the parent's end.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
START = (
    "from helpers.serving.launch import ServerProcess\n"
    "server = ServerProcess(max_num_seqs=4, num_blocks=64).start()\n"
    "print('SERVER', server.port, server.process.pid, flush=True)\n"
)


def exited(pid: int) -> bool:
    """Gone, or a zombie nobody has reaped yet (it holds no port and runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def seconds_until_gone(port: int, pid: int, limit: float = 10.0) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit and (port_open(port) or not exited(pid)):
        time.sleep(0.05)
    return time.perf_counter() - t0


def env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_killed_parent_takes_its_server_along():
    parent = subprocess.Popen(
        [sys.executable, "-c", START + "import time\ntime.sleep(600)\n"], env=env(), stdout=subprocess.PIPE, text=True
    )
    try:
        line = parent.stdout.readline()
        _, port, pid = line.split()
        port, pid = int(port), int(pid)
        assert port_open(port)
        parent.kill()  # SIGKILL: no atexit, no finalizer; only the server's own watch can notice
        parent.wait(10)
        gone = seconds_until_gone(port, pid)
        print(f"\nparent SIGKILLed: server gone after {gone:.2f} s")
        assert gone < 5.0
    finally:
        parent.kill()


def kernel_server(km):
    """Start a server inside the kernel; returns (client, port, server pid, kernel pid)."""
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    out = []
    kc.execute_interactive(
        START + "import os\nprint('KERNEL', os.getpid())",
        timeout=120,
        output_hook=lambda msg: out.append(msg["content"].get("text", "")),
    )
    text = "".join(out)
    _, port, pid = text.split("SERVER")[1].split("\n")[0].split(" ")
    return kc, int(port), int(pid), int(text.split("KERNEL")[1].split()[0])


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_jupyter_kernel_restarted_shut_down_or_killed_takes_its_server_along():
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env(), cwd=str(REPO))
    try:
        timings = {}
        kc, port, pid, _ = kernel_server(km)
        km.restart_kernel(now=False)  # what Kernel > Restart does: the old kernel is gone when this returns
        timings["restart"] = seconds_until_gone(port, pid)
        kc.stop_channels()
        kc, port, pid, kernel_pid = kernel_server(km)
        os.kill(kernel_pid, signal.SIGKILL)
        timings["SIGKILL"] = seconds_until_gone(port, pid)
        kc.stop_channels()
        km.restart_kernel(now=True)
        kc, port, pid, _ = kernel_server(km)
        km.shutdown_kernel(now=False)  # Kernel > Shut Down
        timings["shutdown"] = seconds_until_gone(port, pid)
        kc.stop_channels()
        print("\nserver gone after: " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
        assert all(t < 5.0 for t in timings.values()), timings
    finally:
        if km.is_alive():
            km.shutdown_kernel(now=True)
