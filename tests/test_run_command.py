"""`make run` as a newcomer sees it: scripts/run.py on a private port and var folder prints its
one block (URL, sign-ins, token, a curl) only once /readyz answers 200, keeps worker banners
and periodic logs in var/logs/ (shown with --verbose), and stops everything on Ctrl-C. The
Makefile installs only runtime packages for `make run`."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from scripts.procs import free_port
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 240.0


def run_env(tmp_path: Path, port: int, tiny_model: Path) -> dict:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("IMAGEGEN_", "DJANGO_", "REDIS_URL", "DATABASE_URL"))}
    return {
        **keep, "PORT": str(port), "IMAGEGEN_VAR_DIR": str(tmp_path / "var"),
        "IMAGEGEN_MODEL_PATH": str(tiny_model), "IMAGEGEN_MODEL_VERSION": "tiny-random",
        "IMAGEGEN_IMAGE_CLASSIFIER": "python:tests.fake_classifiers:Scripted",
        "IMAGEGEN_TORCH_THREADS": "1", "IMAGEGEN_REAPER_INTERVAL": "1",
    }


class Output:
    """Lines of the child's stdout, each with the /readyz status seen right when it was read."""

    def __init__(self, proc: subprocess.Popen, port: int):
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        self.port = port
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc) -> None:
        for line in iter(proc.stdout.readline, ""):
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def drain(self) -> None:
        """Take in every line printed so far."""
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return
            if line is not None:
                self.seen.append(line)

    def until(self, predicate, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                raise AssertionError("run.py exited:\n" + "\n".join(self.seen[-40:]))
            self.seen.append(line)
            if predicate(line):
                return line
        raise AssertionError(f"not seen within {timeout:.0f}s:\n" + "\n".join(self.seen[-40:]))


def readyz(port: int) -> int:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code
    except httpx.HTTPError:
        return 0


def start(tmp_path, tiny_model, *args):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "scripts/run.py", *args], cwd=ROOT, env=run_env(tmp_path, port, tiny_model),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return proc, port, Output(proc, port)


