"""`make run`: the whole service on one machine, supervised.

Migrates, starts a private Redis when REDIS_URL is unset (never on 6379), the web tier (uvicorn,
IMAGEGEN_WEB_PROCESSES processes on one port, a thread pool for sync views in each), a Celery
worker per pool (cpu with the periodic reaper, classify, io, webhooks) and one GPU worker
(process_commands); restarts any that dies. Every child dies with the supervisor, even one
killed outright, and so do the processes they fork (imagegen/lifetime.py).
Once /readyz answers 200 it prints one block: the URL, the demo and moderator sign-ins, an API
token and a curl to try (also written to var/run-info.txt). Until then it says what it is
waiting for. Worker banners and routine logs go to var/logs/<process>.log (`--verbose`, or
`make run VERBOSE=1`, shows them here too). Ctrl-C (or SIGTERM) stops everything it started.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagegen.lifetime import ENV as DIE_WITH_PARENT  # noqa: E402
from imagegen.lifetime import child_preexec  # noqa: E402
from scripts.procs import stop_group  # noqa: E402

PY = sys.executable
READY_POLL_SECONDS = 0.5
WAITING_NOTE_EVERY = 15.0  # seconds between "still waiting for ..." lines
LOG_TAIL_LINES = 12


def web_processes(env: dict) -> int:
    """IMAGEGEN_WEB_PROCESSES, or one per CPU core (at most 8) when it is 0 or unset."""
    value = int(env.get("IMAGEGEN_WEB_PROCESSES") or 0)
    return value if value > 0 else max(1, min(8, os.cpu_count() or 1))


def web_command(env: dict, port: str, host: str = "127.0.0.1") -> list[str]:
    """The web tier: uvicorn with one process per web_processes() on one port, sync views on
    IMAGEGEN_WEB_THREADS threads in each (imagegen/asgi.py); the processes share nothing but
    the database and Redis."""
    return [PY, "-m", "uvicorn", "imagegen.asgi:application", "--host", host, "--port", str(port),
            "--workers", str(web_processes(env)), "--loop", "uvloop", "--http", "httptools", "--ws", "websockets",
            "--lifespan", "off", "--no-access-log", "--timeout-graceful-shutdown", "10"]


# How the embedded default runs each process type of the stage table on one small machine
# (imagegen/stage_table.py PROCESSES says how a deployment runs them): fewer threads, and the
# beat (the reaper's schedule) in the cpu worker.
EMBEDDED_CONCURRENCY = {"cpu": 2, "io": 4, "webhooks": 8}


def process_commands(env: dict, port: str, var: Path, processes: dict | None = None) -> list[tuple[str, list[str]]]:
    """The web tier, and a worker for each process type of the stage table (`processes`: what
    `manage.py deploy_files --queues` prints; each type's queues, every served lane's for the
    GPU worker, and its pool), so that no queue's work waits behind another's: prompt checks
    and the reaper (cpu), the classify stage, publishing and upkeep (io), webhook deliveries (a
    thread pool: they wait on other people's servers), and one GPU worker serving every served
    model's lane and the prompt rewriter (on a small machine one process holding every model
    beats several competing for cores). A stage or process type added to the table is started
    here with no edit."""
    if processes is None:  # read in this process (Django configured: tests, benches)
        from imagegen.stage_table import process_queues
        from scheduling.lanes import served_lanes

        processes = process_queues(served_lanes())
    celery = [PY, "-m", "celery", "-A", "imagegen", "worker", "--loglevel=INFO", "--without-gossip", "--without-mingle"]
    commands = [("web", web_command(env, port))]
    for name, process in processes.items():
        args = celery + ["-Q", ",".join(process["queues"])]
        if process["pool"] != "prefork":
            args.append(f"--pool={process['pool']}")
        if name in EMBEDDED_CONCURRENCY:
            args += ["-c", str(EMBEDDED_CONCURRENCY[name])]
        args += ["-n", f"{name}0@%h" if name == "gpu" else f"{name}@%h"]
        if name == "cpu":
            args += ["-B", "--schedule", str(var / "beat-schedule")]
        commands.append((f"worker-{name}", args))
    return commands


def log(msg: str) -> None:
    print(f"[run] {msg}", flush=True)


def manage(*args: str, env: dict) -> str:
    out = subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        log(f"manage.py {' '.join(args)} failed:\n{out.stdout[-2000:]}{out.stderr[-4000:]}")
        raise SystemExit(out.returncode)
    return out.stdout


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + line for line in text[-lines:])


class Child:
    """One supervised process; its output goes to var/logs/<name>.log (and, verbose, here)."""

    def __init__(self, name: str, cmd: list[str], env: dict, log_dir: Path | None = None, verbose: bool = False):
        self.name, self.cmd, self.env = name, cmd, env
        self.log_path = (log_dir or ROOT / "var" / "logs") / f"{name}.log"
        self.verbose = verbose
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.started_at = 0.0

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logfile = open(self.log_path, "ab")
        stdout: int | IO[bytes] = subprocess.PIPE if self.verbose else logfile
        # Its own session (Ctrl-C reaches only the supervisor, which stops the children in
        # order), and it dies with the supervisor even when that is killed outright.
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, start_new_session=True,
                                     preexec_fn=child_preexec(os.getpid()), stdout=stdout, stderr=subprocess.STDOUT)
        if self.verbose:
            threading.Thread(target=self._tee, args=(self.proc, logfile), daemon=True).start()
        else:
            logfile.close()  # the child holds its own descriptor
        self.started_at = time.monotonic()

    def _tee(self, proc: subprocess.Popen, logfile) -> None:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, b""):
            logfile.write(line)
            logfile.flush()
            sys.stdout.write(f"{self.name:>10} | {line.decode(errors='replace')}")
            sys.stdout.flush()
        logfile.close()

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def restart(self) -> None:
        code = self.exited()
        # Back off when a child dies right after starting, so a broken config does not spin.
        delay = 5.0 if time.monotonic() - self.started_at < 5 else 0.5
        last = tail(self.log_path)
        log(f"{self.name} exited with {code}; restarting in {delay:g}s. Last lines of {self.log_path}:\n{last}")
        time.sleep(delay)
        self.restarts += 1
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, 20)


def readiness(url: str) -> tuple[int, list[str]]:
    """(HTTP status, failing parts) of /readyz; (0, [why]) while it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, []
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read() or b"{}")
            return exc.code, [f"{part}: {body['checks'][part]}" for part in body.get("failing", [])]
        except (ValueError, KeyError):
            return exc.code, []
    except (urllib.error.URLError, OSError) as exc:
        return 0, [f"the web server is not answering yet ({getattr(exc, 'reason', exc)})"]


