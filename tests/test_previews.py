"""Gated previews: every preview passes the image gate before a watcher gets it; a round judged
block or review sends nothing and the next round is judged afresh; with the gate failing, no
previews at all."""

from __future__ import annotations

import pytest
from django.conf import settings

from tests.conftest import admitted_to, wait_for_status, watch_job

pytestmark = pytest.mark.django_db(transaction=True)
LANE = "previews"


@pytest.fixture(scope="module")
def preview_worker(start_shared_worker):
    # A preview every 2 steps, unthrottled. Each job is admitted held and its lane woken once the
    # test has subscribed (a fill wait was to hold it back long enough: not on a loaded machine).
    worker = start_shared_worker("gpu-previews", f"{settings.QUEUE_GPU_PREFIX}{LANE}", IMAGEGEN_MODEL_NAME=LANE,
                                 IMAGEGEN_PREVIEW_EVERY="2", IMAGEGEN_PREVIEW_MIN_INTERVAL="0", IMAGEGEN_FILL_WAIT="1.5")
    yield worker
    worker.stop()


def watch(api, prompt: str, seed: int) -> tuple[str, list[dict]]:
    """Submit to the preview lane and collect every event of the job until its final status."""
    with admitted_to(LANE, held=True):
        response = api.post("/api/v1/jobs", {"prompt": prompt, "width": 64, "height": 64, "steps": 12, "seed": seed},
                            format="json")
    assert response.status_code == 202, response.content
    job_id = response.json()["id"]
    seen = watch_job(job_id, wake_lane=LANE)
    return job_id, seen


def test_allowed_previews_reach_the_watchers(preview_worker, workers, alice_api, classifier_mode):
    job_id, seen = watch(alice_api, "a red circle on a blue background", 501)
    previews = [e for e in seen if e["type"] == "preview"]
    assert wait_for_status(job_id, ("done",)).status == "done"
    assert previews, [e["type"] for e in seen]
    assert all(p["image"].startswith("data:image/jpeg;base64,") for p in previews)


def test_a_job_whose_previews_the_gate_blocks_sends_none(preview_worker, workers, alice_api, classifier_mode):
    classifier_mode('json:{"star": 0.99}')
    job_id, seen = watch(alice_api, "a red circle on a green background", 502)
    assert wait_for_status(job_id, ("blocked",)).status == "blocked"
    assert [e for e in seen if e["type"] == "preview"] == []
    assert any(e["type"] == "progress" for e in seen)  # it did run and was watched


def test_a_job_whose_first_preview_is_withheld_gets_the_later_ones(preview_worker, workers, alice_api, classifier_mode):
    # The first batch the classifier scores (the job's first preview round, at step 2: the gate
    # thread is idle when it is offered) is a star; every later one is clean.
    classifier_mode('first:1:{"star": 0.99}')
    job_id, seen = watch(alice_api, "a red circle on a yellow background", 504)
    assert wait_for_status(job_id, ("done",)).status == "done"
    steps = [e["step"] for e in seen if e["type"] == "preview"]
    assert steps, [e["type"] for e in seen]  # the old gate withheld every preview after the first
    assert 2 not in steps and min(steps) >= 4, steps


def test_with_the_gate_failing_no_preview_is_sent(preview_worker, workers, alice_api, classifier_mode):
    classifier_mode("raise")
    job_id, seen = watch(alice_api, "a red circle on a white background", 503)
    assert wait_for_status(job_id, ("failed",)).status == "failed"
    assert [e for e in seen if e["type"] == "preview"] == []
