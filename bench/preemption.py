"""Preemption at a step boundary (issue 48, item 2): how soon an interactive job behind a
batch-tier pass starts, and what preemption costs the batch tier, preemption off against on.

    .venv/bin/python bench/preemption.py [--step-ms 20] [--batch-steps 150] [--seconds 60]

The real stack (Celery workers, Redis, the database) with one simulated GPU worker
(IMAGEGEN_ACCELERATOR=simulated: the cost model sleeps, so the figures do not depend on this
machine's cores); jobs are submitted in this process through `submit_job` (the web tier adds
nothing to what is measured here). Each mode (IMAGEGEN_PREEMPTION=false, then true) runs in a
process of its own, on a fresh stack:

1. Start delay: a batch-tier pass of --batch-steps steps (64x64, the cap's 8 images) runs; an
   interactive 1-image job of another shape is submitted at a random point of it (--probes
   times). Its delay is its pass's start less its entry into the scheduler's bucket, in seconds
   and in steps of the batch-tier pass (its measured seconds per step), and the part of it spent
   taking and claiming the job (`claim_s`: its batch row's start to its pass's start). Goal: at
   most 1 step with preemption (without: the rest of the pass).
2. Batch-tier throughput: a backlog of batch-tier jobs (8 images, --batch-steps steps) is kept
   queued for --seconds, first alone, then with interactive 1-image jobs of --interactive-steps
   steps arriving as a Poisson stream (mean --interactive-every seconds). Throughput: the
   batch-tier images of the passes that ended in the window, over the time between the first
   and the last of those ends (whole passes, so no pass is counted in part). Goal: with
   preemption, at most 5% below the same stream without it.

Writes bench/results/preemption.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import pct  # noqa: E402
from scripts.stack import Stack  # noqa: E402

CAP = 8
BATCH_SIZE = (64, 64)
INTERACTIVE_SIZE = (96, 64)  # another shape: the interactive job cannot ride in the batch-tier pass


def run(a, preemption: bool) -> dict:
    stack = Stack(IMAGEGEN_ACCELERATOR="simulated", IMAGEGEN_SIM_STEP_MS=str(a.step_ms),
                  IMAGEGEN_SIM_BATCH_MARGINAL=str(a.marginal), IMAGEGEN_BATCH_CAP=str(CAP),
                  IMAGEGEN_PREEMPTION="true" if preemption else "false", IMAGEGEN_CACHE_ENABLED="false",
                  IMAGEGEN_IMAGE_CLASSIFIER="none", IMAGEGEN_USER_MAX_IN_FLIGHT="100000",
                  IMAGEGEN_USER_MAX_IMAGES_PER_DAY="10000000", IMAGEGEN_MAX_QUEUED_IMAGES="100000",
                  IMAGEGEN_MAX_QUEUE_WAIT="1000000", IMAGEGEN_BATCH_MAX_QUEUE_WAIT="10000000",
                  IMAGEGEN_PREVIEW_EVERY="1000", IMAGEGEN_REWRITE_DEFAULT="off", IMAGEGEN_LOG_LEVEL="WARNING", IMAGEGEN_LOG_FORMAT="plain")
    stack.apply_to_this_process()
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection

    from jobs.models import Batch, GenerationJob
    from jobs.pipeline.submit import submit_job

    rng = random.Random(a.seed)
    try:
        stack.manage("migrate", "--noinput")
        user = get_user_model().objects.create_user("bench")
        stack.start_worker("cpu", f"{settings.QUEUE_CPU},{settings.QUEUE_IO},{settings.QUEUE_CLASSIFY},{settings.QUEUE_WEBHOOKS}",
                           beat=True)
        stack.start_worker("gpu1", settings.QUEUE_GPU)
        stack.wait_for_gpu_workers(settings.IMAGEGEN_MODEL_NAME, 1)
        serial = iter(range(10**9))

        def submit(priority: str, size: tuple[int, int], steps: int, count: int) -> str:
            k = next(serial)
            data = {"prompt": f"a red circle {priority} {k}", "width": size[0], "height": size[1], "steps": steps,
                    "guidance_scale": settings.IMAGEGEN_DEFAULT_GUIDANCE, "count": count, "seed": k, "priority": priority}
            return str(submit_job(user, data).id)

        def wait(predicate, timeout: float = 300.0):
            deadline = time.monotonic() + timeout
            while not (found := predicate()):
                if time.monotonic() > deadline:
                    raise RuntimeError("timed out")
                time.sleep(0.01)
            return found

        def pass_of(job_id: str) -> Batch:
            return wait(lambda: Batch.objects.filter(jobs__id=job_id, pass_started_at__isnull=False).first())

        # Warm-up: one pass of each shape (prompt filter, storage, the cost model's first entry).
        for job_id in (submit("interactive", INTERACTIVE_SIZE, a.interactive_steps, 1), submit("batch", BATCH_SIZE, 4, CAP)):
            wait(lambda j=job_id: GenerationJob.objects.filter(id=j, status="done").exists())

        # 1. Start delay behind one batch-tier pass.
        probes = []
        for _ in range(a.probes):
            outer_job = submit("batch", BATCH_SIZE, a.batch_steps, CAP)
            outer = pass_of(outer_job)
            pass_seconds = a.batch_steps * a.step_ms / 1000 * (1 + (CAP - 1) * a.marginal)
            time.sleep(rng.uniform(0.1, 0.8) * pass_seconds)
            inner_job = submit("interactive", INTERACTIVE_SIZE, a.interactive_steps, 1)
            inner = pass_of(inner_job)
            wait(lambda j=outer_job: GenerationJob.objects.filter(id=j, status__in=("done", "failed")).exists())
            outer.refresh_from_db()
            queued = GenerationJob.objects.get(id=inner_job).scheduled_at
            step = outer.gpu_seconds / a.batch_steps
            delay = (inner.pass_started_at - queued).total_seconds()
            # Of the delay, the take and claim (and the steering read) before the pass: the rest is the
            # batch-tier step in flight when the job arrived.
            claim = (inner.pass_started_at - inner.started_at).total_seconds()
            probes.append({"delay_s": delay, "delay_steps": delay / step, "claim_s": claim, "batch_step_s": step,
                           "interleaved": inner.pass_started_at < outer.finished_at})
            wait(lambda j=inner_job: GenerationJob.objects.filter(id=j, status="done").exists())

        # 2. Batch-tier throughput, alone and with an interactive stream.
        def throughput(stream: bool) -> dict:
            stop = threading.Event()

            def backlog() -> None:
                while not stop.is_set():
                    queued = GenerationJob.objects.filter(priority="batch", status="queued").count()
                    for _ in range(3 - queued):
                        submit("batch", BATCH_SIZE, a.batch_steps, CAP)
                    stop.wait(0.2)
                connection.close()

            def arrivals(out: list[str]) -> None:
                while not stop.wait(rng.expovariate(1 / a.interactive_every)):
                    out.append(submit("interactive", INTERACTIVE_SIZE, a.interactive_steps, 1))
                connection.close()

            interactive: list[str] = []
            threads = [threading.Thread(target=backlog)] + ([threading.Thread(target=arrivals, args=(interactive,))]
                                                            if stream else [])
            started = time.time()
            for t in threads:
                t.start()
            time.sleep(a.warm_up + a.seconds)
            stop.set()
            for t in threads:
                t.join()
            from datetime import UTC, datetime

            lo = datetime.fromtimestamp(started + a.warm_up, UTC)
            hi = datetime.fromtimestamp(started + a.warm_up + a.seconds, UTC)
            ends = sorted((b.finished_at, b.size) for b in Batch.objects.filter(
                finished_at__gte=lo, finished_at__lt=hi, width=BATCH_SIZE[0], height=BATCH_SIZE[1], steps=a.batch_steps))
            span = (ends[-1][0] - ends[0][0]).total_seconds() if len(ends) > 1 else None
            images = sum(size for _, size in ends[1:])
            # The interactive passes in the same span: their GPU-seconds and images per pass (what
            # preemption changes: jobs no longer wait for the batch-tier pass together, so they
            # run in more, smaller passes).
            small = list(Batch.objects.filter(width=INTERACTIVE_SIZE[0], height=INTERACTIVE_SIZE[1],
                                              finished_at__gt=ends[0][0], finished_at__lte=ends[-1][0])) if span else []
            # Interactive jobs that arrived in the window: how long each waited for its pass.
            waits = []
            for job in GenerationJob.objects.filter(id__in=interactive, created_at__gte=lo, created_at__lt=hi):
                b = job.batch
                if b is not None and b.pass_started_at is not None and job.scheduled_at is not None:
                    waits.append((b.pass_started_at - job.scheduled_at).total_seconds())
            # Drain: cancel what is left, so the next measurement starts clean.
            from jobs.actions import cancel_job

            for job in GenerationJob.objects.filter(status__in=("queued", "running")):
                try:
                    cancel_job(job, "the benchmark's window ended")
                except Exception:
                    pass
            wait(lambda: not GenerationJob.objects.filter(status__in=("queued", "running")).exists(), 120)
            return {
                "batch_passes": len(ends) - 1,
                "batch_images_per_s": images / span if span else None,
                "interactive_passes": len(small),
                "interactive_images_per_pass": statistics.mean(b.size for b in small) if small else None,
                "interactive_gpu_share": sum(b.gpu_seconds or 0 for b in small) / span if span else None,
                "interactive_jobs": len(interactive),
                "interactive_start_delay_p50_s": pct(waits, 0.5),
                "interactive_start_delay_p95_s": pct(waits, 0.95),
            }

        return {
            "preemption": preemption,
            "start_delay": {
                "probes": probes,
                "delay_steps_p50": statistics.median(p["delay_steps"] for p in probes),
                "delay_steps_max": max(p["delay_steps"] for p in probes),
                "delay_s_p50": statistics.median(p["delay_s"] for p in probes),
                "claim_s_p50": statistics.median(p["claim_s"] for p in probes),
            },
            "alone": throughput(False),
            "with_stream": throughput(True),
        }
    finally:
        stack.close()
        connection.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--step-ms", type=float, default=20.0, help="simulated GPU milliseconds per 64x64 step")
    p.add_argument("--marginal", type=float, default=0.15, help="the simulated cost of each extra image in a pass")
    p.add_argument("--batch-steps", type=int, default=150)
    p.add_argument("--interactive-steps", type=int, default=20)
    p.add_argument("--interactive-every", type=float, default=4.0, help="mean seconds between interactive arrivals")
    p.add_argument("--probes", type=int, default=5)
    p.add_argument("--seconds", type=float, default=60.0, help="each throughput window")
    p.add_argument("--warm-up", type=float, default=8.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--mode", choices=["both", "off", "on"], default="both")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "preemption.json"))
    a = p.parse_args()
    if a.mode != "both":
        Path(a.out).write_text(json.dumps(run(a, a.mode == "on"), indent=1, default=str) + "\n")
        return
    results = {}
    for mode in ("off", "on"):  # each its own process: Django is set up once per process, on its stack
        out = Path(a.out).with_suffix(f".{mode}.json")
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--mode", mode, "--out", str(out)], check=True)
        results[mode] = json.loads(out.read_text())
        out.unlink()
    off, on = results["off"], results["on"]

    def ratio(key: str) -> float | None:
        x, y = on[key]["batch_images_per_s"], off[key]["batch_images_per_s"]
        return x / y if x and y else None

    summary = {
        "command": "python bench/preemption.py " + " ".join(sys.argv[1:]),
        "settings": vars(a) | {"mode": "both", "cap": CAP, "batch_size": BATCH_SIZE, "interactive_size": INTERACTIVE_SIZE,
                               "gpu_workers": 1},
        "off": off,
        "on": on,
        "side_by_side": {
            "start_delay_steps_p50": {"off": off["start_delay"]["delay_steps_p50"], "on": on["start_delay"]["delay_steps_p50"]},
            "start_delay_steps_max": {"off": off["start_delay"]["delay_steps_max"], "on": on["start_delay"]["delay_steps_max"]},
            "batch_images_per_s_alone": {"off": off["alone"]["batch_images_per_s"], "on": on["alone"]["batch_images_per_s"],
                                         "on_over_off": ratio("alone")},
            "batch_images_per_s_with_stream": {"off": off["with_stream"]["batch_images_per_s"],
                                               "on": on["with_stream"]["batch_images_per_s"],
                                               "on_over_off": ratio("with_stream")},
            "start_delay_claim_s_p50": {"off": off["start_delay"]["claim_s_p50"], "on": on["start_delay"]["claim_s_p50"]},
            "interactive_images_per_pass_with_stream": {"off": off["with_stream"]["interactive_images_per_pass"],
                                                        "on": on["with_stream"]["interactive_images_per_pass"]},
            "interactive_gpu_share_with_stream": {"off": off["with_stream"]["interactive_gpu_share"],
                                                  "on": on["with_stream"]["interactive_gpu_share"]},
            "interactive_start_delay_p95_s_with_stream": {"off": off["with_stream"]["interactive_start_delay_p95_s"],
                                                          "on": on["with_stream"]["interactive_start_delay_p95_s"]},
        },
    }
    summary["goals"] = {
        # The next step boundary: at most the step in flight, plus the take and claim.
        "start_at_the_next_step_boundary": all(p["delay_s"] - p["claim_s"] <= p["batch_step_s"] * 1.1
                                               for p in on["start_delay"]["probes"]),
        "start_within_1_step": on["start_delay"]["delay_steps_max"] <= 1.0,
        "batch_throughput_within_5pct": (ratio("with_stream") or 0) >= 0.95,
    }
    Path(a.out).write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(json.dumps(summary["side_by_side"] | {"goals": summary["goals"]}, indent=1))


if __name__ == "__main__":
    main()
