"""Verdicts that always take effect (issue 28, items 5 and 7): a moderator's approval decides
even when the admit that follows it is lost and the reaper re-sends the prompt check; review
holds at the image stage count against IMAGEGEN_USER_MAX_IN_REVIEW."""

from __future__ import annotations

import pytest

from jobs.models import GenerationJob
from jobs.pipeline.tasks import check_prompt
from safety.models import SafetyVerdict
from tests.conftest import wait_for_status
from tests.test_generation import submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("classifier_mode")]


def test_a_moderators_approval_survives_a_lost_admit(workers, alice_api, moderator_client, monkeypatch):
    """The approval's move (review -> waiting_gpu) commits with the decision; what can be lost is
    the bucket entry sent after commit: the reaper's rebuild restores it, and the job is made."""
    from jobs import actions
    from jobs.actions import lifecycle

    job = submit(alice_api, prompt="a red heart on a white background")
    wait_for_status(job["id"], ("review",))
    monkeypatch.setattr(lifecycle, "enqueue", lambda job, at: None)  # the bucket entry after the approval is lost
    response = moderator_client.post("/admin/safety/reviewcase/", {
        "action": "approve_selected", "_selected_action": [job["id"]], "notes": "fine", "index": 0})
    assert response.status_code == 302
    lost = GenerationJob.objects.get(id=job["id"])
    assert lost.stage == "waiting_gpu" and lost.status == "queued" and lost.scheduled_at is not None
    monkeypatch.undo()
    check_prompt.delay(job["id"])  # a re-sent prompt check finds the job moved on: it decides nothing again
    assert actions.rebuild_scheduler_state(min_age_seconds=0)[0] == 1  # what the reaper does
    done = wait_for_status(job["id"], ("done", "review"))
    assert done.status == "done", f"the first verdict re-held an approved prompt: {done.reason}"
    assert SafetyVerdict.objects.filter(job_id=job["id"], stage="human", decision="allow").exists()
    assert SafetyVerdict.objects.filter(job_id=job["id"], stage="prompt").count() == 1
    assert alice_api.get(f"/api/v1/jobs/{job['id']}").json()["status"] == "done"


def _running_in_publish(owner, n: int):
    """n of the owner's jobs running in one batch whose publish stage a run holds."""
    from jobs.models import Batch, BatchStage

    batch = Batch.objects.create(model_version="tiny", width=64, height=64, steps=2, guidance_scale=1.0, size=n, cap=n,
                                 stage=BatchStage.PUBLISH, stage_run="run-1")
    jobs = [GenerationJob.objects.create(owner=owner, prompt=f"a star {i}", width=64, height=64, steps=2, seed=i, guidance_scale=1.0,
                                         model_version="tiny", stage="publish", batch_id=batch.id, attempts=1)
            for i in range(n)]
    return batch, jobs


def test_image_stage_holds_count_against_the_per_user_review_cap(alice, settings):
    from jobs import actions

    settings.IMAGEGEN_USER_MAX_IN_REVIEW = 2
    batch, jobs = _running_in_publish(alice, 3)
    outcomes = [actions.Outcome(str(j.id), 1, "review", "image", "the image may show a heart") for j in jobs]
    finished, _ = actions.finish_batch(str(batch.id), "run-1", outcomes)
    assert len(finished) == 3
    statuses = [GenerationJob.objects.get(id=j.id).status for j in jobs]
    assert statuses == ["review", "review", "blocked"], statuses
    over = GenerationJob.objects.get(id=jobs[-1].id)
    assert over.blocked_stage == "image" and "limit is 2" in over.reason
    assert not over.images.filter(tier="public").exists()
