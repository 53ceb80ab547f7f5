"""Every served diffusers family end to end through a real GPU worker (tiny random pipelines,
64x64, a few steps): done, deterministic, gated previews arrive, cancel mid-run works; and a
setting the family cannot honour refuses to start the worker."""

from __future__ import annotations

import numpy as np
import pytest
from django.conf import settings
from django.test import Client, override_settings

from gpu_tasks.tiny_pipeline import FAMILIES, write_tiny_family
from jobs.models import GenerationJob
from tests.conftest import admitted_to, forget_cache, wait_for_status, watch_job
from tests.test_generation import pixels

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="session")
def family_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return lambda family: write_tiny_family(root / family, family) if not (root / family / "model_index.json").exists() else root / family


def submit(api, lane: str, held: bool = False, **body) -> str:
    """`held`: queued without waking the lane's worker (watch(..., lane=lane) wakes it once
    subscribed, so no event of the job comes before the watcher is listening)."""
    payload = {"prompt": "a red circle on a blue background", "width": 64, "height": 64, "steps": 3, **body}
    with admitted_to(lane, held=held):
        response = api.post("/api/v1/jobs", payload, format="json")
    assert response.status_code == 202, response.content
    return response.json()["id"]


def watch(job_id: str, on_event=None, timeout: float = 90.0, lane: str = "") -> list[dict]:
    """Every event of the job until its final status. With `lane`, a job submitted held is let
    run once the subscription is in place."""
    return watch_job(job_id, on_event, timeout, wake_lane=lane)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_is_served_end_to_end(family, family_models, start_worker, workers, alice_api):
    lane = f"fam-{family}"
    worker = start_worker(f"gpu-{family}", f"{settings.QUEUE_GPU_PREFIX}{lane}", IMAGEGEN_MODEL_NAME=lane,
                          IMAGEGEN_MODEL_PATH=str(family_models(family)), IMAGEGEN_MODEL_VERSION=f"tiny-{family}",
                          IMAGEGEN_PREVIEW_EVERY="1", IMAGEGEN_PREVIEW_MIN_INTERVAL="0", IMAGEGEN_FILL_WAIT="1.5")
    try:
        assert f"loaded {family} pipeline".encode() in worker.log_path.read_bytes()
        # Done, with gated previews, two images with their own seeds in one pass.
        job_id = submit(alice_api, lane, held=True, seed=11, count=2, prompt="a green square")
        seen = watch(job_id, lane=lane)
        assert wait_for_status(job_id, ("done",)).status == "done"
        previews = [e for e in seen if e["type"] == "preview"]
        assert previews and all(p["image"].startswith("data:image/jpeg;base64,") for p in previews)
        first, second = pixels(job_id)
        assert first.shape == (64, 64, 3) and not np.array_equal(first, second)
        # Deterministic: the same request generated again gives the same pixels.
        forget_cache(job_id)
        again = submit(alice_api, lane, seed=11, count=2, prompt="a green square")
        assert wait_for_status(again, ("done",)).status == "done"
        assert GenerationJob.objects.get(id=again).batch_id != GenerationJob.objects.get(id=job_id).batch_id
        assert all(np.array_equal(a, b) for a, b in zip(pixels(job_id), pixels(again), strict=True))
        # Cancel mid-run: after its first progress event.
        long_job = submit(alice_api, lane, held=True, seed=12, steps=60)

        def cancel_once_running(event, asked=[]):  # noqa: B006  # once per job
            if event["type"] == "progress" and not asked:
                asked.append(True)
                assert alice_api.post(f"/api/v1/jobs/{long_job}/cancel").status_code == 202

        seen = watch(long_job, cancel_once_running, lane=lane)
        row = wait_for_status(long_job, ("cancelled",))
        steps = [e["step"] for e in seen if e["type"] == "progress"]
        # Nothing delivered: no public image. (The cancel can also land after the hand-off has
        # written the job's quarantined image, on a loaded machine; that image is never published.)
        assert row.status == "cancelled" and not row.images.exclude(tier="quarantine").exists()
        # It ran and was cancelled while running; how soon a pass stops is counted in steps by
        # tests/test_cancel_running.py (here a tiny pipeline's 60 steps can end before the cancel
        # request does on a loaded machine: the job is then dropped at its hand-off, as above).
        assert steps
        if family == "flux":
            # Distilled guidance: the lane's worker says it takes no negative prompt, so a job
            # with one is a 400 at submit naming the field ...
            payload = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 3, "negative_prompt": "blurry"}
            with admitted_to(lane):
                response = alice_api.post("/api/v1/jobs", payload, format="json")
            assert response.status_code == 400, response.content
            assert "takes no negative prompt" in response.json()["negative_prompt"][0]
            # ... and one admitted while no worker had said so is refused for that job alone.
            from unittest import mock

            with mock.patch("scheduling.heartbeats.capabilities", return_value=None):
                refused = submit(alice_api, lane, seed=13, negative_prompt="blurry")
            row = wait_for_status(refused, ("failed",))
            assert "takes no negative prompt" in row.reason
    finally:
        worker.stop()


def test_a_setting_the_family_cannot_honour_refuses_to_start(family_models, start_worker, workers):
    lane = "fam-mismatch"
    worker = start_worker("gpu-mismatch", f"{settings.QUEUE_GPU_PREFIX}{lane}", wait=False, IMAGEGEN_MODEL_NAME=lane,
                          IMAGEGEN_MODEL_PATH=str(family_models("flux")), IMAGEGEN_CFG_CUTOFF="0.5",
                          IMAGEGEN_MODEL_FAMILY="sdxl")
    assert worker.proc.wait(timeout=180) == 3
    log = worker.log_path.read_bytes()
    assert b"refusing to start" in log
    assert b"IMAGEGEN_CFG_CUTOFF=0.5 cannot be honoured by a flux model" in log
    assert b"IMAGEGEN_MODEL_FAMILY=sdxl but IMAGEGEN_MODEL_PATH holds a flux model" in log
    with override_settings(IMAGEGEN_MODEL_NAME=lane):
        body = Client().get("/readyz").json()
    assert "model" in body["failing"] and "IMAGEGEN_CFG_CUTOFF" in body["checks"]["model"]
