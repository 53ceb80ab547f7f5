"""Child processes for the stack, the tests and the benchmarks: a free loopback port to start one
on, and stopping one started with start_new_session=True (its own process group), so that a
worker's or server's own children go with it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the whole group, as a lost host would, and reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def stop_group(proc: subprocess.Popen, timeout: float, sig: int = signal.SIGTERM) -> None:
    """Send `sig` to the group, wait up to `timeout` seconds, then SIGKILL it."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        kill_group(proc)
