"""The student under load (issue 48): a job that allows degrading, past its model's wait limit,
runs on the model's distilled student (its own lane, its own wait) instead of fewer steps on the
teacher when the student's measured kinds-right at its steps beats the teacher's at the degraded
steps (`kinds_right` in each model's serving.json); the job records the model that drew it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from jobs.admission import degrade
from jobs.admission.degrade import Rung
from scheduling import catalogue

ROOT = Path(__file__).resolve().parents[1]
TEACHER, STUDENT = "tiny-teacher", "tiny-student"


def rung(version: str, steps: int, quality: float | None, student: bool = False) -> Rung:
    return Rung(version, steps, 5.0, "", quality, f"{version}|{steps}", student=student)


# The decision, alone ------------------------------------------------------------------------------

def test_the_student_goes_first_only_when_its_measured_quality_beats_fewer_steps():
    fewer, student = rung("t", 8, 0.83), rung("s", 4, 0.955, student=True)
    assert degrade.ranked(fewer, student) == [student, fewer]
    better_fewer = rung("t", 12, 0.99)
    assert degrade.ranked(better_fewer, student) == [better_fewer, student]
    assert degrade.ranked(rung("t", 8, 0.955), student)[0].student is False, "a tie keeps the model asked for"
    assert degrade.ranked(rung("t", 8, None), student)[0].student is False, "fewer steps unmeasured: not beaten"
    assert degrade.ranked(fewer, None) == [fewer]
    assert degrade.ranked(None, student) == [student]  # asked for no more steps than the degraded ones
    assert degrade.ranked(None, None) == []


def test_the_first_rung_whose_own_wait_admits_takes_the_job():
    student, fewer = rung("s", 4, 0.96, student=True), rung("t", 8, 0.83)
    waits = {student: 10.0, fewer: 5.0}
    asked: list[Rung] = []

    def eta_of(r: Rung) -> float | None:
        asked.append(r)
        return waits[r]

    assert degrade.choose([student, fewer], eta_of, limit=30) == student
    assert asked == [student], "a lower rung's wait is not asked for when a higher one admits"
    waits[student] = 100.0  # the student's lane is saturated too: fewer steps, better than a 429
    assert degrade.choose([student, fewer], eta_of, limit=30) == fewer
    waits[student] = None  # no live worker on the student's lane: no honest wait, not taken
    assert degrade.choose([student, fewer], eta_of, limit=30) == fewer
    waits[fewer] = 31.0
    assert degrade.choose([student, fewer], eta_of, limit=30) is None


@pytest.fixture
def two_models(settings, tmp_path):
    """A teacher declaring its student, both with measured figures (no weights: the catalogue
    reads serving.json alone)."""
    teacher, student = tmp_path / TEACHER, tmp_path / STUDENT
    teacher.mkdir()
    student.mkdir()
    (teacher / "serving.json").write_text(json.dumps({
        "default_steps": 6, "max_steps": 8, "degrade_steps": 3, "student": STUDENT,
        "kinds_right": {"6": 0.99, "3": 0.8}}))
    (student / "serving.json").write_text(json.dumps({
        "default_steps": 2, "max_steps": 4, "guidance_scale": 1.5, "negative_prompt": False, "kinds_right": {"2": 0.95}}))
    settings.IMAGEGEN_EXTRA_MODELS = {TEACHER: str(teacher), STUDENT: str(student)}
    yield teacher, student
    catalogue._catalogue.cache_clear()


def test_the_ways_down_read_each_models_recorded_figures(two_models):
    teacher_path, student_path = two_models
    teacher = catalogue.get(TEACHER)
    assert teacher.kinds_right == ((3, 0.8), (6, 0.99))
    assert (teacher.kinds_right_at(3), teacher.kinds_right_at(5), teacher.kinds_right_at(8), teacher.kinds_right_at(2)) \
        == (0.8, 0.8, 0.99, None), "the figure of the most steps measured at or below"
    student, fewer = degrade.rungs(TEACHER, 64, 64, 6, 5.0, "cfg", "", 3)
    assert (student.model_version, student.steps, student.guidance_scale, student.variant, student.kinds_right) \
        == (STUDENT, 2, 1.5, "", 0.95)
    assert (fewer.model_version, fewer.steps, fewer.guidance_scale, fewer.variant, fewer.kinds_right) \
        == (TEACHER, 3, 5.0, "cfg", 0.8)
    assert student.shape != fewer.shape and STUDENT in student.shape
    # The student takes no negative prompt: fewer steps alone.
    assert degrade.rungs(TEACHER, 64, 64, 6, 5.0, "cfg", "blurry", 3) == [fewer]
    # A student without a recorded figure is never sent a teacher's job.
    (student_path / "serving.json").write_text(json.dumps({"default_steps": 2, "max_steps": 4}))
    catalogue._catalogue.cache_clear()
    assert [r.student for r in degrade.rungs(TEACHER, 64, 64, 6, 5.0, "", "", 3)] == [False]


def test_the_shipped_teacher_and_student_record_their_measured_kinds_right(settings):
    settings.IMAGEGEN_EXTRA_MODELS = {"shapes-v2": str(ROOT / "models" / "shapes-v2"),
                                      "shapes-v2-lcm": str(ROOT / "models" / "shapes-v2-lcm")}
    try:
        v2, lcm = catalogue.get("shapes-v2"), catalogue.get("shapes-v2-lcm")
        assert v2.kinds_right_at(v2.degrade_steps) is not None and v2.kinds_right_at(8) is not None
        assert lcm.kinds_right_at(lcm.default_steps) is not None
        for name in ("shapes-v2", "shapes-v2-lcm"):
            assert "bench/model_eval.py" in json.loads((ROOT / "models" / name / "serving.json").read_text())["kinds_right_by"]
        [first, second] = degrade.rungs("shapes-v2", 64, 64, 20, 5.0, "", "", v2.degrade_steps)
        # As measured after shapes-v2's bucketed fine-tune: at 12 steps the teacher draws fewer kinds
        # right (95.5%) than the student at 4 (97.25%), so the student goes first and 12 steps on the
        # teacher take what the student's lane would refuse; at 8 the student beats it too.
        assert (first.student, second.student) == (True, False)
        assert degrade.rungs("shapes-v2", 64, 64, 20, 5.0, "", "", 8)[0].student
    finally:
        catalogue._catalogue.cache_clear()


# Through the submit, with the estimates of both lanes -----------------------------------------------

def forget_estimates(redis_client) -> None:
    """Drop both lanes' wait-estimate summaries (jobs/admission/summary.py), so the next submit
    computes its estimate from the costs just set rather than answering from an entry made before."""
    from jobs.admission.summary import _key
    from scheduling.lanes import lane_of

    redis_client.delete(*(_key(lane_of(version)) for version in (TEACHER, STUDENT)))


@pytest.fixture
def saturated(settings, redis_client):
    """Live-worker heartbeats on both lanes and measured costs that put the teacher's full steps
    far past the wait limit (deterministic: no race with real work)."""
    from scheduling import scheduler
    from scheduling.costs import COST_KEY
    from scheduling.heartbeats import workers_key
    from scheduling.lanes import lane_of

    settings.IMAGEGEN_MAX_QUEUE_WAIT = 600
    lanes = [lane_of(TEACHER), lane_of(STUDENT)]
    redis_client.delete(*(workers_key(lane) for lane in lanes))  # a stopped worker's heartbeat outlives it a while
    for lane in lanes:
        redis_client.zadd(workers_key(lane), {f"gpu-{lane}": time.time() + 600})
    costs = {scheduler.shape_key(TEACHER, 64, 64, 6, 5.0, ""): 10_000.0, scheduler.shape_key(TEACHER, 64, 64, 3, 5.0, ""): 0.05,
             scheduler.shape_key(STUDENT, 64, 64, 2, 1.5, ""): 0.05}
    redis_client.delete(COST_KEY)
    redis_client.hset(COST_KEY, mapping=costs)
    forget_estimates(redis_client)
    yield costs
    redis_client.delete(COST_KEY, *(workers_key(lane) for lane in lanes))
    forget_estimates(redis_client)


def test_a_submit_past_the_limit_takes_the_best_measured_rung_that_admits(two_models, saturated, alice_api, stay_queued,
                                                                          redis_client):
    from scheduling import scheduler
    from scheduling.costs import COST_KEY

    body = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 6, "model": TEACHER, "allow_degrade": True}
    job = alice_api.post("/api/v1/jobs", {**body, "seed": 1}, format="json").json()
    assert (job["model"], job["steps"], job["guidance_scale"], job["degraded"], job["requested_steps"]) \
        == (STUDENT, 2, 1.5, True, 6), json.dumps(job)
    refused = alice_api.post("/api/v1/jobs", {**body, "seed": 2, "allow_degrade": False}, format="json")
    assert refused.status_code == 429 and refused.json()["limit"] == "max_queue_wait"
    # The student's lane saturated too: fewer steps on the teacher, as before.
    redis_client.hset(COST_KEY, scheduler.shape_key(STUDENT, 64, 64, 2, 1.5, ""), 10_000.0)
    forget_estimates(redis_client)
    job = alice_api.post("/api/v1/jobs", {**body, "seed": 3}, format="json").json()
    assert (job.get("model"), job.get("steps"), job.get("degraded")) == (TEACHER, 3, True), json.dumps(job)
    # Both saturated: a 429.
    redis_client.hset(COST_KEY, scheduler.shape_key(TEACHER, 64, 64, 3, 5.0, ""), 10_000.0)
    forget_estimates(redis_client)
    assert alice_api.post("/api/v1/jobs", {**body, "seed": 4}, format="json").status_code == 429


def test_a_student_that_does_not_beat_fewer_steps_takes_only_what_fewer_steps_would_refuse(
        two_models, saturated, alice_api, stay_queued, redis_client):
    from scheduling import scheduler
    from scheduling.costs import COST_KEY

    teacher_path, _ = two_models
    profile = json.loads((teacher_path / "serving.json").read_text())
    (teacher_path / "serving.json").write_text(json.dumps({**profile, "kinds_right": {"6": 0.99, "3": 0.97}}))
    catalogue._catalogue.cache_clear()
    body = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 6, "model": TEACHER, "allow_degrade": True}
    job = alice_api.post("/api/v1/jobs", {**body, "seed": 1}, format="json").json()
    assert (job.get("model"), job.get("steps"), job.get("degraded")) == (TEACHER, 3, True), json.dumps(job)
    redis_client.hset(COST_KEY, scheduler.shape_key(TEACHER, 64, 64, 3, 5.0, ""), 10_000.0)
    forget_estimates(redis_client)
    job = alice_api.post("/api/v1/jobs", {**body, "seed": 2}, format="json").json()
    assert (job.get("model"), job.get("steps"), job.get("degraded")) == (STUDENT, 2, True), json.dumps(job)


# Through real workers -------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_degrade_allowing_job_under_a_saturated_teacher_is_drawn_by_the_student_and_records_it(
        workers, start_worker, alice_api, settings, redis_client, tmp_path):
    from gpu_tasks.tiny_pipeline import write_tiny_pipeline
    from scheduling import scheduler
    from scheduling.costs import COST_KEY
    from scheduling.heartbeats import live_workers
    from scheduling.lanes import gpu_queue, lane_of
    from tests.conftest import wait_for_status, wait_until

    models = Path(settings.VAR_DIR) / "models"
    paths = {}
    for version, seed, profile in (
            (TEACHER, 3, {"default_steps": 6, "max_steps": 8, "degrade_steps": 3, "student": STUDENT,
                          "kinds_right": {"6": 0.99, "3": 0.8}}),
            (STUDENT, 4, {"default_steps": 2, "max_steps": 4, "guidance_scale": 1.5, "negative_prompt": False,
                          "kinds_right": {"2": 0.95}})):
        paths[version] = path = models / version
        if not (path / "model_index.json").exists():
            write_tiny_pipeline(path, seed=seed)
        (path / "serving.json").write_text(json.dumps(profile))
    settings.IMAGEGEN_EXTRA_MODELS = {v: str(p) for v, p in paths.items()}
    catalogue._catalogue.cache_clear()
    teacher_lane, student_lane = lane_of(TEACHER), lane_of(STUDENT)
    worker = start_worker("gpu-teacher-student", f"{gpu_queue(teacher_lane)},{gpu_queue(student_lane)}",
                          IMAGEGEN_EXTRA_MODELS=",".join(f"{v}={p}" for v, p in paths.items()))
    settings.IMAGEGEN_MAX_QUEUE_WAIT = 600
    # The teacher's lane saturated by its measured cost (a 10,000 s pass), deterministically.
    redis_client.delete(COST_KEY)
    redis_client.hset(COST_KEY, mapping={scheduler.shape_key(TEACHER, 64, 64, 6, 5.0, ""): 10_000.0,
                                         scheduler.shape_key(TEACHER, 64, 64, 3, 5.0, ""): 0.05})
    forget_estimates(redis_client)
    try:
        wait_until(lambda: live_workers(teacher_lane) and live_workers(student_lane), what="both lanes' worker alive")
        body = {"prompt": "a red circle", "width": 64, "height": 64, "seed": 5, "steps": 6, "model": TEACHER,
                "allow_degrade": True}
        answer = alice_api.post("/api/v1/jobs", body, format="json")
        assert answer.status_code == 202, answer.content
        job = answer.json()
        assert (job["model"], job["steps"], job["degraded"], job["requested_steps"]) == (STUDENT, 2, True, 6), job
        done = wait_for_status(job["id"], ("done",))
        assert done.model_version == STUDENT and done.batch.lane == student_lane and done.batch.steps == 2
        polled = alice_api.get(f"/api/v1/jobs/{job['id']}").json()
        assert (polled["model"], polled["steps"], polled["degraded"], polled["requested_steps"]) == (STUDENT, 2, True, 6)
        assert len(polled["images"]) == 1
    finally:
        redis_client.delete(COST_KEY)
        forget_estimates(redis_client)
        worker.stop()
        catalogue._catalogue.cache_clear()


def test_a_lanes_estimate_counts_only_its_own_lanes_work(two_models, saturated, alice):
    """The student's lane is its own: a teacher's job awaiting its prompt check, or a teacher's pass
    running, is not ahead of a new job on the student's lane (it was: under a teacher burst the
    student's estimate counted the whole burst's prompt checks)."""
    from django.utils import timezone

    from jobs.admission.replay import estimate
    from jobs.models import Batch, GenerationJob
    from scheduling import scheduler
    from scheduling.lanes import lane_of
    from tests.test_security import make_job

    student_shape = scheduler.shape_key(STUDENT, 64, 64, 2, 1.5, "")
    alone = estimate(student_shape, 1)
    checking = make_job(alice, status="queued")  # awaiting its prompt check
    batch = Batch.objects.create(model_version=TEACHER, width=64, height=64, steps=6, guidance_scale=5.0, size=1, cap=4,
                                 worker="gpu-teacher", lane=lane_of(TEACHER), pass_started_at=timezone.now())
    running = make_job(alice, status="running", batch=batch)
    GenerationJob.objects.filter(pk__in=[checking.pk, running.pk]).update(model_version=TEACHER, steps=6)
    beside = estimate(student_shape, 1)
    assert (beside.position, beside.work_ahead_seconds) == (alone.position, alone.work_ahead_seconds) == (0, 0)
    assert beside.eta_seconds == pytest.approx(alone.eta_seconds, abs=1.0)
    teacher = estimate(scheduler.shape_key(TEACHER, 64, 64, 3, 5.0, ""), 1)
    assert teacher.position == 1 and teacher.eta_seconds > 10_000, "on the teacher's own lane both count"


def test_a_pass_of_another_lane_on_a_worker_the_lanes_share_is_ahead_of_a_new_job(two_models, saturated, alice):
    """One GPU worker serving both lanes (`make run` on one machine): the teacher's pass it is
    running is ahead of a new job on the student's lane (that GPU is busy until it ends)."""
    from django.utils import timezone

    from jobs.admission.replay import estimate
    from jobs.models import Batch, GenerationJob
    from scheduling import scheduler
    from scheduling.lanes import lane_of
    from tests.test_security import make_job

    shared = f"gpu-{lane_of(STUDENT)}"  # the student lane's live worker (the `saturated` heartbeat)
    batch = Batch.objects.create(model_version=TEACHER, width=64, height=64, steps=6, guidance_scale=5.0, size=1, cap=4,
                                 worker=shared, lane=lane_of(TEACHER), pass_started_at=timezone.now())
    running = make_job(alice, status="running", batch=batch)
    GenerationJob.objects.filter(pk=running.pk).update(model_version=TEACHER, steps=6)
    behind = estimate(scheduler.shape_key(STUDENT, 64, 64, 2, 1.5, ""), 1)
    assert behind.eta_seconds > 9_000, behind


