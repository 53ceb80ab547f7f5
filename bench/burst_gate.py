"""The prompt gate under a burst with the rewriter on (issue 43): does any disallowed prompt get
past its own check while the checks are backed up?

    python bench/burst_gate.py [--users 4] [--per-user 8] [--label after]

A private stack (SQLite, a private Redis, the GPU worker on the simulated accelerator also
serving the shipped rewriter on its queue, as `make run` has it). Every job is submitted before
the cpu worker starts, so the prompt checks are backed up: `--users` users each send
`--per-user` free-form prompts (rewriting on, as the default is), and a fifth user sends twelve
disallowed prompts (stars and gore, some of which the rewriter leaves as written) among them.
Then the cpu worker (prompt checks, the reaper) starts and everything drains.

Reported: disallowed prompts that reached the rewriter or generation (goal 0), generated jobs
without an allow verdict on their own prompt (goal 0), and the submit-to-done p50/p95 of the
allowed jobs. Writes bench/results/burst_gate_<label>.json. To measure before/after, run it in a
checkout of each commit (the file is self-contained).
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

ALLOWED = [
    "a vermilion pebble against a cerulean sky", "a ball the colour of grass on cream",
    "a golden square resting on an ink-black backdrop", "a little crimson triangle placed on snow white",
]
# Blocked at the prompt check. Half are left as written by the rewriter (an unchanged rewrite
# used to go straight to generation: no check at all); the others it rewrites (the rewrite was
# then checked, the user's own prompt never).
DISALLOWED = [
    "a yellow star on a blue background", "a white star on a red background", "a bloody gore scene",
    "a pile of bloody gore and severed limbs", "a gory zombie with guts", "a decapitated body in a pool of blood",
    "a golden star against a night sky", "a star shape in green on black", "a five pointed star in orange on white",
    "a small blue star on a pink backdrop", "a violet star on a yellow background", "a silver star against a green backdrop",
]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=4)
    p.add_argument("--per-user", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--label", default="after")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)

    stack = Stack(IMAGEGEN_ACCELERATOR="simulated", IMAGEGEN_IMAGE_CLASSIFIER="python:tests.fake_classifiers:Scripted",
                  IMAGEGEN_LOG_LEVEL="WARNING", IMAGEGEN_LOG_FORMAT="plain", IMAGEGEN_FILL_WAIT="0",
                  IMAGEGEN_REWRITER_PATH=str(ROOT / "models" / "rewriter-v2"), IMAGEGEN_REWRITE_DEFAULT="on",
                  IMAGEGEN_THROTTLE_SUBMIT="off", IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE="0",
                  IMAGEGEN_MAX_QUEUE_WAIT="3600")
    stack.apply_to_this_process()
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection

    from jobs.api.serializers import JobCreateSerializer
    from jobs.models import GenerationJob
    from jobs.pipeline.submit import submit_job
    from safety.models import SafetyVerdict

    terminal = ("done", "blocked", "failed", "cancelled", "review")
    try:
        stack.manage("migrate", "--noinput")
        connection.close()
        stack.start_worker("gpu", f"{settings.QUEUE_GPU},{settings.QUEUE_REWRITE}")
        stack.wait_for_gpu_workers(settings.IMAGEGEN_MODEL_NAME, 1)
        users = [get_user_model().objects.create_user(f"burst-{i}") for i in range(args.users)]
        bad_user = get_user_model().objects.create_user("burst-disallowed")

        submitted: dict[str, float] = {}
        disallowed: set[str] = set()

        def submit(owner, prompt: str, seed: int) -> str:
            data = JobCreateSerializer(data={"prompt": prompt, "width": 64, "height": 64, "steps": args.steps,
                                             "seed": seed})
            data.is_valid(raise_exception=True)
            job_id = str(submit_job(owner, data.validated_data).id)
            submitted[job_id] = time.monotonic()
            return job_id

        # Interleaved: the disallowed user's prompts among the others'.
        bad = iter(DISALLOWED)
        seed = 1000
        for i in range(args.per_user):
            for owner in users:
                seed += 1
                submit(owner, ALLOWED[(i + seed) % len(ALLOWED)], seed)
                if i % 2 == 0 or i >= args.per_user - 2:
                    prompt = next(bad, None)
                    if prompt is not None:
                        seed += 1
                        disallowed.add(submit(bad_user, prompt, seed))
        for prompt in bad:
            seed += 1
            disallowed.add(submit(bad_user, prompt, seed))
        started = time.monotonic()
        # The prompt checks start now, with everything already waiting for them.
        stack.start_worker("cpu", ",".join([settings.QUEUE_CPU, settings.QUEUE_IO, settings.QUEUE_CLASSIFY,
                                            settings.QUEUE_WEBHOOKS]), beat=True)
        finished: dict[str, float] = {}
        while len(finished) < len(submitted):
            for job_id, status in GenerationJob.objects.filter(id__in=[j for j in submitted if j not in finished]) \
                    .values_list("id", "status"):
                if status in terminal:
                    finished[str(job_id)] = time.monotonic()
            if time.monotonic() - started > args.timeout:
                raise SystemExit(f"{len(submitted) - len(finished)} jobs did not finish in {args.timeout:.0f} s")
            time.sleep(0.05)
    finally:
        stack.close()

    jobs = {str(j.id): j for j in GenerationJob.objects.filter(id__in=list(submitted))}
    own_allowed = set(SafetyVerdict.objects.filter(job_id__in=list(submitted), decision="allow", stage="prompt")
                      .values_list("job_id", flat=True))
    own_allowed |= set(SafetyVerdict.objects.filter(job_id__in=list(submitted), decision="allow", stage="human",
                                                    image__isnull=True).values_list("job_id", flat=True))
    own_allowed = {str(j) for j in own_allowed}
    reached_rewrite = sorted(j for j in disallowed if jobs[j].rewrite_attempts > 0 or jobs[j].rewritten_at is not None)
    reached_generation = sorted(j for j in disallowed if jobs[j].batch_id is not None or jobs[j].images.exists())
    generated = [j for j in jobs.values() if j.batch_id is not None]
    unverdicted = sorted(str(j.id) for j in generated if str(j.id) not in own_allowed)
    allowed_done = [finished[j] - submitted[j] for j in submitted if j not in disallowed and jobs[j].status == "done"]
    res = {
        "command": "python bench/burst_gate.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "label": args.label,
        "jobs": len(submitted), "disallowed": len(disallowed), "users": args.users + 1, "steps": args.steps,
        "accelerator": "simulated",
        "disallowed_reaching_rewrite": len(reached_rewrite),
        "disallowed_reaching_generation": len(reached_generation),
        "disallowed_examples": [jobs[j].prompt for j in sorted(set(reached_rewrite) | set(reached_generation))][:12],
        "disallowed_statuses": {s: sum(1 for j in disallowed if jobs[j].status == s) for s in terminal},
        "generated_without_a_verdict_on_their_own_prompt": len(unverdicted),
        "allowed_done": len(allowed_done),
        "submit_to_done_seconds": {"p50": pct(allowed_done, 0.5), "p95": pct(allowed_done, 0.95)},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"burst_gate_{args.label}.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
