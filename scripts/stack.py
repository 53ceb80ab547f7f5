"""The real stack as separate processes, for benchmarks and the fault suite: a private Redis
(or REDIS_URL), a database (SQLite file or DATABASE_URL), Celery workers, optionally the web
server. Everything is configured through the environment, exactly as in production."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.procs import kill_group, stop_group  # noqa: E402

BENCH_LIMITS_OFF = {
    "IMAGEGEN_THROTTLE_SUBMIT": "off", "IMAGEGEN_THROTTLE_READ": "off", "IMAGEGEN_THROTTLE_STREAM": "off", "IMAGEGEN_THROTTLE_IP": "off", "IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE": "0",
    "IMAGEGEN_USER_MAX_IN_REVIEW": "100000", "IMAGEGEN_USER_MAX_STREAMS": "100000",
}


class Stack:
    def __init__(self, **env_overrides: str):
        self.var = Path(tempfile.mkdtemp(prefix="imagegen-stack-"))
        self.env = dict(os.environ)
        self.env.update({"IMAGEGEN_VAR_DIR": str(self.var), "DJANGO_SETTINGS_MODULE": "imagegen.settings", "PYTHONUNBUFFERED": "1"})
        # Benchmarks send far more than a person would, from few users on 127.0.0.1: the abuse
        # limits are off unless a benchmark sets them (bench/reliability_abuse.py does).
        for name, value in BENCH_LIMITS_OFF.items():
            self.env.setdefault(name, value)
        self.env.update(env_overrides)
        self.redis = None
        if not self.env.get("REDIS_URL"):
            from scripts.private_redis import start

            self.redis, self.env["REDIS_URL"] = start(self.var / "redis")
        self.procs: dict[str, subprocess.Popen] = {}

    def apply_to_this_process(self) -> None:
        """Make this process's Django use the stack (call before django.setup())."""
        os.environ.update({k: v for k, v in self.env.items() if k.startswith(("IMAGEGEN_", "REDIS_URL", "DATABASE_URL", "DJANGO_"))})

    def manage(self, *args: str) -> str:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, check=True, capture_output=True, text=True).stdout

    def start_worker(self, name: str, queues: str, beat: bool = False, **env: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "celery", "-A", "imagegen", "worker", "-Q", queues, "--pool=solo",
               "-n", f"{name}@%h", "--loglevel=WARNING", "--without-gossip", "--without-mingle"]
        if beat:
            cmd += ["-B", "--schedule", str(self.var / f"beat-{name}")]
        log = open(self.var / f"{name}.log", "ab")
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def start_web(self, port: int, **env: str) -> subprocess.Popen:
        """daphne on 127.0.0.1:port; `env`: extra environment for the web process only (e.g.
        admission limits)."""
        log = open(self.var / "web.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "imagegen.asgi:application"],
                                cwd=ROOT, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs["web"] = proc
        return proc

    def wait_for_gpu_workers(self, model_name: str, n: int, timeout: float = 120.0) -> None:
        from scheduling.heartbeats import live_workers

        deadline = time.monotonic() + timeout
        while len(live_workers(model_name)) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(live_workers(model_name))} of {n} GPU workers came up")
            time.sleep(0.2)

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            stop_group(proc, 20, sig)

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)
        if self.redis is not None:
            self.redis.terminate()

    # --- added for the fault suite (bench/reliability.py); nothing above changed ---

    def redis_port(self) -> int:
        return int(self.env["REDIS_URL"].rsplit(":", 1)[1].split("/")[0])

    def restart_redis(self, down_seconds: float = 0.0) -> None:
        """Kill the private Redis (state, broker queues and channel layer all lost) and start a
        new, empty one on the same port, as a crashed and restarted Redis without persistence."""
        if self.redis is None:
            raise RuntimeError("REDIS_URL points at an external Redis: the stack cannot restart it")
        from scripts.private_redis import start

        port = self.redis_port()
        self.redis.kill()
        self.redis.wait()
        time.sleep(down_seconds)
        self.redis, _ = start(self.var / "redis", port=port)

    def kill(self, name: str) -> None:
        """SIGKILL the process group of a started process, as a lost host would."""
        proc = self.procs.pop(name, None)
        if proc is not None:
            kill_group(proc)
