"""Submit -> prompt check -> batch on the GPU worker -> store -> done, through real workers."""

from __future__ import annotations

import io

import numpy as np
import pytest
from django.test import Client
from PIL import Image

from jobs.models import GeneratedImage, GenerationJob
from tests.conftest import admitted_to, forget_cache, wait_for_status

pytestmark = pytest.mark.django_db(transaction=True)


def submit(api, **body):
    payload = {"prompt": "a red circle on a blue background", "width": 64, "height": 64, "steps": 4, **body}
    response = api.post("/api/v1/jobs", payload, format="json")
    assert response.status_code == 202, response.content
    return response.json()


def fetch_png(url: str) -> tuple[Image.Image, object]:
    response = Client().get(url)
    assert response.status_code == 200, url
    body = b"".join(response.streaming_content)
    return Image.open(io.BytesIO(body)), response


def pixels(job_id) -> list[np.ndarray]:
    job = GenerationJob.objects.get(id=job_id)
    out = []
    for image in job.images.order_by("index"):
        from jobs.media.storage import public_storage

        with public_storage().open(image.storage_key, "rb") as f:
            out.append(np.asarray(Image.open(f).convert("RGB")))
    return out


def test_a_submitted_job_is_done_and_its_url_serves_a_png_of_the_requested_size(workers, alice_api):
    job = submit(alice_api, width=96, height=64, seed=7)
    assert job["status"] == "queued"
    assert job["seed"] == 7
    wait_for_status(job["id"], ("done",))
    body = alice_api.get(f"/api/v1/jobs/{job['id']}").json()
    assert body["status"] == "done"
    assert body["progress"] == {"step": 4, "total": 4}
    assert body["batch"]["size"] >= 1
    assert body["started_at"] and body["finished_at"]
    [image] = body["images"]
    assert (image["width"], image["height"], image["seed"], image["index"]) == (96, 64, 7, 0)
    png, response = fetch_png(image["url"])
    assert png.format == "PNG" and png.size == (96, 64)
    assert response["Cache-Control"] == "public, max-age=31536000, immutable"
    assert response["Content-Type"] == "image/png"
    row = GeneratedImage.objects.get(id=image["id"])
    assert row.byte_size > 0 and len(row.sha256) == 64


def test_the_same_seed_gives_identical_pixels_and_a_different_seed_differs(workers, alice_api):
    first = submit(alice_api, seed=1234)
    other = submit(alice_api, seed=1235)
    forget_cache(wait_for_status(first["id"], ("done",)))  # generate the identical request again instead of reusing the stored image
    second = submit(alice_api, seed=1234)
    for job in (second, other):
        wait_for_status(job["id"], ("done",))
    assert GenerationJob.objects.get(id=second["id"]).batch_id is not None
    a, b, c = pixels(first["id"])[0], pixels(second["id"])[0], pixels(other["id"])[0]
    # The first ran in a pass of two, the second alone: a pass's floats vary with its batch at the
    # 1e-6 level (CPU kernels), which can move a pixel by one level. Known, and a regeneration
    # (which compares bytes) can then find its image lost; see docs/design_notes.md's weak points.
    assert np.abs(a.astype(int) - b.astype(int)).max() <= 1 and (a != b).mean() < 0.01
    assert np.abs(a.astype(int) - c.astype(int)).max() > 10


def test_count_three_gives_three_images_with_consecutive_seeds(workers, alice_api):
    job = submit(alice_api, seed=50, count=3)
    wait_for_status(job["id"], ("done",))
    body = alice_api.get(f"/api/v1/jobs/{job['id']}").json()
    assert [(im["index"], im["seed"]) for im in body["images"]] == [(0, 50), (1, 51), (2, 52)]
    forget_cache(job["id"])
    alone = submit(alice_api, seed=51)
    wait_for_status(alone["id"], ("done",))
    # The second image of the count-3 job is the same request as a lone job with seed 51.
    diff = np.abs(pixels(job["id"])[1].astype(int) - pixels(alone["id"])[0].astype(int)).max()
    assert diff <= 3


def test_a_job_without_a_seed_gets_one_stored(workers, alice_api):
    job = submit(alice_api)
    assert 0 <= job["seed"] < 2**32
    assert GenerationJob.objects.get(id=job["id"]).seed == job["seed"]


def test_a_job_whose_generation_raises_ends_failed_with_a_reason(workers, alice_api):
    # 60x60 is on the test menu, but the pipeline only takes multiples of 8: it raises.
    job = submit(alice_api, width=60, height=60)
    done = wait_for_status(job["id"])
    assert done.status == "failed"
    assert "generation failed" in done.reason and "divisible by 8" in done.reason
    assert done.images.count() == 0


def test_cancelling_a_queued_job_means_it_never_runs(workers, alice_api):
    # Admitted to a lane no GPU worker serves, so it is certainly still queued when cancelled.
    with admitted_to("nobody-serves-this"):
        job = submit(alice_api, steps=3, width=96, height=96)
    assert GenerationJob.objects.get(id=job["id"]).scheduled_at is not None  # admitted, waiting
    response = alice_api.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert response.status_code == 202
    assert response.json()["status"] == "cancelled"
    # No worker serves its lane: nothing can start it; the row and the scheduler agree it is gone.
    from jobs.actions import shape_of
    from scheduling import scheduler

    row = GenerationJob.objects.get(id=job["id"])
    assert not scheduler.is_enqueued(shape_of(row), str(row.id), 1, owner=str(row.owner_id), tier=scheduler.tier_of(row.priority))
    assert row.status == "cancelled"
    assert row.started_at is None and row.batch_id is None
    assert row.images.count() == 0
    again = alice_api.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 409
    assert again.json()["status"] == "cancelled"
