"""Scale-out on one machine with the simulated accelerator: the real API, scheduler, Redis and
Celery workers with 1, 2, 4 and 8 GPU workers; and the scheduler's own capacity.

    .venv/bin/python bench/scale.py [--workers 1,2,4,8] [--jobs-per-worker 40] [--step-ms 40]

Each run pre-admits the jobs (saturation), starts N simulated GPU workers, and measures images/s
over the GPU window. Writes bench/results/scale.json (section "workers" and "scheduler").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.stack import Stack  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", default="1,2,4,8")
    p.add_argument("--jobs-per-worker", type=int, default=40)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--step-ms", type=float, default=40.0)
    p.add_argument("--marginal", type=float, default=0.15)
    p.add_argument("--cap", type=int, default=8)
    a = p.parse_args()
    stack = Stack(IMAGEGEN_ACCELERATOR="simulated", IMAGEGEN_IMAGE_CLASSIFIER="none", IMAGEGEN_SIM_STEP_MS=str(a.step_ms),
                  IMAGEGEN_SIM_BATCH_MARGINAL=str(a.marginal), IMAGEGEN_BATCH_CAP=str(a.cap),
                  IMAGEGEN_USER_MAX_IN_FLIGHT="100000", IMAGEGEN_USER_MAX_IMAGES_PER_DAY="1000000",
                  IMAGEGEN_MAX_QUEUED_IMAGES="1000000", IMAGEGEN_MAX_QUEUE_WAIT="100000", IMAGEGEN_CACHE_ENABLED="false",
                  IMAGEGEN_LOG_LEVEL="WARNING")
    stack.apply_to_this_process()
    import django

    django.setup()
    from django.conf import settings
    from rest_framework.test import APIClient

    from gpu_tasks.simulated import step_seconds
    from jobs.models import Batch, GenerationJob
    from scheduling import scheduler

    result: dict = {"command": "python bench/scale.py " + " ".join(sys.argv[1:]), "steps": a.steps,
                    "step_ms": a.step_ms, "marginal": a.marginal, "cap": a.cap}
    try:
        stack.manage("migrate", "--noinput")
        token = stack.manage("issue_token", "scale").strip().splitlines()[-1]
        stack.start_worker("cpu", f"{settings.QUEUE_CPU},{settings.QUEUE_IO}", beat=True)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
        ideal_per_worker = a.cap / (a.steps * step_seconds(a.cap, 64, 64, a.step_ms, a.marginal))
        runs = {}
        for n in (int(x) for x in a.workers.split(",")):
            jobs = n * a.jobs_per_worker
            ids = []
            for i in range(jobs):
                r = client.post("/api/v1/jobs", {"prompt": f"scale {n} {i}", "steps": a.steps, "seed": i}, format="json")
                assert r.status_code == 202, r.content
                ids.append(r.json()["id"])
            while GenerationJob.objects.filter(id__in=ids, scheduled_at=None, status="queued").exists():
                time.sleep(0.1)
            names = [f"gpu{n}-{k}" for k in range(n)]
            for name in names:
                stack.start_worker(name, settings.QUEUE_GPU)
            deadline = time.monotonic() + 600
            while GenerationJob.objects.filter(id__in=ids, status__in=["queued", "running"]).exists():
                assert time.monotonic() < deadline, "the load did not finish"
                time.sleep(0.2)
            done = list(GenerationJob.objects.filter(id__in=ids))
            assert all(j.status == "done" for j in done), {j.status for j in done}
            first = min(j.started_at for j in done).timestamp()
            last = max(j.finished_at for j in done).timestamp()
            batches = list(Batch.objects.filter(id__in={j.batch_id for j in done}))
            rate = jobs / (last - first)
            runs[n] = {"jobs": jobs, "images_per_second": rate, "ideal_images_per_second": n * ideal_per_worker,
                       "efficiency": rate / (n * ideal_per_worker), "mean_fill": sum(b.fill for b in batches) / len(batches)}
            print(f"{n} workers: {rate:.1f} img/s (ideal {n * ideal_per_worker:.1f}, efficiency {runs[n]['efficiency']:.2f}), "
                  f"fill {runs[n]['mean_fill']:.2f}", flush=True)
            for name in names:
                stack.stop(name)
        result["workers"] = runs
        # The scheduler's own capacity: take() calls that each pop a full batch, on this Redis.
        model = "scale-capacity"
        shape = scheduler.shape_key("v", 64, 64, 20, 5.0, "")
        for i in range(8000):
            scheduler.enqueue(model, shape, f"c{i}", 1, 1000.0 + i)
        started = time.perf_counter()
        batches = 0
        while scheduler.take(model) is not None:
            batches += 1
        result["scheduler"] = {"batches_per_second": batches / (time.perf_counter() - started), "batch_size": settings.IMAGEGEN_BATCH_CAP}
        print(f"scheduler: {result['scheduler']['batches_per_second']:.0f} batches/s (cap {settings.IMAGEGEN_BATCH_CAP})")
    finally:
        stack.close()
    out = ROOT / "bench" / "results" / "scale.json"
    data = json.loads(out.read_text()) if out.exists() else {}
    data.update(result)
    out.write_text(json.dumps(data, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
