"""Issue 44, item 7: tokens have scopes. A token made by a token cannot outlive it or exceed its
scope; a user's tokens are capped; reading or rotating the webhook secret and managing tokens
need a full-scope token or a session; the admin's revoke needs the change permission."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.access import tokens
from jobs.models import ApiToken
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


def client(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return api


def _expires(body: dict):
    return timezone.datetime.fromisoformat(body["expires_at"]) if body["expires_at"] else None


def test_a_token_made_by_a_token_cannot_outlive_it():
    user = make_user("scope-outlive")
    day = client(tokens.issue(user, "one day", expires_at=timezone.now() + timedelta(days=1)))
    forever = day.post("/api/v1/account/tokens", {"name": "forever"}, format="json")
    assert forever.status_code == 201, forever.content
    assert _expires(forever.json()) is not None and _expires(forever.json()) <= timezone.now() + timedelta(days=1)
    longer = day.post("/api/v1/account/tokens", {"expires_in_days": 30}, format="json")
    assert longer.status_code == 400 and "expires_in_days" in longer.json(), longer.content
    # A session (or a token without expiry) may still issue one that never expires.
    session = APIClient()
    session.force_login(user)
    assert _expires(session.post("/api/v1/account/tokens", {}, format="json").json()) is None


def test_a_jobs_scope_token_submits_and_reads_but_cannot_manage_tokens_or_the_webhook_secret():
    user = make_user("scope-jobs")
    full = client(tokens.issue(user, "full"))
    held = ApiToken.objects.filter(user=user).count()
    issued = full.post("/api/v1/account/tokens", {"name": "ci", "scope": "jobs"}, format="json")
    assert issued.status_code == 201 and issued.json()["scope"] == "jobs", issued.content
    jobs = client(issued.json()["token"])
    assert jobs.get("/api/v1/jobs").status_code == 200
    account = jobs.get("/api/v1/account")
    assert account.status_code == 200 and account.json()["webhook_secret"] is None
    assert full.get("/api/v1/account").json()["webhook_secret"].startswith("whsec_")
    for method, path in (("post", "/api/v1/account/webhook-secret"), ("get", "/api/v1/account/tokens"),
                         ("post", "/api/v1/account/tokens"), ("delete", f"/api/v1/account/tokens/{issued.json()['id']}")):
        refused = getattr(jobs, method)(path, {}, format="json")
        assert refused.status_code == 403 and "scope" in refused.json()["detail"], (method, path, refused.content)
    assert ApiToken.objects.filter(user=user).count() == held + 1  # nothing issued by the refused calls
    assert full.post("/api/v1/account/tokens", {"scope": "admin"}, format="json").status_code == 400


def test_a_users_tokens_are_capped(settings):
    user = make_user("scope-cap")
    full = client(tokens.issue(user, "first"))
    settings.IMAGEGEN_USER_MAX_TOKENS = ApiToken.objects.filter(user=user).count() + 2
    assert [full.post("/api/v1/account/tokens", {}, format="json").status_code for _ in range(3)] == [201, 201, 409]
    refused = full.post("/api/v1/account/tokens", {}, format="json")
    limit = settings.IMAGEGEN_USER_MAX_TOKENS
    assert str(limit) in refused.json()["detail"] and ApiToken.objects.filter(user=user).count() == limit
    ApiToken.objects.filter(user=user).exclude(name="first").first().delete()
    assert full.post("/api/v1/account/tokens", {}, format="json").status_code == 201


def test_the_admins_revoke_needs_the_change_permission():
    owner = make_user("scope-owner")
    row = tokens.issue_row(owner, "t")[1]
    viewer = make_user("scope-viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_apitoken"))
    admin = Client()
    admin.force_login(viewer)
    assert admin.get("/admin/jobs/apitoken/").status_code == 200
    admin.post("/admin/jobs/apitoken/", {"action": "revoke", "_selected_action": [row.id]})
    assert ApiToken.objects.filter(id=row.id).exists(), "a viewer revoked a token"
    viewer.user_permissions.add(Permission.objects.get(codename="change_apitoken"))
    admin.post("/admin/jobs/apitoken/", {"action": "revoke", "_selected_action": [row.id]})
    assert not ApiToken.objects.filter(id=row.id).exists()
