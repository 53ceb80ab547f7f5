"""Cross-user same-shape batching: pull-based batches, fill wait, leases and the reaper."""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np
import pytest
from django.conf import settings
from django.db import transaction

from imagegen.redis_client import PREFIX
from jobs.models import Batch, GeneratedImage, GenerationJob, at
from tests.conftest import client_for, forget_cache, make_user, wait_for_status, wait_until_cached
from tests.test_generation import pixels, submit

pytestmark = pytest.mark.django_db(transaction=True)


def wait_all(ids, statuses=("done",), timeout=120.0):
    return [wait_for_status(i, statuses, timeout=timeout) for i in ids]


@contextmanager
def gpu_held(api):
    """The GPU worker busy with another shape's job of the most steps a job may ask, cancelled
    when the block ends: what the test queues meanwhile waits behind it however slow the machine
    is (a blocker of fixed length could end first on a loaded one, and the jobs meant to queue
    behind it would then run as they arrive)."""
    job = submit(api, width=96, height=96, steps=settings.IMAGEGEN_MAX_STEPS, count=4, prompt="a busy blocker")
    try:
        deadline = time.monotonic() + 120
        while GenerationJob.objects.get(id=job["id"]).status != "running":
            assert time.monotonic() < deadline, "the blocker never started"
            time.sleep(0.05)
        yield job
    finally:
        api.post(f"/api/v1/jobs/{job['id']}/cancel")


def wait_scheduled(ids, blocker, timeout=60.0) -> None:
    """Every one of these jobs is queued in the scheduler (its prompt check done), all of them
    behind the blocker, which still runs."""
    deadline = time.monotonic() + timeout
    while GenerationJob.objects.filter(id__in=ids, scheduled_at=None).exists():
        assert time.monotonic() < deadline, "the jobs were never queued in the scheduler"
        time.sleep(0.05)
    assert GenerationJob.objects.get(id=blocker["id"]).status == "running", "the blocker ended before the jobs queued"


def test_six_same_shape_jobs_with_cap_four_run_as_two_full_passes_across_users(workers, alice_api, bob_api):
    assert settings.IMAGEGEN_BATCH_CAP == 4
    apis = [alice_api, bob_api] * 3
    with gpu_held(alice_api) as blocker:
        ids = [submit(api, seed=100 + i, steps=3)["id"] for i, api in enumerate(apis)]
        wait_scheduled(ids, blocker)
    jobs = wait_all(ids)
    batches = {job.batch_id for job in jobs}
    assert len(batches) == 2, "six jobs should take two passes, not six"
    sizes = sorted(Batch.objects.get(id=b).size for b in batches)
    assert sizes == [2, 4]
    full = Batch.objects.get(id=next(b for b in batches if Batch.objects.get(id=b).size == 4))
    owners = {job.owner_id for job in jobs if job.batch_id == full.id}
    assert len(owners) == 2, "the full batch mixes alice's and bob's jobs"
    assert full.fill == 1.0 and full.gpu_seconds > 0
    body = alice_api.get(f"/api/v1/jobs/{ids[0]}").json()
    assert body["batch"]["size"] in (2, 4)
    assert body["queue_wait_seconds"] is not None and body["queue_wait_seconds"] >= 0


def test_mixed_shapes_never_share_a_batch(workers, alice_api):
    shapes = [(64, 64, 3), (96, 64, 3), (64, 64, 4), (64, 96, 3)] * 2
    with gpu_held(alice_api) as blocker:
        ids = [submit(alice_api, width=w, height=h, steps=s, seed=i)["id"] for i, (w, h, s) in enumerate(shapes)]
        wait_scheduled(ids, blocker)
    jobs = wait_all(ids)
    by_batch: dict = {}
    for job in jobs:
        by_batch.setdefault(job.batch_id, set()).add((job.width, job.height, job.steps))
    assert all(len(s) == 1 for s in by_batch.values()), by_batch
    # Same shapes did meet: 8 jobs of 4 shapes took fewer than 8 passes.
    assert len(by_batch) < len(jobs)


def test_a_lone_job_starts_within_the_fill_wait_plus_slack(workers, alice_api):
    deadline = time.monotonic() + 60  # earlier tests' work drained: this job is alone
    while GenerationJob.objects.filter(status="running").exists():
        assert time.monotonic() < deadline, "earlier work never drained"
        time.sleep(0.05)
    job = wait_for_status(submit(alice_api, steps=2)["id"], ("done",))
    # It ran without waiting for a full batch: its pass started once the worker's fill window
    # (FILL_WAIT from the take) closed. Measured inside the worker, not end to end, so a loaded
    # machine's prompt-check and broker latency do not decide the test.
    batch = job.batch
    assert batch.size == 1 < batch.cap
    assert (batch.pass_started_at - batch.started_at).total_seconds() <= settings.IMAGEGEN_FILL_WAIT + 1.5


def test_an_image_in_a_batch_equals_the_same_request_made_alone(workers, alice_api, bob_api):
    with gpu_held(alice_api) as blocker:
        together = [submit(api, seed=900 + i, steps=4, prompt=p) for i, (api, p) in enumerate(
            [(alice_api, "a red circle"), (bob_api, "a blue square on a green background"), (alice_api, "two yellow triangles")]
        )]
        wait_scheduled([j["id"] for j in together], blocker)
    wait_all([j["id"] for j in together])
    assert len({GenerationJob.objects.get(id=j["id"]).batch_id for j in together}) == 1
    for j in together:  # remembered just after done: forget only once they are in the cache
        wait_until_cached(GenerationJob.objects.get(id=j["id"]))
    forget_cache()
    alone = submit(bob_api, seed=901, steps=4, prompt="a blue square on a green background")
    job = wait_for_status(alone["id"], ("done",))
    assert job.batch.size == 1
    diff = np.abs(pixels(together[1]["id"])[0].astype(int) - pixels(alone["id"])[0].astype(int)).max()
    assert diff <= 3, f"batched and lone pixels differ by {diff} levels"


