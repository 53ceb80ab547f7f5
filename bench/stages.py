"""The stage machinery under backlog: a burst of one-image jobs over 8 shapes, a classifier that
takes 2 s a batch and a webhook receiver that answers in 20 s, through real workers.

    python bench/stages.py                       # both pool layouts, 200 jobs
    python bench/stages.py --jobs 80 --layouts separate

Layouts, side by side in one run on the same code:
  shared    one worker consumes cpu, io, classify and webhooks (two processes): the embedded
            default's pools before they were split
  separate  a worker per pool, as `make run` starts them (scripts/run.py process_commands)

Reports per layout: jobs done / failed, stage re-runs and re-sends, duplicated verdicts, images
whose public bytes are gone afterwards, and the prompt check's latency during the burst (submit
to the prompt verdict, p50/p95). Figures to bench/results/stages.json.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import pct  # noqa: E402
from scripts.stack import Stack  # noqa: E402

SHAPES = [(64, 64, 4), (96, 64, 4), (64, 96, 4), (96, 96, 4), (64, 64, 6), (96, 64, 6), (64, 96, 6), (96, 96, 6)]


class SlowReceiver(http.server.BaseHTTPRequestHandler):
    delay = 20.0

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length") or 0))
        time.sleep(self.delay)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def receiver(delay: float) -> tuple[http.server.ThreadingHTTPServer, str]:
    SlowReceiver.delay = delay
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowReceiver)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/hook"


def run_layout(layout: str, jobs: int, classify_seconds: float, webhook_seconds: float, timeout: float) -> dict:
    stack = Stack(IMAGEGEN_ACCELERATOR="simulated", IMAGEGEN_IMAGE_CLASSIFIER="python:tests.fake_classifiers:Scripted",
                  IMAGEGEN_CLASSIFIER_TIMEOUT="60", IMAGEGEN_LOG_LEVEL="WARNING", IMAGEGEN_LOG_FORMAT="plain",
                  IMAGEGEN_LEASE_SECONDS="6", IMAGEGEN_REAPER_INTERVAL="1", IMAGEGEN_BATCH_CAP="8",
                  IMAGEGEN_USER_MAX_IN_FLIGHT="100000", IMAGEGEN_MAX_QUEUED_IMAGES="100000", IMAGEGEN_MAX_QUEUE_WAIT="1e9",
                  IMAGEGEN_USER_MAX_IMAGES_PER_DAY="1000000", IMAGEGEN_WEBHOOK_TIMEOUT=str(webhook_seconds + 5))
    stack.apply_to_this_process()
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection

    from imagegen import metrics
    from jobs.media.storage import public_storage
    from jobs.models import GeneratedImage, GenerationJob
    from safety.models import SafetyVerdict
    from scripts.run import process_commands
    from tests.fake_classifiers import set_mode

    server, hook = receiver(webhook_seconds)
    try:
        stack.manage("migrate", "--noinput")
        connection.close()
        set_mode(f"slow:{classify_seconds}")
        if layout == "shared":
            queues = ",".join([settings.QUEUE_CPU, settings.QUEUE_IO, settings.QUEUE_CLASSIFY, settings.QUEUE_WEBHOOKS])
            stack.start_worker("cpu", queues, beat=True)
            stack.start_worker("cpu2", queues)
        else:
            for name, cmd in process_commands(stack.env, "0", stack.var):
                if name.startswith("worker-") and name != "worker-gpu":
                    queue = cmd[cmd.index("-Q") + 1]
                    stack.start_worker(name, queue, beat=name == "worker-cpu")
        stack.start_worker("gpu", settings.QUEUE_GPU)
        stack.wait_for_gpu_workers(settings.IMAGEGEN_MODEL_NAME, 1)
        owner = get_user_model().objects.create_user("bench-stages")
        from jobs.api.serializers import JobCreateSerializer
        from jobs.pipeline.submit import submit_job

        # One job through every stage first: the workers are up and the prompt filter loaded.
        warm = JobCreateSerializer(data={"prompt": "a blue square on a red background", "width": 64, "height": 64,
                                         "steps": 12, "seed": 999999})
        warm.is_valid(raise_exception=True)
        warm_id = submit_job(owner, warm.validated_data).id
        deadline = time.monotonic() + 300
        while GenerationJob.objects.filter(id=warm_id, status__in=["queued", "running"]).exists():
            if time.monotonic() > deadline:
                raise SystemExit("the warm-up job did not finish")
            time.sleep(0.2)

        started = time.monotonic()
        ids = []
        for i in range(jobs):
            w, h, steps = SHAPES[i % len(SHAPES)]
            request = JobCreateSerializer(data={"prompt": f"a red circle on a blue background {i}", "width": w,
                                                "height": h, "steps": steps, "seed": i, "webhook_url": hook})
            request.is_valid(raise_exception=True)
            ids.append(str(submit_job(owner, request.validated_data).id))
        while time.monotonic() - started < timeout:
            if not GenerationJob.objects.filter(id__in=ids, status__in=["queued", "running"]).exists():
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        rows = GenerationJob.objects.filter(id__in=ids)
        by_status = {s: rows.filter(status=s).count() for s in ("done", "failed", "blocked", "review", "queued", "running")}
        checks = []
        for job in rows:
            verdict = SafetyVerdict.objects.filter(job=job, stage="prompt").order_by("created_at").first()
            if verdict is not None:
                checks.append((verdict.created_at - job.created_at).total_seconds())
        images = GeneratedImage.objects.filter(job_id__in=ids, tier="public")
        gone = sum(1 for im in images if not public_storage().exists(im.storage_key))
        duplicated = sum(1 for im in GeneratedImage.objects.filter(job_id__in=ids)
                         if SafetyVerdict.objects.filter(image=im, stage="image").count() > 1)
        counters = metrics.read_counters()
        return {
            "layout": layout, "jobs": jobs, "seconds": round(elapsed, 1), **by_status,
            "failed_reasons": sorted({r for r in rows.filter(status="failed").values_list("reason", flat=True)})[:5],
            "stage_reruns": sum(counters.get("imagegen_stage_reruns_total", {}).values()),
            "stage_resends": sum(counters.get("imagegen_stage_resends_total", {}).values()),
            "images_with_duplicated_verdicts": duplicated, "public_images": images.count(), "public_bytes_gone": gone,
            "prompt_check_p50_s": round(pct(checks, 0.5) or 0, 3), "prompt_check_p95_s": round(pct(checks, 0.95) or 0, 3),
        }
    finally:
        server.shutdown()
        stack.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--layouts", default="shared,separate")
    p.add_argument("--classify-seconds", type=float, default=2.0)
    p.add_argument("--webhook-seconds", type=float, default=20.0)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "stages.json"))
    a = p.parse_args()
    results = []
    for layout in a.layouts.split(","):
        # Each layout in a fresh interpreter: Django is set up once per process.
        import subprocess

        out = subprocess.run([sys.executable, __file__, "--one", layout, str(a.jobs), str(a.classify_seconds),
                              str(a.webhook_seconds), str(a.timeout)], cwd=ROOT, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(out.stderr[-3000:])
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    Path(a.out).write_text(json.dumps({"command": "python bench/stages.py " + " ".join(sys.argv[1:]),
                                       "cores": os.cpu_count(), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        layout, jobs, classify_s, webhook_s, timeout = sys.argv[2:7]
        print(json.dumps(run_layout(layout, int(jobs), float(classify_s), float(webhook_s), float(timeout))))
    else:
        main()
