"""Security (issue 11, scenario 8): tenants are isolated on every route (REST, SSE, websocket,
images), private quarantine objects need staff with the review permission, CSRF guards
session-authenticated writes, websockets check the Origin, the review queue needs its
permission, and tokens can be revoked. In-process; no workers needed."""

from __future__ import annotations

import asyncio
import io

import pytest
from django.core.files.base import ContentFile
from django.core.management import call_command
from django.test import Client
from rest_framework.test import APIClient

from jobs.media.storage import new_image_key, public_storage, quarantine_storage
from jobs.models import FIRST_STAGE, GeneratedImage, GenerationJob
from tests.conftest import client_for, make_user

pytestmark = pytest.mark.django_db(transaction=True)

HOST = (b"host", b"127.0.0.1:8000")
ORIGIN = (b"origin", b"http://127.0.0.1:8000")
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


def make_job(owner, status="done", **extra) -> GenerationJob:
    return GenerationJob.objects.create(
        owner=owner, prompt="a red circle", width=64, height=64, steps=2, guidance_scale=5.0, seed=1,
        model_version="tiny-random", stage=FIRST_STAGE[status], progress_total=2, **extra,
    )


def make_image(job, tier: str) -> GeneratedImage:
    storage = public_storage() if tier == "public" else quarantine_storage()
    key = storage.save(new_image_key(), ContentFile(PNG))
    return GeneratedImage.objects.create(job=job, index=0, seed=job.seed, storage_key=key, width=64, height=64,
                                         byte_size=len(PNG), sha256="0" * 64, tier=tier)


# --- tenants ------------------------------------------------------------------------------


def test_another_users_job_is_404_on_every_rest_route_and_survives(alice, bob, bob_api):
    done = make_job(alice)
    blocked = make_job(alice, status="blocked", blocked_stage="prompt", reason="gore")
    queued = make_job(alice, status="queued")
    for job in (done, blocked, queued):
        assert bob_api.get(f"/api/v1/jobs/{job.id}").status_code == 404
        assert bob_api.post(f"/api/v1/jobs/{job.id}/cancel").status_code == 404
        assert bob_api.post(f"/api/v1/jobs/{job.id}/appeal", {"note": "mine"}, format="json").status_code == 404
        assert bob_api.delete(f"/api/v1/jobs/{job.id}").status_code == 404
        assert bob_api.get(f"/api/v1/jobs/{job.id}/events").status_code == 404
    assert bob_api.get("/api/v1/jobs").json()["results"] == []
    assert GenerationJob.objects.filter(owner=alice).count() == 3
    assert GenerationJob.objects.get(id=queued.id).status == "queued"
    assert GenerationJob.objects.get(id=blocked.id).appealed_at is None


def test_another_users_image_is_404_and_its_owner_gets_it(alice, bob, alice_api, bob_api):
    image = make_image(make_job(alice), "public")
    assert bob_api.get(f"/api/v1/images/{image.id}").status_code == 404
    assert alice_api.get(f"/api/v1/images/{image.id}").status_code == 200


def test_no_route_answers_without_credentials(alice):
    job = make_job(alice)
    anon = APIClient()
    for method, path in [("get", "/api/v1/jobs"), ("post", "/api/v1/jobs"), ("get", f"/api/v1/jobs/{job.id}"),
                         ("post", f"/api/v1/jobs/{job.id}/cancel"), ("delete", f"/api/v1/jobs/{job.id}"),
                         ("get", f"/api/v1/jobs/{job.id}/events"), ("get", "/api/v1/queue")]:
        assert getattr(anon, method)(path).status_code == 401, (method, path)


def _ws(job_id, *headers):
    from channels.testing import WebsocketCommunicator

    from imagegen.asgi import application

    return WebsocketCommunicator(application, f"/ws/jobs/{job_id}/", headers=[HOST, *headers])


def _token(user) -> tuple[bytes, bytes]:
    return (b"authorization", f"Token {user.auth_token.key}".encode())


async def _connects(job_id, *headers) -> bool:
    ws = _ws(job_id, *headers)
    try:
        connected, _ = await ws.connect(timeout=60)
    except TimeoutError:
        connected = False
    await ws.disconnect()
    return connected


