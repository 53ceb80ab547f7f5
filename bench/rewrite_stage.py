"""What the rewrite stage adds to a job's submit-to-done time, through real workers.

    python bench/rewrite_stage.py --jobs 20

One job at a time on an idle stack (a private Redis, SQLite, the cpu worker checking prompts
with the real prompt gate, the GPU worker on the simulated accelerator also serving the shipped
rewriter on its queue, as `make run` has it), alternating `rewrite: off` and `rewrite: on` with
the same free-form prompts (each with its own seed, so nothing is a cache hit). Reports the
submit-to-done p50/p95 of each arm and their difference: the stage's hop, the rewriter's pass
and the second prompt check. Writes bench/results/rewrite_stage.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.stack import Stack  # noqa: E402

PROMPTS = [
    "a vermilion pebble against a cerulean sky", "a ball the colour of grass on cream",
    "a golden square resting on an ink-black backdrop", "une pierre rouge sur fond bleu",
    "a little crimson triangle placed on snow white", "ein grüner Kreis auf gelbem Hintergrund",
]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20, help="jobs per arm")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)

    stack = Stack(IMAGEGEN_ACCELERATOR="simulated", IMAGEGEN_IMAGE_CLASSIFIER="python:tests.fake_classifiers:Scripted",
                  IMAGEGEN_LOG_LEVEL="WARNING", IMAGEGEN_LOG_FORMAT="plain", IMAGEGEN_FILL_WAIT="0",
                  IMAGEGEN_REWRITER_PATH=str(ROOT / "models" / "rewriter-v2"), IMAGEGEN_REWRITE_DEFAULT="off")
    stack.apply_to_this_process()
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection

    from jobs.api.serializers import JobCreateSerializer
    from jobs.models import GenerationJob
    from jobs.pipeline.submit import submit_job

    try:
        stack.manage("migrate", "--noinput")
        connection.close()
        stack.start_worker("cpu", ",".join([settings.QUEUE_CPU, settings.QUEUE_IO, settings.QUEUE_CLASSIFY,
                                            settings.QUEUE_WEBHOOKS]), beat=True)
        stack.start_worker("gpu", f"{settings.QUEUE_GPU},{settings.QUEUE_REWRITE}")
        stack.wait_for_gpu_workers(settings.IMAGEGEN_MODEL_NAME, 1)
        owner = get_user_model().objects.create_user("bench-rewrite-stage")

        def one(prompt: str, seed: int, rewrite: str) -> tuple[float, GenerationJob]:
            data = JobCreateSerializer(data={"prompt": prompt, "width": 64, "height": 64, "steps": args.steps,
                                             "seed": seed, "rewrite": rewrite})
            data.is_valid(raise_exception=True)
            started = time.monotonic()
            job_id = submit_job(owner, data.validated_data).id
            deadline = started + 120
            while True:
                job = GenerationJob.objects.get(id=job_id)
                if job.status not in ("queued", "running"):
                    return time.monotonic() - started, job
                if time.monotonic() > deadline:
                    raise SystemExit(f"job {job_id} did not finish")
                time.sleep(0.01)

        for warm in ("off", "on"):  # the prompt gate, the rewriter and the pipeline loaded
            one(PROMPTS[0], 10_000_000 + (warm == "on"), warm)
        seconds: dict[str, list[float]] = {"off": [], "on": []}
        statuses: dict[str, list[str]] = {"off": [], "on": []}
        for i in range(args.jobs):
            for arm in ("off", "on") if i % 2 == 0 else ("on", "off"):
                took, job = one(PROMPTS[i % len(PROMPTS)], 1000 * i + (arm == "on"), arm)
                seconds[arm].append(took)
                statuses[arm].append(job.status)
                print(f"{arm:3s} {took:7.3f}s {job.status} {job.drawn_prompt!r}", flush=True)
    finally:
        stack.close()
    res = {
        "command": "python bench/rewrite_stage.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "jobs_per_arm": args.jobs, "steps": args.steps, "accelerator": "simulated",
        "submit_to_done_seconds": {arm: {"p50": pct(v, 0.5), "p95": pct(v, 0.95), "mean": round(statistics.mean(v), 4)}
                                   for arm, v in seconds.items()},
        "done": {arm: sum(s == "done" for s in v) for arm, v in statuses.items()},
    }
    res["added_p50_seconds"] = round(res["submit_to_done_seconds"]["on"]["p50"] - res["submit_to_done_seconds"]["off"]["p50"], 4)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rewrite_stage.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("submit_to_done_seconds", "added_p50_seconds", "done")}))
    return res


if __name__ == "__main__":
    main()
