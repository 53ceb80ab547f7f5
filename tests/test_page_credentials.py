"""The page's "verify" link: GET /api/v1/images/<id>/credentials reads the stored file and
checks its content credentials (C2PA) on the server: who signed it, what it asserts, whether it
verifies. Owner only; a file changed after signing no longer verifies."""

from __future__ import annotations

import io

import pytest

from jobs.media.storage import public_storage
from tests.conftest import wait_for_status
from tests.test_generation import submit

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_images_credentials_verify_on_the_server_for_its_owner_only(workers, alice_api, bob_api):
    job = wait_for_status(submit(alice_api, seed=5, output_format="webp")["id"], ("done",))
    image = job.images.get()
    url = f"/api/v1/images/{image.id}/credentials"

    r = alice_api.get(url)
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["state"], body["verified"], body["trusted"]) == ("Trusted", True, True), body["failures"]
    assert body["signer"]["common_name"] and body["signer"]["issuer"]
    assert body["actions"][0]["action"] == "c2pa.created"
    assert body["actions"][0]["digitalSourceType"].endswith("/trainedAlgorithmicMedia")
    assert body["parameters"]["jobId"] == str(job.id) and body["parameters"]["seed"] == 5
    assert body["parameters"]["modelVersion"] == job.model_version

    assert bob_api.get(url).status_code == 404  # not his image
    assert alice_api.get("/api/v1/images/00000000-0000-0000-0000-000000000000/credentials").status_code == 404

    # The stored file changed after it was signed: the server says it no longer verifies.
    storage = public_storage()
    with storage.open(image.storage_key, "rb") as fh:
        data = bytearray(fh.read())
    data[-40] ^= 0xFF
    storage.delete(image.storage_key)
    storage.save(image.storage_key, io.BytesIO(bytes(data)))
    body = alice_api.get(url).json()
    assert body["state"] != "Trusted" and body["verified"] is False and body["failures"]


def test_a_deleted_job_has_no_credentials_to_show(workers, alice_api):
    job = wait_for_status(submit(alice_api, seed=6)["id"], ("done",))
    image = job.images.get()
    assert alice_api.delete(f"/api/v1/jobs/{job.id}").status_code == 204
    assert alice_api.get(f"/api/v1/images/{image.id}/credentials").status_code == 404
