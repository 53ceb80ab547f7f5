"""`make run`: the whole service on one machine, supervised.

Migrates, starts a private Redis when REDIS_URL is unset (never on 6379), the ASGI web server,
a cpu/io Celery worker with the periodic reaper, and one GPU worker; restarts any that dies;
prints the URL and a demo token; Ctrl-C (or SIGTERM) stops everything it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.procs import stop_group  # noqa: E402

PY = sys.executable


def log(msg: str) -> None:
    print(f"[run] {msg}", flush=True)


def manage(*args: str, env: dict) -> str:
    out = subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    return out.stdout


class Child:
    def __init__(self, name: str, cmd: list[str], env: dict):
        self.name, self.cmd, self.env = name, cmd, env
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.started_at = 0.0

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, start_new_session=True)
        self.started_at = time.monotonic()
        log(f"started {self.name} (pid {self.proc.pid})")

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            code = self.proc.returncode
            # Back off when a child dies right after starting, so a broken config does not spin.
            delay = 5.0 if time.monotonic() - self.started_at < 5 else 0.5
            log(f"{self.name} exited with {code}; restarting in {delay:g}s")
            time.sleep(delay)
            self.restarts += 1
            self.start()

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, 20)


def main() -> int:
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")
    env["PYTHONUNBUFFERED"] = "1"
    port = env.get("PORT", "8000")
    var = Path(env.get("IMAGEGEN_VAR_DIR", ROOT / "var"))
    var.mkdir(parents=True, exist_ok=True)

    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    redis_proc = None
    if not env.get("REDIS_URL"):
        from scripts.private_redis import start as start_redis

        redis_proc, url = start_redis(var / "redis")
        env["REDIS_URL"] = url
        # The URL carries the generated password: say where it is, not what it is.
        log(f"private Redis at 127.0.0.1:{url.rsplit(':', 1)[1].split('/')[0]} (password in {var / 'redis' / 'password'})")

    children: list[Child] = []
    try:

        model_path = Path(env.get("IMAGEGEN_MODEL_PATH", ""))
        shipped = ROOT / "models" / "shapes-v1" / "model_index.json"
        if not env.get("IMAGEGEN_MODEL_PATH") and not shipped.exists():
            model_path = var / "models" / "tiny-random"
            if not (model_path / "model_index.json").exists():
                log("no trained model shipped: writing a tiny random pipeline (it makes noise)")
                manage("make_tiny_pipeline", str(model_path), env=env)
        classifier = ROOT / "models" / "shapes-classifier-v1"
        if not env.get("IMAGEGEN_IMAGE_CLASSIFIER") and not (classifier / "config.json").exists():
            # Said explicitly, and on every verdict ("unchecked"); the service itself never
            # falls back on its own: an unset or broken classifier setting fails closed.
            env["IMAGEGEN_IMAGE_CLASSIFIER"] = "none"
            log("no shipped image classifier: running with IMAGEGEN_IMAGE_CLASSIFIER=none (verdicts say unchecked)")
        manage("migrate", "--noinput", env=env)
        manage("collectstatic", "--noinput", env=env)
        # Tokens are stored hashed and shown once: each start issues the demo user a new one
        # and revokes the previous.
        token = manage("issue_token", "demo", "--password", "demo", "--rotate", env=env).strip().splitlines()[-1]

        gpu_queue = env.get("IMAGEGEN_QUEUE_GPU_PREFIX", "gpu.") + env.get("IMAGEGEN_MODEL_NAME", "shapes")
        classify_queue = env.get("IMAGEGEN_QUEUE_CLASSIFY", "classify")
        cpu_queues = f"{env.get('IMAGEGEN_QUEUE_CPU', 'cpu')},{env.get('IMAGEGEN_QUEUE_IO', 'io')},{classify_queue}"
        celery = [PY, "-m", "celery", "-A", "imagegen", "worker", "--loglevel=INFO", "--without-gossip", "--without-mingle"]
        children = [
            Child("web", [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", port, "imagegen.asgi:application"], env),
            Child("worker-cpu", celery + ["-Q", cpu_queues, "-c", "2", "-n", "cpu@%h", "-B", "--schedule", str(var / "beat-schedule")], env),
            Child("worker-gpu", celery + ["-Q", gpu_queue, "--pool=solo", "-n", "gpu0@%h"], env),
        ]
        for child in children:
            child.start()
        log(f"imagegen is up at http://127.0.0.1:{port}/  (sign in as demo / demo)")
        log(f"demo API token: {token}")
        log(
            f'try: curl -s -H "Authorization: Token {token}" -H "Content-Type: application/json" '
            f"-d '{{\"prompt\": \"a red circle on a blue background\"}}' http://127.0.0.1:{port}/api/v1/jobs"
        )
        while not stopping:
            for child in children:
                if stopping:
                    break
                child.check()
            time.sleep(0.5)
    finally:
        log("stopping")
        for child in reversed(children):
            child.stop()
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(timeout=10)
        log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