def test_work_queued_on_a_lane_that_shares_the_worker_is_ahead_of_a_new_job(two_models, saturated, redis_client, db):
    """The same worker serving both lanes takes the teacher's queued passes too: they are ahead of a
    new job on the student's lane (its estimate missed them: a 5x burst through one shared GPU
    waited up to 83 s against a 45 s bound, bench/results/student_burst_shared_gpu.json)."""
    from jobs.admission.replay import estimate
    from scheduling import scheduler
    from scheduling.heartbeats import workers_key
    from scheduling.lanes import lane_of

    teacher_shape = scheduler.shape_key(TEACHER, 64, 64, 6, 5.0, "")
    student_shape = scheduler.shape_key(STUDENT, 64, 64, 2, 1.5, "")
    scheduler.enqueue(lane_of(TEACHER), teacher_shape, "teacher-job", 1, owner="bob")
    try:
        apart = estimate(student_shape, 1)
        assert (apart.position, apart.queued_images) == (0, 0) and apart.eta_seconds < 100, apart
        redis_client.zadd(workers_key(lane_of(TEACHER)), {f"gpu-{lane_of(STUDENT)}": time.time() + 600})  # now shared
        shared = estimate(student_shape, 1)
        assert shared.position == 1 and shared.eta_seconds > 9_000, shared
        assert shared.queued_images == 0, "the student's own queue is still empty (the queue-full check's figure)"
    finally:
        scheduler.remove(teacher_shape, "teacher-job", 1, owner="bob")