def _shown(path: Path) -> str:
    """A path as a newcomer reads it: relative to the checkout when it is inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def info_block(port: str, token: str, var: Path, verbose: bool) -> str:
    base = f"http://127.0.0.1:{port}"
    rule = "─" * 78
    logs = f"{_shown(var / 'logs')}/" + ("  (shown here too: --verbose)" if verbose else "  (make run VERBOSE=1 shows them here)")
    return "\n".join([
        rule,
        f"  imagegen is ready at {base}/",
        "",
        "  web page      sign in as  demo / demo",
        f"  moderator     sign in as  moderator / moderator   (review queue: {base}/admin/)",
        f"  API token     {token}",
        "  try it        curl -s -H \"Authorization: Token " + token + "\" -H \"Content-Type: application/json\" \\",
        f"                     -d '{{\"prompt\": \"a red circle on a blue background\"}}' {base}/api/v1/jobs",
        f"  API docs      {base}/api/docs/",
        f"  logs          {logs}",
        "",
        "  Ctrl-C stops everything.",
        rule,
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run imagegen on this machine (web, workers, a private Redis).")
    parser.add_argument("--verbose", action="store_true", help="show the workers' and the web server's logs here too")
    args = parser.parse_args(argv)

    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")
    env["PYTHONUNBUFFERED"] = "1"
    env[DIE_WITH_PARENT] = "1"  # what the children fork goes with them (imagegen/lifetime.py)
    port = env.get("PORT", "8000")
    var = Path(env.get("IMAGEGEN_VAR_DIR", ROOT / "var"))
    var.mkdir(parents=True, exist_ok=True)
    log_dir = var / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)

    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    redis_proc = None
    children: list[Child] = []
    try:
        if not env.get("REDIS_URL"):
            from scripts.private_redis import start as start_redis

            redis_proc, url = start_redis(var / "redis")
            env["REDIS_URL"] = url
            # The URL carries the generated password: say where it is, not what it is.
            log(f"started a private Redis on 127.0.0.1:{url.rsplit(':', 1)[1].split('/')[0]} "
                f"(password in {var / 'redis' / 'password'})")

        model_path = Path(env.get("IMAGEGEN_MODEL_PATH", ""))
        shipped = [ROOT / "models" / name / "model_index.json" for name in ("shapes-v2", "shapes-v1")]
        if not env.get("IMAGEGEN_MODEL_PATH") and not any(m.exists() for m in shipped):
            model_path = var / "models" / "tiny-random"
            if not (model_path / "model_index.json").exists():
                log("no trained model shipped: writing a tiny random pipeline (it makes noise)")
                manage("make_tiny_pipeline", str(model_path), env=env)
        classifier = ROOT / "models" / "shapes-classifier-v3"
        if not env.get("IMAGEGEN_IMAGE_CLASSIFIER") and not (classifier / "config.json").exists():
            # Said explicitly, and on every verdict ("unchecked"); the service itself never
            # falls back on its own: an unset or broken classifier setting fails closed.
            env["IMAGEGEN_IMAGE_CLASSIFIER"] = "none"
            log("no shipped image classifier: running with IMAGEGEN_IMAGE_CLASSIFIER=none (verdicts say unchecked)")
        log("preparing the database and static files…")
        manage("migrate", "--noinput", env=env)
        manage("collectstatic", "--noinput", env=env)
        # Tokens are stored hashed and shown once: each start issues the demo user a new one
        # and revokes the previous.
        token = manage("issue_token", "demo", "--password", "demo", "--rotate", env=env).strip().splitlines()[-1]
        manage("issue_token", "moderator", "--password", "moderator", "--moderator", "--rotate", env=env)

        processes = json.loads(manage("deploy_files", "--queues", env=env).strip().splitlines()[-1])
        children = [Child(name, cmd, env) for name, cmd in process_commands(env, port, var, processes)]
        for child in children:
            child.log_path, child.verbose = log_dir / f"{child.name}.log", args.verbose
            child.start()
        log(f"started {', '.join(f'{c.name} (pid {c.proc.pid})' for c in children if c.proc)}; logs in {_shown(log_dir)}/")
        log(f"waiting for http://127.0.0.1:{port}/readyz (the GPU worker loads the model first)…")

        ready_url = f"http://127.0.0.1:{port}/readyz"
        block = info_block(port, token, var, args.verbose)
        ready = False
        waiting_since = time.monotonic()
        next_note = waiting_since + WAITING_NOTE_EVERY
        while not stopping:
            for child in children:
                if stopping:
                    break
                if child.exited() is not None:
                    child.restart()
                    if ready:
                        log(f"(imagegen stays at http://127.0.0.1:{port}/ — sign-ins and token in {_shown(var / 'run-info.txt')}; Ctrl-C stops)")
            status, failing = readiness(ready_url)
            if status == 200 and not ready:
                ready = True
                (var / "run-info.txt").write_text(block + "\n")
                print("\n" + block + "\n", flush=True)
            elif status != 200 and ready:
                ready = False
                waiting_since = time.monotonic()
                next_note = waiting_since + WAITING_NOTE_EVERY
                log(f"not ready any more ({'; '.join(failing) or status}); waiting for it to come back…")
            elif status != 200 and time.monotonic() >= next_note:
                waited = time.monotonic() - waiting_since
                log(f"still waiting after {waited:.0f}s: {'; '.join(failing) or f'HTTP {status}'}")
                next_note = time.monotonic() + WAITING_NOTE_EVERY
            time.sleep(READY_POLL_SECONDS)
    finally:
        log("stopping (web, workers, Redis)…")
        for child in reversed(children):
            child.stop()
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(timeout=10)
        log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
