"""Stages that stay right under backlog and duplicates: a stage's lease means a worker holds it
(started when a worker starts the stage, renewed while it runs), a stage waiting in its queue
is not stuck, and a duplicated or stale run of a stage changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from tests.conftest import admitted_to, wait_for_status
from tests.test_pipeline_stages import submit, wait_for_batch_stage

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.django_db(transaction=True)


def test_a_classify_stage_slower_than_the_lease_behind_a_backlog_delivers_every_job(
    workers, reaper, start_worker, alice_api, classifier_mode
):
    """Three batches (three shapes) wait for one classify worker whose gate takes longer than a
    lease; the last waits in its queue for about three leases. None is declared stuck, none is
    re-run, every job is delivered with one verdict per image."""
    from jobs.models import GenerationJob

    lease = settings.IMAGEGEN_LEASE_SECONDS
    lane = "slowclassify"
    env = {"IMAGEGEN_MODEL_NAME": lane, "IMAGEGEN_QUEUE_CLASSIFY": "classify-slow", "IMAGEGEN_CLASSIFIER_TIMEOUT": "60"}
    gpu = start_worker("gpu-slowclassify", f"{settings.QUEUE_GPU_PREFIX}{lane}", **env)
    classify = start_worker("classify-slow", "classify-slow", **env)
    classifier_mode(f"slow:{lease + 1}")
    try:
        with admitted_to(lane):
            jobs = [submit(alice_api, "a green circle", seed=60 + i, width=w, height=h)
                    for i, (w, h) in enumerate([(64, 64), (96, 64), (64, 96)])]
        finished = [wait_for_status(job_id, ("done", "failed"), timeout=3 * (lease + 1) * 3 + 60) for job_id in jobs]
    finally:
        classifier_mode(None)
        classify.stop()
        gpu.stop()
    assert [job.status for job in finished] == ["done"] * 3, [job.reason for job in finished]
    for job in GenerationJob.objects.filter(id__in=jobs).select_related("batch"):
        assert job.batch.stage_attempts == 0
        assert job.verdicts.filter(stage="image").count() == 1


_PUBLISH_TWICE = r"""
import os, sys, time
import django
django.setup()
from jobs.pipeline import publish
from jobs.media import storage

real = storage.publish_object

def slow_publish_object(key):
    real(key)
    time.sleep(1.0)  # widen the window between the copy and the commit

publish.publish_object = slow_publish_object
start_at = float(sys.argv[2])
while time.time() < start_at:
    time.sleep(0.005)
print(publish.publish(sys.argv[1]))
"""


def test_two_publish_runs_of_one_batch_at_once_deliver_each_image_once_and_keep_its_bytes(
    workers, start_worker, worker_env, alice_api, redis_client
):
    """A duplicated publish (the reaper's re-send meeting the original, or a redelivery) runs in
    two processes at the same moment: each image is delivered once, and its public bytes are
    still there afterwards."""
    from jobs.media.storage import public_storage
    from jobs.models import GeneratedImage

    lane = "publishtwice"
    env = {"IMAGEGEN_MODEL_NAME": lane, "IMAGEGEN_QUEUE_IO": "io-twice", "IMAGEGEN_QUEUE_CLASSIFY": "classify-twice"}
    gpu = start_worker("gpu-publishtwice", f"{settings.QUEUE_GPU_PREFIX}{lane},classify-twice", **env)
    try:
        with admitted_to(lane):
            job_id = submit(alice_api, "a white square", seed=77, count=2)
        batch = wait_for_batch_stage(job_id, "publish")
        start_at = time.time() + 3.0
        runs = [
            subprocess.Popen([sys.executable, "-c", _PUBLISH_TWICE, str(batch.id), str(start_at)], cwd=ROOT,
                             env={**worker_env, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(2)
        ]
        outputs = [run.communicate(timeout=120)[0] for run in runs]
        assert all(run.returncode == 0 for run in runs), outputs
    finally:
        redis_client.delete("io-twice")
        gpu.stop()
    wait_for_status(job_id, ("done",), timeout=120)
    assert sum(str(job_id) in out.strip().splitlines()[-1] for out in outputs) == 1, outputs
    images = list(GeneratedImage.objects.filter(job_id=job_id).order_by("index"))
    assert [im.tier for im in images] == ["public", "public"]
    for image in images:
        assert public_storage().exists(image.storage_key), f"{image.storage_key}'s public bytes are gone"


def test_a_stage_run_that_lost_its_lease_changes_nothing(workers, start_worker, alice_api, redis_client):
    """A stale run (its lease was taken over) finishes after the stage moved on: it records no
    verdict and touches no job."""
    from jobs import actions
    from jobs.models import Batch

    lane = "stalerun"
    env = {"IMAGEGEN_MODEL_NAME": lane, "IMAGEGEN_QUEUE_CLASSIFY": "classify-nobody"}
    gpu = start_worker("gpu-stalerun", f"{settings.QUEUE_GPU_PREFIX}{lane}", **env)
    try:
        with admitted_to(lane):
            job_id = submit(alice_api, "a black circle", seed=81)
        batch = wait_for_batch_stage(job_id, "classify")
        first = actions.start_stage(batch.id, "classify")
        assert first is not None
        assert actions.start_stage(batch.id, "classify") is None  # held: a duplicate does not start
        Batch.objects.filter(id=batch.id).update(lease_expires_at=None, stage_run="another-run")  # taken over
        assert actions.record_verdicts(batch.id, first, [], "") is False
        batch.refresh_from_db()
        assert batch.stage == "classify" and batch.stage_run == "another-run"
    finally:
        redis_client.delete("classify-nobody")
        gpu.stop()


def test_prompt_checks_have_a_pool_of_their_own_in_make_run():
    """`make run` starts the classify stage and webhook deliveries in workers of their own, so
    neither a slow classifier nor a slow receiver delays a prompt check."""
    sys.path.insert(0, str(ROOT))
    from scripts import run

    commands = dict(run.process_commands(dict(os.environ), "8000", Path("/tmp/x")))
    queues = {name: set(cmd[cmd.index("-Q") + 1].split(",")) for name, cmd in commands.items() if "-Q" in cmd}
    owner = {queue: name for name, qs in queues.items() for queue in qs}
    assert owner[settings.QUEUE_CPU] != owner[settings.QUEUE_CLASSIFY]
    assert owner[settings.QUEUE_CPU] != owner[settings.QUEUE_WEBHOOKS]
    assert owner[settings.QUEUE_CPU] != owner[settings.QUEUE_IO]


@pytest.mark.django_db(transaction=False)
def test_the_age_of_each_batch_stage_queue_is_a_gauge():
    """A batch waiting unstarted in classify shows as the classify queue's age at /metrics.

    Its row stays inside this test's transaction: a reaper (a fault test's beat worker) would
    re-send a committed batch unstarted past IMAGEGEN_STAGE_RESEND_SECONDS (its age reset to 0)."""
    from datetime import timedelta

    from django.test import Client
    from django.utils import timezone

    from jobs.models import Batch

    Batch.objects.create(model_version="tiny-random", width=64, height=64, steps=2, guidance_scale=5.0, size=1, cap=4,
                         stage="classify", stage_sent_at=timezone.now() - timedelta(seconds=42))
    text = Client().get("/metrics").content.decode()
    line = next(line for line in text.splitlines() if line.startswith('imagegen_stage_queue_age_seconds{stage="classify"}'))
    assert 41 <= float(line.split()[-1]) < 60, line
