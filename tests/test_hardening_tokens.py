"""Issue 28, item 10: tokens a user can manage (list, issue with an expiry, revoke one through
the API; the admin lists them with their last use and revokes), and a script's websocket (a
token header, no Origin) is accepted while a browser's cross-origin socket is still refused."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.access import tokens
from jobs.models import ApiToken
from tests.conftest import make_user
from tests.test_security import HOST, ORIGIN, make_job

pytestmark = pytest.mark.django_db(transaction=True)


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def test_a_user_issues_lists_and_revokes_one_token_through_the_api(alice, alice_api, bob_api):
    issued = alice_api.post("/api/v1/account/tokens", {"name": "ci", "expires_in_days": 7}, format="json")
    assert issued.status_code == 201, issued.content
    body = issued.json()
    assert body["token"].startswith("ig_") and body["name"] == "ci"
    assert timedelta(days=6) < timezone.datetime.fromisoformat(body["expires_at"]) - timezone.now() <= timedelta(days=7)
    assert bearer(body["token"]).get("/api/v1/jobs").status_code == 200
    listed = alice_api.get("/api/v1/account/tokens").json()
    assert {row["id"] for row in listed} == set(ApiToken.objects.filter(user=alice).values_list("id", flat=True))
    assert all("token" not in row and "digest" not in row for row in listed)
    used = next(row for row in listed if row["id"] == body["id"])
    assert used["last_used_at"] is not None
    # Bob cannot revoke Alice's token; Alice can, and only that one stops working.
    assert bob_api.delete(f"/api/v1/account/tokens/{body['id']}").status_code == 404
    assert alice_api.delete(f"/api/v1/account/tokens/{body['id']}").status_code == 204
    assert bearer(body["token"]).get("/api/v1/jobs").status_code == 401
    assert alice_api.get("/api/v1/jobs").status_code == 200  # her other token still works
    assert alice_api.delete(f"/api/v1/account/tokens/{body['id']}").status_code == 404


def test_a_bad_expiry_is_400_naming_the_field(alice_api):
    response = alice_api.post("/api/v1/account/tokens", {"expires_in_days": 0}, format="json")
    assert response.status_code == 400 and "expires_in_days" in response.json()


def test_an_expired_token_is_refused(alice):
    token = tokens.issue(alice, "old", expires_at=timezone.now() - timedelta(seconds=1))
    assert bearer(token).get("/api/v1/jobs").status_code == 401
    fresh = tokens.issue(alice, "new", expires_at=timezone.now() + timedelta(hours=1))
    assert bearer(fresh).get("/api/v1/jobs").status_code == 200


def test_the_admin_lists_tokens_with_their_last_use_and_revokes_one(alice):
    root = make_user("root", is_staff=True, is_superuser=True)
    admin = Client()
    admin.force_login(root)
    row = ApiToken.objects.filter(user=alice).first()
    page = admin.get("/admin/jobs/apitoken/")
    assert page.status_code == 200
    assert row.prefix.encode() in page.content and b"Last used at" in page.content
    assert admin.get("/admin/jobs/apitoken/add/").status_code == 403
    done = admin.post("/admin/jobs/apitoken/", {"action": "revoke", "_selected_action": [row.id]})
    assert done.status_code == 302
    assert not ApiToken.objects.filter(id=row.id).exists()
    assert bearer(alice.auth_token.key).get("/api/v1/jobs").status_code == 401


def _connects(job_id, *headers) -> bool:
    from channels.testing import WebsocketCommunicator

    from imagegen.asgi import application

    async def go() -> bool:
        ws = WebsocketCommunicator(application, f"/ws/jobs/{job_id}/", headers=[HOST, *headers])
        try:
            connected, _ = await ws.connect(timeout=60)
        except TimeoutError:
            connected = False
        await ws.disconnect()
        return connected

    return asyncio.run(go())


def test_a_script_with_a_token_and_no_origin_may_open_a_websocket(alice, bob):
    job = make_job(alice)
    token = (b"authorization", f"Token {alice.auth_token.key}".encode())
    assert _connects(job.id, token)  # a script: no Origin
    assert _connects(job.id, ORIGIN, token)  # the page's own origin
    assert not _connects(job.id, (b"origin", b"http://evil.example"), token)  # a browser on another site
    assert not _connects(job.id, (b"authorization", f"Token {bob.auth_token.key}".encode()))  # not the owner
    assert not _connects(job.id, (b"authorization", b"Token not-a-token"))
    assert not _connects(job.id)  # neither Origin nor token
