"""Identical requests join in flight (issue 48, item 1). A request equal to a queued or running
job's (the same request-hash key: prompt, parameters, seed, model, the gates' identity) joins that
job's pass: no second GPU pass, a job row of its own, a file of its own with its own content
credentials, delivered when the first is. A cancelled joiner leaves the pass alone; a cancelled
leader leaves its joiner to be generated. Across users the shared cache's rule holds: under the
k-anonymous scope below k there is no join, and at k a joiner answers like a fresh job."""

from __future__ import annotations

import json
import uuid

import pytest

from imagegen.redis_client import get_redis
from jobs.media import cache, credentials
from jobs.models import Batch, GeneratedImage, GenerationJob, JobStage, UsageCharge
from tests.conftest import wait_for_status, wait_until
from tests.test_batching import gpu_held
from tests.test_cache_privacy import kinds, pixels, stored
from tests.test_generation import submit

pytestmark = pytest.mark.django_db(transaction=True)


def unique(prompt: str) -> dict:
    # A prompt of its own per run: the suite's Redis keeps cache entries, askers and in-flight keys.
    return {"seed": 4848, "steps": 2, "prompt": f"{prompt} {uuid.uuid4().hex[:6]}"}


def passes(*jobs) -> set:
    """The GPU passes that made these jobs' images."""
    return set(Batch.objects.filter(images__job__in=[job.id for job in jobs]).values_list("id", flat=True))


def joined(job_id) -> GenerationJob:
    """The job, once its prompt check is done and it waits for the job it joined."""
    return wait_until(lambda: GenerationJob.objects.filter(id=job_id, stage=JobStage.REVEAL).first(),
                      what="the joiner waiting for its leader")


def test_two_identical_requests_in_flight_make_one_pass_and_two_deliveries(workers, alice_api):
    request = unique("a teal kite on a sand background")
    with gpu_held(alice_api):
        first = submit(alice_api, **request)
        second = submit(alice_api, **request)
        assert second["status"] == "queued"
        assert joined(second["id"]).joins_id == uuid.UUID(first["id"]), "the second did not join the first"
    leader, joiner = (wait_for_status(job["id"], ("done",)) for job in (first, second))
    assert len(passes(leader, joiner)) == 1, "an identical request in flight made a second pass"
    assert joiner.batch_id is None and leader.batch_id is not None
    assert joiner.finished_at >= leader.finished_at
    assert not UsageCharge.objects.filter(job_id=joiner.id, images__gt=0).exists(), "charged like an own cache hit"

    images = [job.images.get() for job in (leader, joiner)]
    assert images[0].storage_key != images[1].storage_key, "the joiner shares the leader's object"
    assert images[1].tier == "public" and images[1].source_key == images[0].storage_key
    files = [stored(image) for image in images]
    assert pixels(files[0]) == pixels(files[1]), "not the same pixels"
    for job, data in zip((leader, joiner), files, strict=True):
        check = credentials.verify(data)
        assert check.ok and check.trusted, check.failures
        assert check.parameters["jobId"] == str(job.id), "the file's credentials name another job"
    body = alice_api.get(f"/api/v1/jobs/{second['id']}").json()
    assert body["status"] == "done" and len(body["images"]) == 1
    wait_until(lambda: not get_redis().exists(*cache._in_flight_keys(leader)), what="the ended leader's notes dropped")


def test_a_cancelled_joiner_does_not_cancel_the_pass(workers, alice_api):
    request = unique("a plum arrow on a cream background")
    with gpu_held(alice_api):
        first = submit(alice_api, **request)
        second = submit(alice_api, **request)
        joined(second["id"])
        assert alice_api.post(f"/api/v1/jobs/{second['id']}/cancel").status_code == 202
    leader = wait_for_status(first["id"], ("done",))
    assert leader.images.get().tier == "public" and len(passes(leader)) == 1
    joiner = GenerationJob.objects.get(id=second["id"])
    assert joiner.status == "cancelled" and not joiner.images.exists()


def test_a_cancelled_leader_leaves_its_joiner_to_be_generated(workers, alice_api):
    request = unique("a gold ring on a teal background")
    with gpu_held(alice_api):
        first = submit(alice_api, **request)
        second = submit(alice_api, **request)
        joined(second["id"])
        assert alice_api.post(f"/api/v1/jobs/{first['id']}/cancel").status_code == 202
    # Its start runs on the lane's GPU worker (free once the blocker is cancelled).
    joiner = wait_for_status(second["id"], ("done",))
    assert joiner.batch_id is not None, "generated itself"
    assert joiner.joins_id is None and joiner.images.get().tier == "public"
    assert GenerationJob.objects.get(id=first["id"]).status == "cancelled"
    assert UsageCharge.objects.get(job_id=joiner.id).images == 1, "generated, charged as a fresh job"


