"""Benchmark: many concurrent websocket watchers on running jobs.

    .venv/bin/python bench/websocket_watchers.py [--watchers 50] [--jobs 8] [--steps 60]
    .venv/bin/python bench/websocket_watchers.py --url http://127.0.0.1:8000 --token TOKEN

Without --url the script starts everything itself, like the tests: a private Redis, a temp
var dir with the tiny random pipeline, migrate, daphne on a free loopback port, a cpu/io
Celery worker; it submits the jobs, connects every watcher while the jobs wait in the queue,
and only then starts the GPU worker, so every watcher is subscribed before step 1.

Latency: each progress event carries `sent_at` (time.time() when the worker's step callback
published it, jobs/realtime/events.py); a watcher records time.time() on receipt. Both ends are on
this machine, so receipt - sent_at is the worker -> Redis channel layer -> daphne -> socket
-> client latency. The report splits the latency: in the worker
(stamp -> the channel layer's group_send), to the first watcher of a job and step, and the
fan-out from there to the others. Lost: per watcher, progress steps missing between the first one it saw
and the total (with the self-started set-up the first is step 1), and whether the final
status arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import websockets

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import pct  # noqa: E402
from scripts.procs import stop_group  # noqa: E402

PY = sys.executable
TERMINAL = {"done", "blocked", "failed", "cancelled"}
LOAD_BEFORE = (0.0, 0.0, 0.0)


# The self-started GPU worker runs through this shim only to allow a switch-interval experiment.
GPU_WORKER_SHIM = """
import os, sys
if os.environ.get("BENCH_SWITCH_INTERVAL"):
    sys.setswitchinterval(float(os.environ["BENCH_SWITCH_INTERVAL"]))
from celery.__main__ import main
sys.argv[0] = "celery"
sys.exit(main())
"""


# --- the self-started service ---------------------------------------------------------------


class Service:
    def __init__(self):
        from scripts.private_redis import start
        from scripts.procs import free_port

        self.var = Path(tempfile.mkdtemp(prefix="imagegen-bench-ws-"))
        self.procs: list[subprocess.Popen] = []
        self.redis, redis_url = start(self.var / "redis")
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "imagegen.settings",
            "PYTHONUNBUFFERED": "1",
            "IMAGEGEN_VAR_DIR": str(self.var),
            "REDIS_URL": redis_url,
            "IMAGEGEN_MODEL_PATH": str(self.var / "models" / "tiny-random"),
            "IMAGEGEN_MODEL_VERSION": "tiny-random",
            "IMAGEGEN_IMAGE_CLASSIFIER": "none",
            "IMAGEGEN_TORCH_THREADS": "1",
            "IMAGEGEN_USER_MAX_STREAMS": "100000",  # 50 watchers of one user: past the per-user stream cap
        }
        self.env.pop("DATABASE_URL", None)
        self.manage("make_tiny_pipeline", str(self.var / "models" / "tiny-random"))
        self.manage("migrate", "--noinput", "-v", "0")
        self.token = self.manage("issue_token", "bench").strip().splitlines()[-1]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.spawn("daphne", [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "imagegen.asgi:application"])
        celery = [PY, "-m", "celery", "-A", "imagegen", "worker", "--pool=solo", "--loglevel=INFO", "--without-gossip", "--without-mingle"]
        self.spawn("worker-cpu", celery + ["-Q", "cpu,io", "-n", "cpu@%h"])
        self.gpu_cmd = [PY, "-c", GPU_WORKER_SHIM, *celery[3:], "-Q", "gpu.shapes", "-n", "gpu@%h"]
        self.wait_http()

    def manage(self, *args: str) -> str:
        out = subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{out.stderr[-2000:]}")
        return out.stdout

    def spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.var / f"{name}.log", "ab")
        proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def wait_http(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("daphne did not start: " + (self.var / "daphne.log").read_text()[-2000:])

    def start_gpu(self) -> None:
        self.spawn("worker-gpu", self.gpu_cmd)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_group(proc, 15)
        self.redis.terminate()
        self.redis.wait(timeout=10)
        if os.environ.get("BENCH_KEEP_VAR"):
            print(f"logs kept in {self.var}")
        else:
            shutil.rmtree(self.var, ignore_errors=True)


# --- the watchers ---------------------------------------------------------------------------


class Watcher:
    def __init__(self, n: int, job_id: str):
        self.n = n
        self.job_id = job_id
        self.latencies_ms: list[float] = []
        self.receipts: list[tuple[int, float, float]] = []  # (step, sent_at, received)
        self.steps: list[int] = []
        self.total = 0
        self.final = None
        self.previews = 0
        self.connected = asyncio.Event()
        self.error = ""

    async def run(self, base_url: str, token: str, timeout: float) -> None:
        parts = urlsplit(base_url)
        ws_url = f"{'wss' if parts.scheme == 'https' else 'ws'}://{parts.netloc}/ws/jobs/{self.job_id}/"
        try:
            async with websockets.connect(
                ws_url, origin=base_url, additional_headers={"Authorization": f"Token {token}"},
                open_timeout=30, max_size=2**22,
            ) as ws:
                self.connected.set()
                first_status = None
                async for frame in ws:
                    received = time.time()
                    event = json.loads(frame)
                    if event["type"] == "status":
                        first_status = first_status or event["status"]
                        if event["status"] in TERMINAL:
                            self.final = event["status"]
                            break
                    elif event["type"] == "progress":
                        # the replayed latest progress of a job that was already running: not a live event
                        replayed = not self.steps and first_status == "running" and received - event.get("sent_at", received) > 1.0
                        self.steps.append(event["step"])
                        self.total = event["total"]
                        if "sent_at" in event and not replayed:
                            self.latencies_ms.append((received - event["sent_at"]) * 1000.0)
                            self.receipts.append((event["step"], event["sent_at"], received))
                    elif event["type"] == "preview":
                        self.previews += 1
        except Exception as exc:  # noqa: BLE001 - reported per watcher
            self.error = f"{type(exc).__name__}: {exc}"
            self.connected.set()

    @property
    def lost(self) -> int:
        if not self.steps:
            return self.total
        expected = set(range(self.steps[0], self.total + 1))
        return len(expected - set(self.steps))

    @property
    def missed_before_connect(self) -> int:
        return (self.steps[0] - 1) if self.steps else 0


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100); NaN for no values."""
    value = pct(values, q / 100.0)
    return float("nan") if value is None else value


