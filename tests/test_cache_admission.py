"""Request-hash cache, honest estimates, admission control, degradation and per-user limits."""

from __future__ import annotations

import time

import pytest

from imagegen.redis_client import get_redis
from jobs.models import Batch, GenerationJob
from safety.models import SafetyVerdict
from scheduling import scheduler
from scheduling.costs import COST_KEY
from tests.conftest import wait_for_status, wait_until_cached
from tests.test_batching import gpu_held, wait_scheduled
from tests.test_generation import submit

pytestmark = pytest.mark.django_db(transaction=True)


def pixels(image_or_bytes) -> bytes:
    """The decoded RGB pixels of a stored image (or of a file's bytes)."""
    import io

    from PIL import Image

    from jobs.media.storage import public_storage

    data = image_or_bytes
    if not isinstance(data, bytes):
        with public_storage().open(image_or_bytes.storage_key, "rb") as fh:
            data = fh.read()
    with Image.open(io.BytesIO(data)) as im:
        return im.convert("RGB").tobytes()


@pytest.fixture
def clean_costs():
    yield
    get_redis().delete(COST_KEY)


def test_a_repeated_request_is_done_in_the_submit_response_with_the_same_image_and_no_batch(workers, alice_api):
    # Her own repeat: by default the cache is per user (another user's: tests/test_cache_scope.py).
    first = submit(alice_api, seed=4242, prompt="a purple square on a white background")
    done = wait_for_status(first["id"], ("done",))
    wait_until_cached(done)  # remembered just after the commit that made it done
    batches_before = Batch.objects.count()
    again = submit(alice_api, seed=4242, prompt="a purple square on a white background")
    assert again["status"] == "done" and again["eta_seconds"] == 0.0
    assert Batch.objects.count() == batches_before
    repeat = GenerationJob.objects.get(id=again["id"])
    # The same pixels in a file of its own (its own parameters and credentials, its own object).
    assert pixels(repeat.images.get()) == pixels(done.images.get())
    assert again["images"][0]["url"] != alice_api.get(f"/api/v1/jobs/{first['id']}").json()["images"][0]["url"]
    assert SafetyVerdict.objects.filter(job=repeat, stage="prompt", decision="allow").exists()


def test_a_partial_hit_generates_only_the_missing_seeds(workers, alice_api):
    middle = wait_for_status(submit(alice_api, seed=7001, prompt="an orange triangle")["id"], ("done",))
    wait_until_cached(middle)  # remembered just after the commit that made it done
    job = submit(alice_api, seed=7000, count=3, prompt="an orange triangle")
    done = wait_for_status(job["id"], ("done",))
    assert done.batch.size == 2, "only seeds 7000 and 7002 were generated"
    images = {im.index: im for im in done.images.all()}
    assert sorted(images) == [0, 1, 2]
    assert images[1].source_key == middle.images.get().storage_key and pixels(images[1]) == pixels(middle.images.get())
    assert [im["seed"] for im in alice_api.get(f"/api/v1/jobs/{job['id']}").json()["images"]] == [7000, 7001, 7002]


def test_a_cache_entry_whose_bytes_were_purged_or_whose_image_was_blocked_is_not_served(workers, alice_api):
    from jobs.media.storage import public_storage

    first = wait_for_status(submit(alice_api, seed=31, prompt="a white circle")["id"], ("done",))
    with public_storage().open(first.images.get().storage_key, "rb") as fh:
        first_pixels = fh.read()
    public_storage().delete(first.images.get().storage_key)
    again = submit(alice_api, seed=31, prompt="a white circle")
    assert again["status"] == "queued"
    regenerated = wait_for_status(again["id"], ("done",))
    # A pure function of its inputs: the same pixels (the files differ: each names its own job).
    assert pixels(regenerated.images.get()) == pixels(first_pixels)
    image = regenerated.images.get()
    SafetyVerdict.objects.create(job=regenerated, image=image, stage="human", decision="block", reason="moderator")
    image.verdicts.filter(stage="image").update(decision="block")
    third = submit(alice_api, seed=31, prompt="a white circle")
    assert third["status"] == "queued"
    wait_for_status(third["id"], ("done",))