def test_another_users_identical_request_below_k_does_not_join(workers, alice_api, bob_api, settings):
    settings.IMAGEGEN_CACHE_SCOPE = "k-anonymous"
    settings.IMAGEGEN_CACHE_SHARE_K = 3
    request = unique("a grey square on a lilac background")
    with gpu_held(alice_api):
        first = submit(alice_api, **request)
        second = submit(bob_api, **request)
        assert GenerationJob.objects.get(id=second["id"]).joins_id is None, "joined another user's rare request"
    theirs = wait_for_status(second["id"], ("done",))
    assert theirs.batch_id is not None and theirs.joins_id is None
    wait_for_status(first["id"], ("done",))


def test_another_users_request_at_k_joins_and_answers_like_a_fresh_job(workers, alice_api, bob_api, bob, settings):
    settings.IMAGEGEN_CACHE_SCOPE = "k-anonymous"
    settings.IMAGEGEN_CACHE_SHARE_K = 2
    request = unique("a navy wave on a peach background")
    with gpu_held(alice_api):
        first = submit(alice_api, **request)
        fresh = submit(bob_api, **{**request, "seed": request["seed"] + 1})  # the same shape, asked by no one
        hit = submit(bob_api, **request)  # alice and bob asked: k = 2 reached
        assert kinds(hit) == kinds(fresh), "the 202's fields or kinds of values say it joined"
        same = ("status", "stage", "progress", "images", "attempts", "batch", "started_at", "finished_at", "reason")
        assert {k: hit[k] for k in same} == {k: fresh[k] for k in same}
        assert hit["eta_seconds"] is not None and hit["queue_position"] is not None
        row = joined(hit["id"])
        assert row.joins_id == uuid.UUID(first["id"]) and row.billable_images == 1
        polled = bob_api.get(f"/api/v1/jobs/{hit['id']}").json()
        assert polled["stage"] == "waiting_gpu" and polled["status"] == "queued"
    leader = wait_for_status(first["id"], ("done",))
    done = wait_for_status(hit["id"], ("done",))
    assert done.batch_id is None and done.finished_at >= done.cache_reveal_at, "done sooner than a fresh job"
    assert len(passes(leader, done)) == 1
    assert UsageCharge.objects.get(job_id=done.id).images == 1, "charged as the fresh job is"
    mine, theirs = leader.images.get(), done.images.get()
    assert mine.storage_key != theirs.storage_key and pixels(stored(mine)) == pixels(stored(theirs))
    assert credentials.verify(stored(theirs)).parameters["jobId"] == str(done.id)
    assert not GeneratedImage.objects.filter(job=done, tier="quarantine").exists()
    wait_for_status(fresh["id"], ("done",))


def test_a_joiner_of_pixels_the_image_gate_blocked_is_blocked_without_a_pass(workers, alice_api, classifier_mode):
    # The same seed under the same gate (both in the key) makes the same pixels, which the gate
    # would block again: the owner's joiner shares the block instead of spending a pass on it.
    request = unique("a yellow circle on a grey background")
    with gpu_held(alice_api):
        first = submit(alice_api, **request)
        second = submit(alice_api, **request)
        joined(second["id"])
        classifier_mode("json:" + json.dumps({"star": 0.95}))
    leader = wait_for_status(first["id"], ("blocked",))
    joiner = wait_for_status(second["id"], ("blocked",))
    assert leader.blocked_stage == joiner.blocked_stage == "image"
    assert "looks like a star" in joiner.reason and not joiner.images.exists()
    assert joiner.batch_id is None and len(passes(leader, joiner)) == 1


def test_a_joiner_of_a_job_held_for_review_is_generated_and_judged_itself(workers, alice_api, classifier_mode):
    request = unique("a white circle on a black background")
    with gpu_held(alice_api):
        first = submit(alice_api, **request)
        second = submit(alice_api, **request)
        joined(second["id"])
        classifier_mode("json:" + json.dumps({"heart": 0.8}))
    leader = wait_for_status(first["id"], ("review",))
    joiner = wait_for_status(second["id"], ("review",))
    assert joiner.joins_id is None and joiner.batch_id is not None, "it inherited the hold instead of its own pass"
    assert joiner.batch_id != leader.batch_id and joiner.images.get().tier == "quarantine"