async def bench(args, base_url: str, token: str, service: Service | None) -> dict:
    headers = {"Authorization": f"Token {token}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as api:
        jobs = []
        for i in range(args.jobs):
            r = await api.post("/api/v1/jobs", json={"prompt": "a red circle on a blue background", "width": args.size[0], "height": args.size[1], "steps": args.steps, "seed": 100 + i})
            r.raise_for_status()
            jobs.append(r.json()["id"])
        watchers = [Watcher(n, jobs[n % len(jobs)]) for n in range(args.watchers)]
        tasks = [asyncio.create_task(w.run(base_url, token, args.timeout)) for w in watchers]
        await asyncio.wait_for(asyncio.gather(*(w.connected.wait() for w in watchers)), 60)
        connected_at = time.monotonic()
        if service is not None:
            service.start_gpu()
        await asyncio.wait_for(asyncio.gather(*tasks), args.timeout)
        elapsed = time.monotonic() - connected_at
        final_jobs = [(await api.get(f"/api/v1/jobs/{j}")).json() for j in jobs]

    latencies = [v for w in watchers for v in w.latencies_ms]
    # Split each latency: to the first watcher of that job and step (worker -> Redis -> daphne
    # -> the first socket), and from there to this watcher (daphne's fan-out and the client).
    first: dict[tuple[str, int], float] = {}
    for w in watchers:
        for step, _, received in w.receipts:
            key = (w.job_id, step)
            first[key] = min(first.get(key, received), received)
    to_first = [(first[(w.job_id, s)] - sent) * 1000.0 for w in watchers for s, sent, _ in w.receipts]
    fan_out = [(r - first[(w.job_id, s)]) * 1000.0 for w in watchers for s, _, r in w.receipts]
    batches = {}
    for job in final_jobs:
        if job.get("batch"):
            batches[job["batch"]["id"]] = job["batch"]["size"]
    return {
        "watchers": len(watchers),
        "jobs": len(jobs),
        "steps": args.steps,
        "size": f"{args.size[0]}x{args.size[1]}",
        "batches": sorted(batches.values(), reverse=True),
        "job_statuses": sorted(job["status"] for job in final_jobs),
        "wall_seconds": round(elapsed, 2),
        "progress_events_received": len(latencies),
        "latency_ms": {
            "p50": round(percentile(latencies, 50), 2),
            "p90": round(percentile(latencies, 90), 2),
            "p99": round(percentile(latencies, 99), 2),
            "max": round(max(latencies), 2) if latencies else None,
            "mean": round(statistics.fmean(latencies), 2) if latencies else None,
        },
        "latency_to_first_watcher_ms": {"p50": round(percentile(to_first, 50), 2), "p99": round(percentile(to_first, 99), 2)},
        "fan_out_after_first_watcher_ms": {"p50": round(percentile(fan_out, 50), 2), "p99": round(percentile(fan_out, 99), 2)},
        "load_average_before": list(LOAD_BEFORE),
        "load_average_after": list(os.getloadavg()),
        "lost_steps_total": sum(w.lost for w in watchers),
        "watchers_with_losses": sum(1 for w in watchers if w.lost),
        "watchers_missing_final_status": sum(1 for w in watchers if w.final is None),
        "missed_before_connect_total": sum(w.missed_before_connect for w in watchers),
        "previews_received": sum(w.previews for w in watchers),
        "watcher_errors": sorted({w.error for w in watchers if w.error}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--watchers", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=8, help="jobs to watch; watchers are spread over them")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--size", default="64x64")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--url", help="an already running service (then --token is needed)")
    parser.add_argument("--token")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "websocket_watchers.json"))
    args = parser.parse_args()
    args.size = tuple(int(v) for v in args.size.split("x"))
    if args.url and not args.token:
        parser.error("--url needs --token")

    global LOAD_BEFORE
    LOAD_BEFORE = os.getloadavg()
    service = None
    try:
        if args.url:
            base_url, token = args.url.rstrip("/"), args.token
        else:
            print("starting redis, daphne and a cpu worker...", flush=True)
            service = Service()
            base_url, token = service.url, service.token
        result = asyncio.run(bench(args, base_url, token, service))
    finally:
        if service is not None:
            service.stop()

    result = {
        "command": "python " + " ".join(["bench/websocket_watchers.py", *sys.argv[1:]]),
        "target": args.url or "self-started: daphne + celery cpu worker + celery gpu worker (solo), private redis, tiny random pipeline",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "goal": {"p99_ms_below": 50, "lost_steps": 0},
        **result,
    }
    lat = result["latency_ms"]
    rows = [
        ("watchers / jobs / steps", f"{result['watchers']} / {result['jobs']} / {result['steps']} ({result['size']}, batches {result['batches']})"),
        ("progress events received", str(result["progress_events_received"])),
        ("latency p50 / p90 / p99 / max (ms)", f"{lat['p50']} / {lat['p90']} / {lat['p99']} / {lat['max']}"),
        ("  of which to the first watcher p50 / p99", f"{result['latency_to_first_watcher_ms']['p50']} / {result['latency_to_first_watcher_ms']['p99']}"),
        ("  of which fan-out after it p50 / p99", f"{result['fan_out_after_first_watcher_ms']['p50']} / {result['fan_out_after_first_watcher_ms']['p99']}"),
        ("load average before / after (1 min)", f"{result['load_average_before'][0]:.2f} / {result['load_average_after'][0]:.2f}"),
        ("steps lost (watchers with losses)", f"{result['lost_steps_total']} ({result['watchers_with_losses']})"),
        ("watchers missing the final status", str(result["watchers_missing_final_status"])),
        ("previews received", str(result["previews_received"])),
        ("job statuses", ", ".join(sorted(set(result["job_statuses"])))),
        ("wall time (s)", str(result["wall_seconds"])),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"{'metric'.ljust(width)}  value\n{'-' * width}  {'-' * 40}")
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    if result["watcher_errors"]:
        print("errors:", result["watcher_errors"])
    ok = lat["p99"] < 50 and result["lost_steps_total"] == 0 and result["watchers_missing_final_status"] == 0
    print(f"goal (p99 < 50 ms, none lost): {'met' if ok else 'NOT met'}")
    # One entry per mode in the results file, so both figures stay side by side.
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    mode = "url" if args.url else "self-started"
    try:
        previous = json.loads(out.read_text())
        runs = previous.get("runs", {}) if isinstance(previous, dict) else {}
    except (OSError, ValueError):
        runs = {}
    runs[mode] = result
    out.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
