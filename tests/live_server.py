"""A real ASGI server for end-to-end tests: daphne as a subprocess on a free loopback port,
with the same environment the Celery workers get (same database, Redis, var dir).

The fixture `daphne_server` is registered for every test module by conftest.py (pytest_plugins).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from scripts.procs import free_port, stop_group

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class LiveServer:
    url: str
    host: str
    port: int
    proc: subprocess.Popen
    log_path: Path

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    @property
    def origin(self) -> str:
        return self.url

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def start_daphne(env: dict, log_dir: Path, name: str = "daphne", collectstatic: bool = True) -> LiveServer:
    if collectstatic:
        # Whitenoise serves STATIC_ROOT (collected), as in `make run`. In process: the test
        # settings and daphne share IMAGEGEN_VAR_DIR, so STATIC_ROOT is the same folder.
        from django.core.management import call_command

        call_command("collectstatic", interactive=False, verbosity=0)
    port = free_port()
    log_path = log_dir / f"{name}-{port}.log"
    log = open(log_path, "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "imagegen.asgi:application"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    server = LiveServer(f"http://127.0.0.1:{port}", "127.0.0.1", port, proc, log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daphne exited:\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    stop_daphne(server)
    raise RuntimeError(f"daphne did not answer /healthz:\n{server.log_tail()}")


def stop_daphne(server: LiveServer) -> None:
    stop_group(server.proc, 10)


@pytest.fixture(scope="session")
def daphne_server(worker_env):
    """daphne serving imagegen.asgi:application on 127.0.0.1:<free port>, for the session."""
    server = start_daphne(worker_env, Path(settings.VAR_DIR))
    yield server
    stop_daphne(server)
