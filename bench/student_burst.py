"""The student under load (issue 48): a 5x burst of degrade-allowing jobs on the teacher, today's
degrade (fewer steps on the teacher, else a 429) against the student under load (fewer steps or
the model's distilled student on its own lane, best measured quality first, jobs/admission/degrade.py).

    .venv/bin/python bench/student_burst.py [--burst 5] [--burst-seconds 60] [--max-queue-wait 30]

The real stack (daphne, Celery workers, Redis, SQLite) with simulated GPU workers
(IMAGEGEN_ACCELERATOR=simulated: passes sleep by the cost model): --teacher-gpus on the teacher's
lane (shapes-v2), one on its student's (shapes-v2-lcm), in both runs; in today's run the student's
lane serves only the jobs that name it (here none). The models are the shipped ones' serving
profiles (no weights are loaded); today's run is the same profile without `student`.

Every request: 64x64, 20 steps, count 1, allow_degrade (--degrade-share of them), Poisson arrivals
at --burst x the teacher lane's capacity at 20 steps (computed from the simulated cost model),
after a warm-up that measures each shape's cost. Per run: requests admitted, refused, degraded
(to fewer steps / to the student), the wait (submit to a GPU taking the job) p50/p95, submit to
done p95, GPU-seconds per lane, and the kinds-right of what was delivered: each delivered image
counts the measured kinds-right share of the model and steps that drew it (the `kinds_right`
figures in models/*/serving.json, bench/model_eval.py by the geometric judge); also per request
sent (a refused request delivers nothing).

Caveat: the simulated accelerator prices a step the same on both models; on the real ones a
student step costs about half a teacher's (no classifier-free guidance pass; docs/model.md:
0.040 s per image at 4 steps against 0.343 s at 20).

--shared-gpu: one simulated GPU worker serving both lanes, as `make run` starts it on one
machine (the student then shares the teacher's GPU: its gain is its cheaper passes alone).

--mode all adds a third run, student-v1: the same, with both models' figures by the
shapes-classifier-v1 judge (by it the student at 4 steps beats the teacher at 12 and goes first);
what was delivered is still counted by the geometric figures.

Writes bench/results/student_burst.json.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.admission import Load, wait_terminal  # noqa: E402
from bench.common import pct, wait_web  # noqa: E402
from scripts.procs import free_port  # noqa: E402
from scripts.stack import Stack  # noqa: E402

TEACHER, STUDENT = "shapes-v2", "shapes-v2-lcm"
COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "white", "black"]
SHAPES = ["circle", "square", "triangle"]


RESULTS = {TEACHER: "student_quality_teacher.json", STUDENT: "student_quality_student.json"}


def profiles(root: Path, mode: str) -> dict[str, Path]:
    """The shipped models' serving profiles in folders of their own (no weights: simulated).
    today: the teacher declares no student; student-v1: both models' figures by the
    shapes-classifier-v1 judge of the same measurement instead of the geometric one (by it the
    student at 4 steps beats the teacher at 12, so the student goes first)."""
    paths = {}
    for version in (TEACHER, STUDENT):
        path = root / version
        path.mkdir(parents=True)
        profile = json.loads((ROOT / "models" / version / "serving.json").read_text())
        if version == TEACHER and mode == "today":
            profile.pop("student", None)
        if mode == "student-v1":
            rows = json.loads((ROOT / "bench" / "results" / RESULTS[version]).read_text())["rows"]
            profile["kinds_right"] = {str(r["steps"]): r["shape_kind_accuracy_v1"] for r in rows}
        (path / "serving.json").write_text(json.dumps(profile))
        paths[version] = path
    return paths


def recorded_quality() -> dict[str, dict[int, float]]:
    return {version: {int(k): float(v) for k, v in json.loads((ROOT / "models" / version / "serving.json").read_text())
                      .get("kinds_right", {}).items()} for version in (TEACHER, STUDENT)}


def quality_at(figures: dict[str, dict[int, float]], version: str, steps: int) -> float:
    measured = [s for s in figures.get(version, {}) if s <= steps]
    return figures[version][max(measured)] if measured else 0.0  # unmeasured: counted as not right


def teacher_capacity(a) -> float:
    """Images per second of the teacher's lane at 20 steps, full passes (gpu_tasks/simulated.py)."""
    pass_seconds = 20 * a.step_ms / 1000 * (1 + (a.cap - 1) * a.marginal)
    return a.teacher_gpus * a.cap / pass_seconds


