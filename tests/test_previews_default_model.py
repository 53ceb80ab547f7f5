"""The README's own example streams previews on the default model, judged by the shipped image gate
(issue 46): before, its first preview (a blurry early picture the gate read as a star) withheld
every later one, and the job streamed none."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import admitted_to, wait_for_status, watch_job

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[1]
SERVED = "shapes-v2"
V2 = ROOT / "models" / SERVED
README_PROMPT = "a red circle on a blue background"  # README.md and docs/api.md, seed 7


def test_the_readmes_example_streams_previews_on_the_default_model(workers, start_worker, alice_api, settings):
    from scheduling.lanes import gpu_queue, lane_of

    settings.IMAGEGEN_EXTRA_MODELS = {SERVED: str(V2)}
    lane = lane_of(SERVED)
    worker = start_worker("gpu-v2-previews", gpu_queue(lane), IMAGEGEN_EXTRA_MODELS=f"{SERVED}={V2}",
                          IMAGEGEN_IMAGE_CLASSIFIER=f"shapes:{ROOT / 'models' / 'shapes-classifier-v3'}",
                          IMAGEGEN_SAFETY_POLICY=str(ROOT / "safety" / "policy.json"),
                          IMAGEGEN_PREVIEW_EVERY="4", IMAGEGEN_PREVIEW_MIN_INTERVAL="0")
    try:
        with admitted_to(settings.IMAGEGEN_MODEL_NAME, held=True):
            response = alice_api.post("/api/v1/jobs", {"prompt": README_PROMPT, "seed": 7, "steps": 20, "width": 64,
                                                       "height": 64, "model": SERVED}, format="json")
        assert response.status_code == 202, response.content
        job_id = response.json()["id"]
        seen = watch_job(job_id, wake_lane=lane, timeout=240)
        assert wait_for_status(job_id, ("done",)).status == "done"
    finally:
        worker.stop()
    previews = [e["step"] for e in seen if e["type"] == "preview"]
    assert [e["step"] for e in seen if e["type"] == "progress"][-1] == 20
    assert previews, [e["type"] for e in seen]  # rounds at steps 4, 8, 12 and 16, each judged on its own
