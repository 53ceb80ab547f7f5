"""Model versions: a canary takes its share of traffic on its own workers, and queued jobs move
between versions (roll back, promote) without being lost."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from django.core.management import call_command

from gpu_tasks.tiny_pipeline import write_tiny_pipeline
from jobs.models import GenerationJob
from scheduling.lanes import lane_of, pick_version
from tests.conftest import wait_for_status
from tests.test_generation import pixels, submit

pytestmark = pytest.mark.django_db(transaction=True)
CANARY = "tiny-canary"


def test_the_canary_share_is_stable_per_job_and_close_to_the_setting(settings):
    settings.IMAGEGEN_CANARY_VERSION, settings.IMAGEGEN_CANARY_SHARE = CANARY, 0.2
    ids = [uuid.uuid4() for _ in range(4000)]
    share = sum(pick_version(i) == CANARY for i in ids) / len(ids)
    assert 0.17 < share < 0.23
    assert all(pick_version(i) == pick_version(i) for i in ids[:50])
    assert lane_of(CANARY) == f"{settings.IMAGEGEN_MODEL_NAME}@{CANARY}"
    assert lane_of(settings.IMAGEGEN_MODEL_VERSION) == settings.IMAGEGEN_MODEL_NAME


def test_a_canary_serves_its_share_and_a_rollback_loses_no_queued_job(workers, start_worker, alice_api, settings):
    canary_path = Path(settings.VAR_DIR) / "models" / CANARY
    if not (canary_path / "model_index.json").exists():
        write_tiny_pipeline(canary_path, seed=1)  # a different "version": other weights
    lane_queue = settings.QUEUE_GPU_PREFIX + lane_of(CANARY)
    canary = start_worker("gpu-canary", lane_queue, IMAGEGEN_MODEL_PATH=str(canary_path), IMAGEGEN_MODEL_VERSION=CANARY)
    settings.IMAGEGEN_CANARY_VERSION, settings.IMAGEGEN_CANARY_SHARE = CANARY, 1.0
    job = submit(alice_api, seed=5150, steps=3, prompt="a canary circle")
    assert job["model"] == CANARY
    done = wait_for_status(job["id"], ("done",))
    assert done.batch.worker.endswith(f":{canary.proc.pid}"), "the canary's own worker ran it"
    settings.IMAGEGEN_CANARY_SHARE = 0.0
    stable = wait_for_status(submit(alice_api, seed=5150, steps=3, prompt="a canary circle")["id"], ("done",))
    assert stable.model_version == settings.IMAGEGEN_MODEL_VERSION
    assert not np.array_equal(pixels(done.id)[0], pixels(stable.id)[0]), "two versions, two outputs"

    # Roll back: the canary's workers are gone while jobs wait on its lane.
    canary.stop()
    settings.IMAGEGEN_CANARY_SHARE = 1.0
    stranded = [submit(alice_api, seed=6000 + i, steps=3, prompt="a stranded square")["id"] for i in range(2)]
    deadline = time.monotonic() + 120  # admitted to the canary's lane, where nothing takes them
    while GenerationJob.objects.filter(id__in=stranded, scheduled_at=None).exists():
        assert time.monotonic() < deadline, "the stranded jobs were never admitted"
        time.sleep(0.05)
    assert all(GenerationJob.objects.get(id=i).status == "queued" for i in stranded)
    settings.IMAGEGEN_CANARY_SHARE = 0.0
    call_command("rollout", "move", "--from", CANARY, "--to", settings.IMAGEGEN_MODEL_VERSION)
    for job_id in stranded:
        moved = wait_for_status(job_id, ("done",))
        assert moved.model_version == settings.IMAGEGEN_MODEL_VERSION and moved.images.count() == 1