def test_sigkill_of_a_gpu_worker_mid_batch_loses_no_job_and_duplicates_nothing(workers, reaper, start_worker, alice_api):
    second = start_worker("gpu-victim", settings.QUEUE_GPU)
    victim_id = f"{second.proc.pid}"
    ids = [submit(alice_api, seed=i, steps=30, count=2, width=64, height=96)["id"] for i in range(6)]
    # Mid-batch: the victim's pipeline call has begun (pass_started_at, written just before it)
    # and not ended, and the batch still holds its jobs. (Its jobs' progress_step is written only
    # by the lease keeper, every LEASE/3 seconds: a short pass can end between two writes.)
    deadline = time.monotonic() + 90
    while not GenerationJob.objects.filter(batch__worker__endswith=f":{victim_id}", batch__pass_started_at__isnull=False,
                                           batch__finished_at=None).exists():
        if time.monotonic() > deadline:
            batches = list(Batch.objects.values_list("worker", "size", "pass_started_at", "finished_at"))
            raise AssertionError(f"the victim never ran a pass of these jobs; batches {batches}; "
                                 f"its log ends:\n{second.log_path.read_text()[-3000:]}")
        time.sleep(0.02)
    second.kill()
    jobs = wait_all(ids, timeout=180)
    for job in jobs:
        assert job.images.count() == 2
        assert sorted(job.images.values_list("index", flat=True)) == [0, 1]
    assert max(job.attempts for job in jobs) >= 2, "the killed batch's jobs ran again"
    keys = list(GeneratedImage.objects.filter(job_id__in=ids).values_list("storage_key", flat=True))
    assert len(keys) == len(set(keys)) == 12


def test_a_job_that_keeps_killing_workers_fails_after_bounded_attempts(workers, alice_api):
    from jobs.actions import requeue_expired

    job = submit(alice_api, steps=2)
    wait_for_status(job["id"], ("done",))
    # Pretend its worker died mid-run on the last allowed attempt. In one transaction with the
    # pass: a reaper (a deployment's beat, or another test's) would otherwise see the row first.
    with transaction.atomic():
        GenerationJob.objects.filter(id=job["id"]).update(
            **at("generate"), attempts=settings.IMAGEGEN_MAX_ATTEMPTS, lease_expires_at="2000-01-01T00:00:00Z"
        )
        assert requeue_expired() == {"requeued": 0, "failed": 1}
    row = GenerationJob.objects.get(id=job["id"])
    assert row.status == "failed" and "interrupted" in row.reason


def test_flushing_the_schedulers_redis_keys_mid_run_loses_no_job(workers, reaper, alice_api, redis_client):
    with gpu_held(alice_api) as blocker:
        ids = [submit(alice_api, seed=i, steps=3, width=96, height=64)["id"] for i in range(5)]
        wait_scheduled(ids, blocker)
        lost = [k for k in redis_client.scan_iter(f"{PREFIX}*") if k.startswith((f"{PREFIX}q:", f"{PREFIX}shapes:"))]
        assert lost, "the jobs should be waiting in the scheduler"
        redis_client.delete(*lost)
        redis_client.delete(settings.QUEUE_GPU)  # the batch tokens too
    jobs = wait_all(ids, timeout=120)
    assert all(job.images.count() == 1 for job in jobs)


def test_two_users_in_flight_get_their_own_images(workers, transactional_db):
    carol, dave = make_user("carol"), make_user("dave")
    a = submit(client_for(carol), seed=5, steps=2)
    b = submit(client_for(dave), seed=5, steps=2)
    wait_all([a["id"], b["id"]])
    assert client_for(dave).get(f"/api/v1/jobs/{a['id']}").status_code == 404
    assert client_for(carol).get(f"/api/v1/jobs/{b['id']}").status_code == 404
    assert [j["id"] for j in client_for(dave).get("/api/v1/jobs").json()["results"]] == [b["id"]]


def test_a_token_that_takes_only_stale_entries_goes_on_to_the_live_job_behind_them(workers, alice_api):
    """A scheduler entry whose job is gone (deleted, cancelled or running already) costs its
    token nothing: the token takes again, so the live job behind it runs at once, without a
    reaper pass to send another token (none runs here). Seen in the suite: a flushed test's
    entries, older than the next test's job, took the one token its submit sent."""
    import uuid

    from jobs.actions import shape_of
    from scheduling import scheduler
    from scheduling.lanes import lane_of

    with gpu_held(alice_api) as blocker:
        job = submit(alice_api, seed=4242, steps=2)
        wait_scheduled([job["id"]], blocker)
        queued = GenerationJob.objects.get(id=job["id"])
        lane = lane_of(queued.model_version)
        here = f"|{queued.width}x{queued.height}|"
        # Six other shapes, each older than the starvation limit: taken first, one take each
        # (more takes than the two tokens sent, the blocker's and the job's, would make).
        for size in ("64x128", "128x64", "96x128", "128x96", "64x96", "96x64"):
            assert f"|{size}|" != here
            stale = shape_of(queued).replace(here, f"|{size}|")
            scheduler.enqueue(lane, stale, str(uuid.uuid4()), 1, time.time() - 3600, owner="gone")
    assert wait_for_status(job["id"], ("done",), timeout=120).status == "done"
