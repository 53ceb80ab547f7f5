"""Fair share inside a shape: a heavy user's backlog against light users, FIFO against fair.

    .venv/bin/python bench/fairness.py [--seconds 90] [--light-every 3] [--step-ms 50]

The real stack (daphne, Celery workers, Redis, the database) with one simulated GPU worker
(IMAGEGEN_ACCELERATOR=simulated: the cost model sleeps, so the figures do not depend on this
machine's cores). Every submit goes over HTTP. One heavy user keeps 16 jobs of 8 images queued
(one shape, 8 = the cap: each is a full pass); three light users each submit a 1-image job of
the same shape every --light-every seconds (jittered). Run twice: IMAGEGEN_FAIR_SHARE=false
(first in, first out: the scheduler before fair share) and true.

Reported per run, over jobs submitted in the measured window (after --warm-up seconds):
- light users' queue wait (admission to the GPU worker's claim) p50/p95, in seconds and in
  pass times (the mean seconds of a full pass, measured from the batches); goal p95 <= 2 passes;
- the heavy user's throughput (images per second delivered);
- batch fill (mean images per pass / cap) over the window's passes; goal: not below FIFO's by
  more than 2 points;
- Jain's fairness index over the four users of x_i = (images per job of user i) / (mean queue
  wait of user i): the service each user gets per second of waiting (1.0: all equal; 1/n: one
  user gets it all).

Writes bench/results/fairness.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import pct, wait_web  # noqa: E402
from scripts.procs import free_port  # noqa: E402
from scripts.stack import Stack  # noqa: E402

HEAVY_QUEUED, HEAVY_COUNT = 16, 8


def jain(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    if not xs or not any(xs):
        return None
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def run(a, fair: bool) -> dict:
    stack = Stack(IMAGEGEN_ACCELERATOR="simulated", IMAGEGEN_SIM_STEP_MS=str(a.step_ms),
                  IMAGEGEN_SIM_BATCH_MARGINAL=str(a.marginal), IMAGEGEN_BATCH_CAP=str(HEAVY_COUNT),
                  IMAGEGEN_FAIR_SHARE="true" if fair else "false", IMAGEGEN_CACHE_ENABLED="false",
                  IMAGEGEN_IMAGE_CLASSIFIER="none", IMAGEGEN_USER_MAX_IN_FLIGHT="100000",
                  IMAGEGEN_USER_MAX_IMAGES_PER_DAY="10000000", IMAGEGEN_MAX_QUEUED_IMAGES="100000",
                  IMAGEGEN_MAX_QUEUE_WAIT="100000", IMAGEGEN_LOG_LEVEL="WARNING", IMAGEGEN_LOG_FORMAT="plain")
    stack.apply_to_this_process()
    import django

    django.setup()
    import httpx
    from django.conf import settings
    from django.db import connection

    from jobs.models import Batch, GenerationJob

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    rng = random.Random(a.seed)
    body = {"width": 64, "height": 64, "steps": a.steps, "seed": None}
    try:
        stack.manage("migrate", "--noinput")
        users = ["heavy", "light1", "light2", "light3"]
        tokens = {u: stack.manage("issue_token", u).strip().splitlines()[-1] for u in users}
        stack.start_worker("cpu", f"{settings.QUEUE_CPU},{settings.QUEUE_IO},{settings.QUEUE_CLASSIFY},{settings.QUEUE_WEBHOOKS}", beat=True)
        stack.start_worker("gpu1", settings.QUEUE_GPU)
        stack.start_web(port)
        wait_web(base)
        stack.wait_for_gpu_workers(settings.IMAGEGEN_MODEL_NAME, 1)
        stop = threading.Event()
        errors: list[str] = []

        def post(user: str, count: int, k: int) -> None:
            payload = {**body, "prompt": f"a red circle {user} {k}", "count": count}
            r = httpx.post(base + "/api/v1/jobs", json=payload, headers={"Authorization": f"Token {tokens[user]}"}, timeout=30)
            if r.status_code != 202:
                errors.append(f"{user}: {r.status_code} {r.text[:200]}")

        def heavy() -> None:
            k = 0
            while not stop.is_set():
                queued = GenerationJob.objects.filter(owner__username="heavy", status="queued").count()
                for _ in range(HEAVY_QUEUED - queued):
                    post("heavy", HEAVY_COUNT, k)
                    k += 1
                time.sleep(0.2)
            connection.close()

        def light(user: str, offset: float) -> None:
            k = 0
            time.sleep(offset)
            while not stop.wait(a.light_every * rng.uniform(0.7, 1.3)):
                post(user, 1, k)
                k += 1

        threads = [threading.Thread(target=heavy)] + [
            threading.Thread(target=light, args=(u, i * a.light_every / 3)) for i, u in enumerate(users[1:])]
        for t in threads:
            t.start()
        started = time.time()
        window_from = started + a.warm_up
        window_to = window_from + a.seconds
        time.sleep(a.warm_up + a.seconds)
        stop.set()
        for t in threads:
            t.join()
        # Let the window's light jobs finish (the heavy backlog need not).
        deadline = time.monotonic() + 180
        while GenerationJob.objects.filter(owner__username__startswith="light", status__in=["queued", "running"]).exists():
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        lo, hi = datetime.fromtimestamp(window_from, UTC), datetime.fromtimestamp(window_to, UTC)
        jobs = list(GenerationJob.objects.filter(created_at__gte=lo, created_at__lt=hi).select_related("owner"))
        waits: dict[str, list[float]] = {u: [] for u in users}
        for job in jobs:
            if job.queue_wait_seconds is not None:
                waits[job.owner.username].append(job.queue_wait_seconds)
        batches = list(Batch.objects.filter(started_at__gte=lo, started_at__lt=hi).exclude(pass_started_at=None)
                       .exclude(finished_at=None))
        full = [(b.finished_at - b.pass_started_at).total_seconds() for b in batches if b.size == b.cap]
        pass_seconds = statistics.mean(full) if full else None
        done_heavy = GenerationJob.objects.filter(owner__username="heavy", status="done", finished_at__gte=lo,
                                                  finished_at__lt=hi).count()
        light_waits = [w for u in users[1:] for w in waits[u]]
        light_jobs = [j for j in jobs if j.owner.username != "heavy"]
        xs = [(HEAVY_COUNT if u == "heavy" else 1) / statistics.mean(waits[u]) if waits[u] and statistics.mean(waits[u]) > 0
              else None for u in users]
        p50, p95 = pct(light_waits, 0.5), pct(light_waits, 0.95)
        return {
            "fair_share": fair,
            "light_jobs": len(light_jobs),
            "light_jobs_not_started": sum(1 for j in light_jobs if j.queue_wait_seconds is None),
            "light_wait_p50_s": p50,
            "light_wait_p95_s": p95,
            "pass_seconds": pass_seconds,
            "light_wait_p50_passes": p50 / pass_seconds if p50 is not None and pass_seconds else None,
            "light_wait_p95_passes": p95 / pass_seconds if p95 is not None and pass_seconds else None,
            "heavy_wait_p50_s": pct(waits["heavy"], 0.5),
            "heavy_images_per_s": done_heavy * HEAVY_COUNT / a.seconds,
            "passes": len(batches),
            "fill": statistics.mean(b.size / b.cap for b in batches) if batches else None,
            "jain_index": jain(xs),
            "submit_errors": errors[:5],
        }
    finally:
        stack.close()
        connection.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=90.0, help="the measured window")
    p.add_argument("--warm-up", type=float, default=15.0)
    p.add_argument("--light-every", type=float, default=3.0, help="seconds between a light user's submits")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--step-ms", type=float, default=50.0, help="simulated GPU milliseconds per 64x64 step")
    p.add_argument("--marginal", type=float, default=0.15)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--mode", choices=["both", "fifo", "fair"], default="both")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "fairness.json"))
    a = p.parse_args()
    # Each run is its own process (Django is set up once per process, on that run's stack).
    if a.mode == "both":
        import subprocess

        results = {}
        for mode in ("fifo", "fair"):
            out = Path(a.out).with_suffix(f".{mode}.json")
            argv = [sys.executable, __file__, *sys.argv[1:], "--mode", mode, "--out", str(out)]
            subprocess.run(argv, check=True)
            results[mode] = json.loads(out.read_text())
            out.unlink()
        fifo, fair = results["fifo"], results["fair"]
        summary = {
            "command": "python bench/fairness.py " + " ".join(sys.argv[1:]),
            "settings": vars(a) | {"mode": "both", "heavy_queued_jobs": HEAVY_QUEUED, "heavy_images_per_job": HEAVY_COUNT,
                                   "light_users": 3, "cap": HEAVY_COUNT, "gpu_workers": 1},
            "fifo": fifo,
            "fair": fair,
            "goals": {
                "light_p95_within_2_passes": (fair["light_wait_p95_passes"] or 1e9) <= 2.0,
                # "fill unchanged within 2%": no lower than FIFO's by more than 2 points
                "fill_not_below_fifo_by_2pct": fifo["fill"] is not None and fair["fill"] is not None
                and fair["fill"] >= fifo["fill"] - 0.02,
            },
        }
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(summary, indent=2))
        for key in ("light_wait_p50_s", "light_wait_p95_s", "light_wait_p95_passes", "pass_seconds", "heavy_wait_p50_s",
                    "heavy_images_per_s", "fill", "jain_index", "light_jobs", "passes"):
            print(f"{key:24s} fifo {fifo[key]!s:>22}   fair {fair[key]!s:>22}")
        print("goals", summary["goals"])
        return
    result = run(a, fair=a.mode == "fair")
    Path(a.out).write_text(json.dumps(result, indent=2))
    print(a.mode, json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