def body(i: int, rng: random.Random, degrade_share: float) -> dict:
    return {"prompt": f"a {COLOURS[i % len(COLOURS)]} {SHAPES[(i // len(COLOURS)) % len(SHAPES)]} {i}",
            "width": 64, "height": 64, "steps": 20, "count": 1, "seed": rng.randrange(2**31),
            "allow_degrade": rng.random() < degrade_share}


def run(mode: str, a, figures: dict) -> dict:
    models = Path(tempfile.mkdtemp(prefix=f"student-burst-{mode}-"))
    paths = profiles(models, mode)
    stack = Stack(IMAGEGEN_ACCELERATOR="simulated", IMAGEGEN_SIM_STEP_MS=str(a.step_ms),
                  IMAGEGEN_SIM_BATCH_MARGINAL=str(a.marginal), IMAGEGEN_BATCH_CAP=str(a.cap),
                  IMAGEGEN_MODEL_PATH=str(paths[TEACHER]), IMAGEGEN_MODEL_VERSION=TEACHER,
                  IMAGEGEN_EXTRA_MODELS=f"{STUDENT}={paths[STUDENT]}", IMAGEGEN_QUALITY_MODELS="none",
                  IMAGEGEN_REWRITER_PATH="", IMAGEGEN_IMAGE_CLASSIFIER="none",
                  IMAGEGEN_USER_MAX_IN_FLIGHT="100000", IMAGEGEN_USER_MAX_IMAGES_PER_DAY="1000000",
                  IMAGEGEN_MAX_QUEUED_IMAGES="100000", IMAGEGEN_MAX_QUEUE_WAIT=str(a.max_queue_wait),
                  IMAGEGEN_LOG_LEVEL="WARNING", IMAGEGEN_LOG_FORMAT="plain")
    stack.apply_to_this_process()
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.db.models import Sum

    from jobs.models import Batch, GenerationJob
    from scheduling.lanes import gpu_queue, lane_of

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    out: dict = {"mode": mode}
    try:
        stack.manage("migrate", "--noinput")
        tokens = [stack.manage("issue_token", f"burst{k}").strip().splitlines()[-1] for k in range(8)]
        stack.start_worker("cpu", f"{settings.QUEUE_CPU},{settings.QUEUE_IO},{settings.QUEUE_CLASSIFY},{settings.QUEUE_WEBHOOKS}",
                           beat=True)
        if a.shared_gpu:  # one worker serving both lanes, as `make run` starts it on one machine
            stack.start_worker("gpu-shared", f"{settings.QUEUE_GPU},{gpu_queue(lane_of(STUDENT))}")
        else:
            for k in range(a.teacher_gpus):
                stack.start_worker(f"gpu-teacher{k}", settings.QUEUE_GPU)
            stack.start_worker("gpu-student", gpu_queue(lane_of(STUDENT)))
        stack.start_web(port)
        wait_web(base_url)
        stack.wait_for_gpu_workers(lane_of(TEACHER), 1 if a.shared_gpu else a.teacher_gpus)
        stack.wait_for_gpu_workers(lane_of(STUDENT), 1)
        load = Load(base_url, tokens)
        rng = random.Random(a.seed)
        # Warm-up: each shape the burst may draw is measured by the cost model first.
        warm = []
        for i in range(a.warm_jobs):
            for extra in ({"steps": 20}, {"steps": 12}, {"model": STUDENT, "steps": 4, "guidance_scale": 6.0}):
                warm.append(load._one(i, "warm-up", {**body(10_000 + i, rng, 0.0), **extra}))
        wait_terminal([w["body"]["id"] for w in warm if w["code"] == 202], 300)
        rate = a.burst * teacher_capacity(a)
        print(f"{mode}: burst {rate:.2f} jobs/s for {a.burst_seconds:.0f} s (teacher lane capacity "
              f"{teacher_capacity(a):.2f} images/s at 20 steps)", flush=True)
        answers = load.run("burst", rate, a.burst_seconds, lambda i, r: body(i, r, a.degrade_share), rng)
        ids = [x["body"]["id"] for x in answers if x["code"] == 202]
        wait_terminal(ids, 900)
        load.pool.shutdown()
        jobs = list(GenerationJob.objects.filter(id__in=ids))
        done = [j for j in jobs if j.status == "done"]
        waits = [(j.started_at - j.created_at).total_seconds() for j in done if j.started_at]
        totals = [(j.finished_at - j.created_at).total_seconds() for j in done if j.finished_at]
        delivered = [quality_at(figures, j.model_version, j.steps) * j.count for j in done]
        images = sum(j.count for j in done)
        lanes = {}
        for version in (TEACHER, STUDENT):
            batches = Batch.objects.filter(id__in={j.batch_id for j in jobs if j.batch_id}, lane=lane_of(version))
            lanes[version] = {"gpu_seconds": round(batches.aggregate(s=Sum("gpu_seconds"))["s"] or 0.0, 1),
                              "images": batches.aggregate(s=Sum("size"))["s"] or 0}
        drawn: dict[str, int] = {}
        for j in done:
            drawn[f"{j.model_version}@{j.steps}"] = drawn.get(f"{j.model_version}@{j.steps}", 0) + j.count
        out.update({
            "sent": len(answers),
            "sent_allow_degrade": sum(1 for x in answers if x["request"]["allow_degrade"]),
            "admitted": len(ids),
            "refused_429": sum(1 for x in answers if x["code"] == 429),
            "other_codes": sorted({str(x["code"]) for x in answers if x["code"] not in (202, 429)}),
            "degraded_to_fewer_steps": sum(1 for j in jobs if j.degraded and j.model_version == TEACHER),
            "degraded_to_student": sum(1 for j in jobs if j.degraded and j.model_version == STUDENT),
            "done": len(done),
            "drawn_by_model_at_steps": dict(sorted(drawn.items())),
            "wait_p50_s": round(pct(waits, 0.5) or 0, 2), "wait_p95_s": round(pct(waits, 0.95) or 0, 2),
            "submit_to_done_p95_s": round(pct(totals, 0.95) or 0, 2),
            "kinds_right_of_delivered": round(sum(delivered) / images, 4) if images else None,
            "kinds_right_images_per_request_sent": round(sum(delivered) / len(answers), 4) if answers else None,
            "lanes": lanes,
            "submit_latency_p95_ms": round(1000 * (pct([x["latency"] for x in answers], 0.95) or 0), 1),
        })
    finally:
        connection.close()
        stack.close()
        shutil.rmtree(models, ignore_errors=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["today", "student", "student-v1", "both", "all"], default="both",
                   help="both: today and student; all: and student-v1")
    p.add_argument("--teacher-gpus", type=int, default=1)
    p.add_argument("--shared-gpu", action="store_true", help="one GPU worker serving both lanes (make run's way)")
    p.add_argument("--step-ms", type=float, default=100.0, help="simulated GPU milliseconds per 64x64 step")
    p.add_argument("--marginal", type=float, default=0.15)
    p.add_argument("--cap", type=int, default=4)
    p.add_argument("--burst", type=float, default=5.0, help="arrivals as a multiple of the teacher lane's capacity")
    p.add_argument("--burst-seconds", type=float, default=60.0)
    p.add_argument("--max-queue-wait", type=float, default=30.0)
    p.add_argument("--degrade-share", type=float, default=1.0, help="share of requests that send allow_degrade")
    p.add_argument("--warm-jobs", type=int, default=6)
    p.add_argument("--seed", type=int, default=48)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "student_burst.json"))
    a = p.parse_args()
    figures = recorded_quality()
    result: dict = {"command": "python bench/student_burst.py " + " ".join(sys.argv[1:]), "settings": vars(a),
                    "kinds_right_recorded": {v: {str(k): q for k, q in f.items()} for v, f in figures.items()},
                    "runs": {}}
    modes = {"both": ["today", "student"], "all": ["today", "student", "student-v1"]}.get(a.mode, [a.mode])
    for mode in modes:
        # One process runs one Django setup: each run in a child of its own.
        if len(modes) > 1:
            import subprocess

            child = Path(tempfile.mkdtemp()) / "run.json"
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--mode", mode, "--out", str(child)], check=True)
            result["runs"][mode] = json.loads(child.read_text())["runs"][mode]
        else:
            result["runs"][mode] = run(mode, a, figures)
        print(json.dumps(result["runs"][mode]), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
