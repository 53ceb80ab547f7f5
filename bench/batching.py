"""Batching benchmark: the raw pipeline vs. the service, unbatched vs. batched, and batch fill.

    .venv/bin/python bench/batching.py [--jobs 32] [--cap 8] [--steps 10] [--model PATH]

1. Raw limit: the diffusers pipeline called directly in a loop at batch 1 and at the cap.
2. The service at saturation: jobs submitted through the API all at once to real Celery workers
   (cpu worker + one GPU worker) with cap 1 and with cap B; images/s over the GPU window.
3. Fill: the service's mean batch fill under a saturating load mixed over the size menu, and the
   real scheduler's fill for the same load with arbitrary sizes (drained from Redis, no GPU).
Writes bench/results/batching.json. Ratios are measured side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.stack import Stack  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--cap", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--model", default="")
    args = parser.parse_args()

    shipped = ROOT / "models" / "shapes-v1"
    env = {"IMAGEGEN_TORCH_THREADS": "1", "IMAGEGEN_IMAGE_CLASSIFIER": os.environ.get("IMAGEGEN_IMAGE_CLASSIFIER", "")}
    stack = Stack(**{k: v for k, v in env.items() if v})
    from gpu_tasks.tiny_pipeline import model_for_bench

    model_path = model_for_bench(args.model, stack.var / "models")
    if not (shipped / "model_index.json").exists() and "IMAGEGEN_IMAGE_CLASSIFIER" not in os.environ:
        stack.env["IMAGEGEN_IMAGE_CLASSIFIER"] = "none"  # no shipped classifier to load
    stack.env["IMAGEGEN_MODEL_PATH"] = str(model_path)
    stack.env["IMAGEGEN_MODEL_VERSION"] = model_path.name
    stack.apply_to_this_process()
    import django

    django.setup()
    from django.conf import settings

    from gpu_tasks.capacity import images_per_second
    from gpu_tasks.pipeline import get_model

    result: dict = {"command": "python bench/batching.py " + " ".join(sys.argv[1:]), "model": str(model_path),
                    "steps": args.steps, "cap": args.cap, "jobs": args.jobs, "size": "64x64"}
    try:
        # 1. raw pipeline, this process, one thread (as the worker)
        model = get_model()
        raw1 = images_per_second(model, 64, 64, args.steps, 1, max(8, args.jobs // 4))
        rawb = images_per_second(model, 64, 64, args.steps, args.cap, max(args.cap * 2, args.jobs // 2))
        result["raw"] = {"batch_1": raw1, f"batch_{args.cap}": rawb, "gain": rawb / raw1}
        print(f"raw pipeline:  batch 1 {raw1:.2f} img/s   batch {args.cap} {rawb:.2f} img/s   gain x{rawb / raw1:.2f}")
        del model

        stack.manage("migrate", "--noinput")
        token = stack.manage("issue_token", "bench").strip().splitlines()[-1]
        stack.start_worker("cpu", f"{settings.QUEUE_CPU},{settings.QUEUE_IO}", beat=True)

        service = {}
        for cap in (1, args.cap):
            service[cap] = run_service_load(stack, token, args.jobs, args.steps, [(64, 64)], cap)
            print(f"service cap {cap}: {service[cap]['images_per_second']:.2f} img/s  mean fill {service[cap]['mean_fill']:.2f}")
        mixed = run_service_load(stack, token, args.jobs, args.steps, settings.IMAGEGEN_SIZE_MENU[:4], args.cap)
        print(f"service cap {args.cap}, mixed menu sizes: mean fill {mixed['mean_fill']:.2f} over {mixed['batches']} batches")
        result["service"] = {f"cap_{c}": v for c, v in service.items()}
        result["service_mixed_menu"] = mixed
        s1, sb = service[1]["images_per_second"], service[args.cap]["images_per_second"]
        result["ratios"] = {
            "service_over_raw_batch_1": s1 / raw1,
            f"service_over_raw_batch_{args.cap}": sb / rawb,
            "service_gain": sb / s1,
            "service_gain_over_raw_gain": (sb / s1 - 1) / (rawb / raw1 - 1) if rawb / raw1 > 1 else None,
        }
        result["scheduler_fill"] = {
            "menu_sizes": scheduler_fill(settings.IMAGEGEN_SIZE_MENU[:4], args.cap, args.jobs * 8),
            "arbitrary_sizes": scheduler_fill([(w, h) for w in range(64, 129, 8) for h in range(64, 129, 8)], args.cap, args.jobs * 8),
        }
    finally:
        stack.close()

    out = ROOT / "bench" / "results" / "batching.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    r = result["ratios"]
    print()
    print("| measure | value |\n|---|---|")
    print(f"| raw batch 1 / batch {args.cap} (img/s) | {raw1:.2f} / {rawb:.2f} |")
    print(f"| service cap 1 / cap {args.cap} (img/s) | {s1:.2f} / {sb:.2f} |")
    print(f"| service / raw at batch 1 | {r['service_over_raw_batch_1']:.2f} |")
    print(f"| service / raw at batch {args.cap} | {r[f'service_over_raw_batch_{args.cap}']:.2f} |")
    if r["service_gain_over_raw_gain"] is not None:
        print(f"| service gain / raw gain | {r['service_gain_over_raw_gain']:.2f} |")
    print(f"| fill, mixed menu sizes (service) | {result['service_mixed_menu']['mean_fill']:.2f} |")
    print(f"| fill, menu sizes (scheduler) | {result['scheduler_fill']['menu_sizes']:.2f} |")
    print(f"| fill, arbitrary sizes (scheduler) | {result['scheduler_fill']['arbitrary_sizes']:.2f} |")
    print(f"wrote {out}")


def run_service_load(stack, token: str, jobs: int, steps: int, sizes, cap: int) -> dict:
    """Saturation: every job is submitted and through the prompt gate before the GPU worker
    starts, so the worker always finds a full queue; measured over the GPU window."""
    from django.conf import settings
    from rest_framework.test import APIClient

    from jobs.models import Batch, GenerationJob

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    rng = random.Random(1)
    ids = []
    submitted = time.time()
    for i in range(jobs):
        w, h = rng.choice(sizes)
        r = client.post("/api/v1/jobs", {"prompt": f"a red circle on a blue background {i}", "width": w, "height": h,
                                          "steps": steps, "seed": i}, format="json")
        assert r.status_code == 202, r.content
        ids.append(r.json()["id"])
    while GenerationJob.objects.filter(id__in=ids, scheduled_at=None, status="queued").exists():
        time.sleep(0.1)
    stack.start_worker(f"gpu-cap{cap}", settings.QUEUE_GPU, IMAGEGEN_BATCH_CAP=str(cap))
    deadline = time.monotonic() + 900
    while GenerationJob.objects.filter(id__in=ids, status__in=["queued", "running"]).exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the service did not finish the load")
        time.sleep(0.2)
    done = list(GenerationJob.objects.filter(id__in=ids))
    bad = [j for j in done if j.status != "done"]
    if bad:
        raise RuntimeError(f"{len(bad)} jobs did not finish done: {bad[0].status} {bad[0].reason}")
    first = min(j.started_at for j in done).timestamp()
    last = max(j.finished_at for j in done).timestamp()
    batches = list(Batch.objects.filter(id__in={j.batch_id for j in done}))
    result = {
        "images_per_second": jobs / (last - first),
        "end_to_end_images_per_second": jobs / (last - submitted),
        "batches": len(batches),
        "mean_batch_size": sum(b.size for b in batches) / len(batches),
        "mean_fill": sum(b.fill for b in batches) / len(batches),
        "gpu_seconds": sum(b.gpu_seconds or 0 for b in batches),
    }
    stack.stop(f"gpu-cap{cap}")
    return result


def scheduler_fill(sizes, cap: int, jobs: int) -> float:
    """Fill the real scheduler reaches when a saturating load of these sizes is drained."""
    from imagegen.redis_client import get_redis
    from scheduling import scheduler

    model = "bench-fill"
    rng = random.Random(2)
    now = time.time()
    for i in range(jobs):
        w, h = rng.choice(sizes)
        scheduler.enqueue(model, scheduler.shape_key("v", w, h, 20, 5.0, ""), f"job{i}", 1, now + i * 1e-3)
    fills = []
    from django.test import override_settings

    with override_settings(IMAGEGEN_BATCH_CAP=cap, IMAGEGEN_BATCH_CAPS={}):
        while (taken := scheduler.take(model, now=now)) is not None:
            fills.append(taken.images / cap)
    get_redis().delete(f"ig:shapes:{model}")
    return sum(fills) / len(fills)


if __name__ == "__main__":
    main()