def stop(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.timeout(420)
def test_the_block_appears_only_once_ready_and_worker_logs_stay_in_files(tmp_path, tiny_model):
    proc, port, out = start(tmp_path, tiny_model)
    try:
        out.until(lambda line: "waiting for" in line and "/readyz" in line, 120)
        first = out.until(lambda line: "imagegen is ready at" in line, READY_TIMEOUT)
        assert readyz(port) == 200, "the block was printed before /readyz answered 200"
        assert f"http://127.0.0.1:{port}/" in first
        block = [first]
        while not block[-1].startswith("─"):
            block.append(out.until(lambda line: True, 10))
        text = "\n".join(block)
        assert "demo / demo" in text and "moderator / moderator" in text
        token_line = next(line for line in block if "API token" in line)
        token = token_line.split()[-1]
        assert re.fullmatch(r"ig_[0-9a-f]{8}_[A-Za-z0-9_-]{43}", token), token  # jobs/access/tokens.py's form
        assert f"Authorization: Token {token}" in text and f"http://127.0.0.1:{port}/api/v1/jobs" in text
        assert "Ctrl-C stops everything." in text
        before = "\n".join(out.seen[: out.seen.index(first)])
        assert token not in before, "the token was printed before the service was ready"

        # The token works.
        mine = httpx.get(f"http://127.0.0.1:{port}/api/v1/jobs", headers={"Authorization": f"Token {token}"}, timeout=10)
        assert mine.status_code == 200
        # The reaper runs (and logs) every second here: once it has run twice more, none of that
        # may have reached the terminal.
        logs = tmp_path / "var" / "logs"

        def reaps() -> int:
            return (logs / "worker-cpu.log").read_text().count("jobs.pipeline.tasks.reap")

        ran = reaps()
        wait_until(lambda: reaps() >= ran + 2, 30, "the reaper never ran")
        out.drain()
        assert {p.name for p in logs.iterdir()} >= {"web.log", "worker-cpu.log", "worker-gpu.log"}
        assert "[tasks]" in (logs / "worker-cpu.log").read_text()  # the banner is there, not on the terminal
        assert "run-info.txt" in {p.name for p in (tmp_path / "var").iterdir()}
        everything = "\n".join(out.seen)
        for banner in ("-------------- ", "[tasks]", "Listening on TCP address", "Sending due task", "succeeded in"):
            assert banner not in everything, f"{banner!r} reached the terminal"

        proc.send_signal(signal.SIGINT)
        out.until(lambda line: line.endswith("stopped"), 60)
        assert proc.wait(timeout=30) == 0
        assert readyz(port) == 0, "the web server still answers after Ctrl-C"
    finally:
        stop(proc)


@pytest.mark.django_db
def test_issue_token_moderator_grants_the_review_permission():
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("issue_token", "mia", "--password", "pw", "--moderator", stdout=open(os.devnull, "w"))
    mia = get_user_model().objects.get(username="mia")
    assert mia.is_staff and mia.has_perm("safety.review_content") and mia.check_password("pw")


def test_make_run_installs_only_what_running_needs():
    dry = subprocess.run(["make", "-n", "-B", "run", "VENV=/nonexistent-venv"], cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert "-r requirements.txt" in dry.stdout and "requirements-dev.txt" not in dry.stdout
    dry = subprocess.run(["make", "-n", "-B", "install", "VENV=/nonexistent-venv"], cwd=ROOT, capture_output=True, text=True)
    assert "-r requirements.txt" in dry.stdout and "-r requirements-dev.txt" in dry.stdout  # what CI and `make test` get


def _processes_with(marker: str) -> list[int]:
    """Live processes whose environment carries `marker` (every process of one stack)."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes() and (entry / "stat").read_text().split()[2] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _commands(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160])
        except OSError:
            pass
    return out


@pytest.mark.timeout(420)
def test_verbose_shows_the_logs_here_too_and_nothing_outlives_a_supervisor_killed_outright(tmp_path, tiny_model):
    """`--verbose` shows the workers' logs on the terminal as well as in var/logs/. Then SIGKILL
    of run.py alone (not its group: every child has a session of its own): the web server and its
    worker processes, every Celery worker with its pool and embedded beat, and the private Redis
    all go within seconds. (One stack for both: a `make run` start costs every process's imports;
    Ctrl-C is the first test's.)"""
    marker = f"IMAGEGEN_TEST_STACK={tmp_path.name}"
    port = free_port()
    env = {**run_env(tmp_path, port, tiny_model), "IMAGEGEN_TEST_STACK": tmp_path.name}
    proc = subprocess.Popen([sys.executable, "scripts/run.py", "--verbose"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out = Output(proc, port)
    try:
        # Both, in whichever order they come: the supervisor's "started" line and a worker's banner.
        def banner(line: str) -> bool:
            return line.startswith(("worker-cpu |", "worker-gpu |")) and "[tasks]" in line

        out.until(lambda line: any(map(banner, out.seen)) and any("started web" in seen for seen in out.seen), 180)
        assert (tmp_path / "var" / "logs" / "worker-gpu.log").exists()
        # web (master + 2 processes), cpu (main + 2 pool + beat), classify, io, webhooks, gpu, Redis
        wait_until(lambda: len(_processes_with(marker)) >= 12, 120, "the stack never started all its processes")
        before = _processes_with(marker)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 60
        while (left := _processes_with(marker)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], f"{len(left)} of {len(before)} processes outlived the supervisor: {_commands(left)}"
    finally:
        for pid in _processes_with(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.timeout(180)
def test_a_worker_that_refuses_to_start_leaves_no_pool_process_behind(tmp_path, worker_env):
    """A prefork worker with an embedded beat (as `make run`'s cpu worker) whose image gate is
    misconfigured exits 3 at start; its pool processes and its beat go with it, so a supervisor
    restarting it does not pile up orphans (the beat was left behind before)."""
    marker = f"IMAGEGEN_TEST_STACK={tmp_path.name}"
    env = {**worker_env, "IMAGEGEN_IMAGE_CLASSIFIER": "python:tests.fake_classifiers:NoSuchClassifier",
           "IMAGEGEN_DIE_WITH_PARENT": "1", "IMAGEGEN_TEST_STACK": tmp_path.name, "IMAGEGEN_QUEUE_CLASSIFY": "classify-refused"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "imagegen", "worker", "-Q", "classify-refused", "-c", "2", "-B", "--schedule", str(tmp_path / "beat"),
         "--without-gossip", "--without-mingle", "-n", f"refused-{tmp_path.name}@%h"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert worker.wait(timeout=120) == 3
        deadline = time.monotonic() + 60
        while (left := _processes_with(marker)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], f"{len(left)} processes of the refused worker are left"
    finally:
        for pid in _processes_with(marker):
            os.kill(pid, signal.SIGKILL)
        # Its refusal is written to the run's Redis for /readyz (a worker that starts cleanly
        # clears it): clear it here, so a later test's readiness is not this worker's.
        from gpu_tasks.worker import GATE_ERROR_KEY
        from imagegen.redis_client import PREFIX, get_redis

        get_redis().delete(PREFIX + GATE_ERROR_KEY)