def test_past_the_wait_limit_submit_answers_429_with_retry_after_and_the_estimate(workers, alice_api, settings):
    settings.IMAGEGEN_MAX_QUEUE_WAIT = 0.01  # any real estimate is larger: fill wait alone is 0.3 s
    response = alice_api.post("/api/v1/jobs", {"prompt": "a red circle", "steps": 4}, format="json")
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    body = response.json()
    assert body["limit"] == "max_queue_wait" and body["eta_seconds"] > 0.01
    assert "allow_degrade" in body["detail"]
    assert GenerationJob.objects.count() == 0


def test_with_allow_degrade_the_job_is_accepted_with_fewer_steps(workers, alice_api, settings, clean_costs):
    # The limit is far above what other work queued on a loaded machine adds to an estimate (a
    # 10 s limit was passed under the stress script) and far below the slow shape's own cost.
    settings.IMAGEGEN_MAX_QUEUE_WAIT = 600
    settings.IMAGEGEN_DEGRADE_STEPS = 3
    r = get_redis()
    r.hset(COST_KEY, scheduler.shape_key("tiny-random", 64, 64, 50, 5.0, ""), 10_000.0)  # measured: slow
    r.hset(COST_KEY, scheduler.shape_key("tiny-random", 64, 64, 3, 5.0, ""), 0.05)
    refused = alice_api.post("/api/v1/jobs", {"prompt": "a red circle", "steps": 50}, format="json")
    assert refused.status_code == 429 and refused.json()["eta_seconds"] >= 10_000
    response = alice_api.post("/api/v1/jobs", {"prompt": "a red circle", "steps": 50, "allow_degrade": True}, format="json")
    assert response.status_code == 202, response.content
    job = response.json()
    assert (job["degraded"], job["requested_steps"], job["steps"]) == (True, 50, 3)
    assert job["eta_seconds"] < 600  # the 3-step shape's cost, not the 50-step one's
    done = wait_for_status(job["id"], ("done",))
    assert done.batch.steps == 3


def test_a_user_over_the_in_flight_limit_gets_a_429_naming_the_limit(alice_api, settings, stay_queued):
    settings.IMAGEGEN_USER_MAX_IN_FLIGHT = 2
    for i in range(2):
        assert alice_api.post("/api/v1/jobs", {"prompt": "a cat", "seed": i}, format="json").status_code == 202
    response = alice_api.post("/api/v1/jobs", {"prompt": "a cat", "seed": 9}, format="json")
    assert response.status_code == 429 and response.json()["limit"] == "jobs_in_flight"
    assert "jobs in flight" in response.json()["detail"]


def test_a_user_over_the_daily_image_limit_gets_a_429_naming_the_limit(alice_api, settings, monkeypatch, stay_queued):
    settings.IMAGEGEN_USER_MAX_IMAGES_PER_DAY = 5
    assert alice_api.post("/api/v1/jobs", {"prompt": "a cat", "count": 4}, format="json").status_code == 202
    response = alice_api.post("/api/v1/jobs", {"prompt": "a cat", "count": 2}, format="json")
    assert response.status_code == 429 and response.json()["limit"] == "images_per_day"
    assert "images per day" in response.json()["detail"]


def test_the_queue_endpoint_and_a_queued_job_reflect_submitted_work(workers, alice_api):
    with gpu_held(alice_api) as blocker:
        ids = [submit(alice_api, seed=600 + i, steps=5, width=64, height=96)["id"] for i in range(3)]
        wait_scheduled(ids, blocker)
        # The endpoint reads the per-shape summary, recomputed off the request path: it shows the
        # three jobs within a refresh or two.
        deadline = time.monotonic() + 120
        while True:
            queue = alice_api.get("/api/v1/queue").json()["models"][0]
            shape = next((s for s in queue["shapes"] if (s["width"], s["height"], s["steps"]) == (64, 96, 5)), None)
            if shape is not None and shape["images"] == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert queue["active_workers"] >= 1
        assert shape is not None and shape["images"] == 3 and shape["estimated_wait_seconds"] > 0, queue["shapes"]
        last = alice_api.get(f"/api/v1/jobs/{ids[-1]}").json()
        first = alice_api.get(f"/api/v1/jobs/{ids[0]}").json()
        assert last["status"] == "queued" and last["queue_position"] > first["queue_position"]
        # The same bucket: the later job's ETA is not earlier, up to the summary being recomputed
        # between the two reads (its samples then move by a few hundredths of a second).
        assert last["eta_seconds"] >= first["eta_seconds"] - 0.25 and first["eta_seconds"] > 0
    for job_id in ids:
        wait_for_status(job_id, ("done",))
