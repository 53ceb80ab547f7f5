"""The shared cache tells no one anything (issue 44, item 8). Under the k-anonymous scope with k
reached, a cross-user hit answers, waits, runs and is charged like a fresh job of its shape: the
same fields and kinds of values in its 202 and in its GET while queued (an ETA and a queue
position, no revised prompt yet, its images reserved against the daily limit), its status moves
queued -> running -> done while a listener watches. And every job served from the cache (the
owner's own repeats too) gets a file of its own: the same pixels, re-encoded with its own
parameters and content credentials naming it, under its own key; deleting one user's image
leaves the other's, and a moderator's take-down of the source still reaches every copy."""

from __future__ import annotations

import io
import uuid

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client
from PIL import Image

from jobs import actions
from jobs.access import usage
from jobs.media import credentials
from jobs.media.storage import public_storage
from jobs.models import GenerationJob, JobStage, UsageCharge
from tests.conftest import wait_for_status, wait_until, wait_until_cached
from tests.test_batching import gpu_held
from tests.test_events import ORIGIN, communicator, token_header
from tests.test_generation import submit

pytestmark = pytest.mark.django_db(transaction=True)


def kinds(value):
    """The shape of a JSON value: its keys, and the type of every leaf."""
    if isinstance(value, dict):
        return {key: kinds(item) for key, item in value.items()}
    if isinstance(value, list):
        return [kinds(item) for item in value]
    return type(value).__name__


def stored(image) -> bytes:
    with public_storage().open(image.storage_key, "rb") as fh:
        return fh.read()


def pixels(data: bytes) -> bytes:
    with Image.open(io.BytesIO(data)) as im:
        return im.convert("RGB").tobytes()


def fetch(api, job_id) -> int:
    """The status of a GET of the job's first image's public URL."""
    url = api.get(f"/api/v1/jobs/{job_id}").json()["images"][0]["url"]
    response = Client().get(url)
    if hasattr(response, "streaming_content"):
        b"".join(response.streaming_content)
    return response.status_code


def unique(prompt: str) -> dict:
    # A prompt of its own per run: the suite's Redis keeps cache entries and askers across tests.
    return {"seed": 8181, "steps": 2, "prompt": f"{prompt} {uuid.uuid4().hex[:6]}"}


@pytest.fixture
def shared_at_two(settings):
    settings.IMAGEGEN_CACHE_SCOPE = "k-anonymous"
    settings.IMAGEGEN_CACHE_SHARE_K = 2


def test_a_cross_user_hit_answers_waits_runs_and_is_charged_like_a_fresh_job(workers, alice_api, bob_api, bob,
                                                                             shared_at_two):
    request = unique("a lime rhombus on a navy background")
    source = wait_for_status(submit(alice_api, **request)["id"], ("done",))
    wait_until_cached(source)
    statuses: list[str] = []
    with gpu_held(alice_api) as blocker:
        fresh = submit(bob_api, **{**request, "seed": 8182})  # the same shape, never asked before
        hit = submit(bob_api, **request)  # alice and bob asked: k = 2 reached, served from the cache
        assert kinds(hit) == kinds(fresh), "the 202's fields or kinds of values say it was a hit"
        same = ("status", "stage", "progress", "images", "revised_prompt", "attempts", "batch", "started_at",
                "finished_at", "reason")
        assert {k: hit[k] for k in same} == {k: fresh[k] for k in same}
        assert hit["status"] == "queued" and hit["eta_seconds"] is not None and hit["queue_position"] is not None
        assert usage.unfinished(bob.pk) == (2, 2), "the hit reserves its image as a fresh job does"

        def waiting() -> bool:
            stages = dict(GenerationJob.objects.filter(id__in=[fresh["id"], hit["id"]]).values_list("id", "stage"))
            return set(stages.values()) == {JobStage.WAITING_GPU, JobStage.REVEAL}

        wait_until(waiting, what="both past their prompt check, waiting")
        polled = [bob_api.get(f"/api/v1/jobs/{job['id']}").json() for job in (fresh, hit)]
        assert kinds(polled[1]) == kinds(polled[0]), "a GET while queued says it was a hit"
        assert [p["stage"] for p in polled] == ["waiting_gpu", "waiting_gpu"]
        assert polled[1]["eta_seconds"] is not None and polled[1]["queue_position"] is not None

        async def watch() -> None:
            ws = communicator(hit["id"], ORIGIN, token_header(bob))
            connected, _ = await ws.connect(timeout=60)
            assert connected
            statuses.append((await ws.receive_json_from(timeout=60))["status"])
            await sync_to_async(alice_api.post)(f"/api/v1/jobs/{blocker['id']}/cancel")  # the GPU is free
            while statuses[-1] not in ("done", "failed", "blocked", "cancelled"):
                event = await ws.receive_json_from(timeout=120)
                if event["type"] == "status":
                    statuses.append(event["status"])
            await ws.disconnect()

        async_to_sync(watch)()
    assert statuses == ["queued", "running", "done"]
    done = wait_for_status(hit["id"], ("done",))
    assert done.batch_id is None, "served from the cache, no GPU pass"
    assert done.started_at is not None and done.started_at <= done.finished_at and done.attempts == 1
    assert done.finished_at >= done.cache_reveal_at, "done sooner than a fresh job would be"
    assert UsageCharge.objects.get(job_id=done.id).images == 1, "charged as the fresh job is"
    wait_for_status(fresh["id"], ("done",))


def test_each_job_served_from_the_cache_gets_a_file_of_its_own(workers, alice_api, bob_api, shared_at_two):
    request = unique("a tan chevron on a slate background")
    source = wait_for_status(submit(alice_api, **request)["id"], ("done",))
    wait_until_cached(source)
    own = submit(alice_api, **request)
    assert own["status"] == "done", "the owner's own repeat stays instant"
    theirs = wait_for_status(submit(bob_api, **request)["id"], ("done",))
    assert theirs.batch_id is None

    jobs = [source, GenerationJob.objects.get(id=own["id"]), theirs]
    images = [job.images.get() for job in jobs]
    files = [stored(image) for image in images]
    assert len({image.storage_key for image in images}) == 3, "a job's image is another job's object"
    assert len(set(files)) == 3
    assert {pixels(data) for data in files} == {pixels(files[0])}, "the same pixels"
    for job, data in zip(jobs, files, strict=True):
        check = credentials.verify(data)
        assert check.ok and check.trusted, check.failures
        assert check.parameters["jobId"] == str(job.id), "the file's credentials name another job"
        assert check.actions[0]["parameters"]["jobId"] == str(job.id)

    assert alice_api.delete(f"/api/v1/jobs/{source.id}").status_code == 204
    wait_until(lambda: not public_storage().exists(images[0].storage_key), what="alice's object deleted")
    assert fetch(bob_api, theirs.id) == 200 and fetch(alice_api, own["id"]) == 200, "a delete took another copy"


def test_a_moderators_take_down_of_a_cached_image_reaches_every_copy(workers, alice_api, bob_api, moderator,
                                                                    shared_at_two):
    request = unique("a rust crescent on an ivory background")
    source = wait_for_status(submit(alice_api, **request)["id"], ("done",))
    wait_until_cached(source)
    copy = wait_for_status(submit(bob_api, **request)["id"], ("done",))
    assert copy.images.get().storage_key != source.images.get().storage_key
    assert actions.reject_delivered(source.images.get(), moderator) == 2
    for job in (source, copy):
        assert wait_for_status(job.id, ("blocked",)).images.get().tier == "quarantine"
        wait_until(lambda job=job: not public_storage().exists(job.images.get().storage_key), what="taken down")