def test_websocket_refuses_another_user_a_foreign_origin_and_no_credentials(alice, bob):
    job = make_job(alice, status="running")
    assert asyncio.run(_connects(job.id, ORIGIN, _token(alice)))
    assert not asyncio.run(_connects(job.id, ORIGIN, _token(bob)))
    assert not asyncio.run(_connects(job.id, ORIGIN))
    assert not asyncio.run(_connects(job.id, ORIGIN, (b"authorization", b"Token not-a-token")))
    assert not asyncio.run(_connects(job.id, (b"origin", b"http://evil.example"), _token(alice)))
    assert not asyncio.run(_connects(job.id, (b"origin", b"null"), _token(alice)))


# --- private objects ----------------------------------------------------------------------


def test_quarantined_images_are_never_served_publicly_and_only_to_moderators(alice, moderator):
    job = make_job(alice, status="blocked", blocked_stage="image", reason="flagged")
    image = make_image(job, "quarantine")
    anon = Client()
    assert anon.get(f"/media/{image.storage_key}").status_code == 404
    assert client_for(alice).get(f"/api/v1/jobs/{job.id}").json()["images"] == []
    assert client_for(alice).get(f"/api/v1/images/{image.id}").status_code == 404
    staff_without_perm = make_user("staffer", is_staff=True)
    for user in (None, alice, staff_without_perm):
        client = Client()
        if user is not None:
            client.force_login(user)
        assert client.get(f"/staff/images/{image.id}").status_code == 404, user
    client = Client()
    client.force_login(moderator)
    response = client.get(f"/staff/images/{image.id}")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == PNG
    assert response["Cache-Control"] == "private, no-store"


def test_a_public_key_in_the_quarantine_folder_name_is_not_served(alice):
    # The same key name under the public URL: serve_image only serves rows in the public tier.
    image = make_image(make_job(alice), "quarantine")
    public_storage().save(image.storage_key, ContentFile(PNG))  # even if the bytes were there
    assert Client().get(f"/media/{image.storage_key}").status_code == 404


# --- CSRF and the review queue -------------------------------------------------------------


def test_csrf_is_enforced_on_session_authenticated_writes(alice):
    job = make_job(alice, status="queued")
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    body = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 2}
    before = GenerationJob.objects.count()
    assert client.post("/api/v1/jobs", body, content_type="application/json").status_code == 403
    assert client.post(f"/api/v1/jobs/{job.id}/cancel").status_code == 403
    assert client.delete(f"/api/v1/jobs/{job.id}").status_code == 403
    assert GenerationJob.objects.count() == before and GenerationJob.objects.get(id=job.id).status == "queued"
    # reads need no token; with the page's token the write goes through
    assert client.get("/api/v1/jobs").status_code == 200
    client.get("/")
    token = client.cookies["csrftoken"].value
    response = client.post(f"/api/v1/jobs/{job.id}/cancel", content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 202


def test_the_review_queue_requires_the_review_permission(alice, moderator):
    staff = make_user("staffer", is_staff=True)
    anon = Client()
    assert anon.get("/admin/safety/reviewcase/").status_code == 302
    for user in (alice, staff):
        client = Client()
        client.force_login(user)
        assert client.get("/admin/safety/reviewcase/").status_code in (302, 403), user
    client = Client()
    client.force_login(moderator)
    assert client.get("/admin/safety/reviewcase/").status_code == 200


# --- tokens ---------------------------------------------------------------------------------


def test_a_rotated_token_is_revoked_everywhere(alice):
    job = make_job(alice, status="running")
    old = alice.auth_token.key
    assert client_for(alice).get("/api/v1/jobs").status_code == 200
    out = io.StringIO()
    call_command("issue_token", "alice", "--rotate", stdout=out)
    new = out.getvalue().strip().splitlines()[-1]
    assert new != old
    stale = APIClient()
    stale.credentials(HTTP_AUTHORIZATION=f"Token {old}")
    assert stale.get("/api/v1/jobs").status_code == 401
    assert stale.get(f"/api/v1/jobs/{job.id}/events").status_code == 401
    assert not asyncio.run(_connects(job.id, ORIGIN, (b"authorization", f"Token {old}".encode())))
    fresh = APIClient()
    fresh.credentials(HTTP_AUTHORIZATION=f"Token {new}")
    assert fresh.get(f"/api/v1/jobs/{job.id}").status_code == 200


def test_a_deactivated_user_is_refused(alice):
    job = make_job(alice, status="running")
    api = client_for(alice)
    alice.is_active = False
    alice.save()
    assert api.get("/api/v1/jobs").status_code == 401
    assert api.get(f"/api/v1/jobs/{job.id}/events").status_code == 401
    assert not asyncio.run(_connects(job.id, ORIGIN, _token(alice)))
