"""The REST API's contract: validation, authentication, tenancy, listing, tokens."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from jobs.models import GenerationJob
from tests.conftest import make_user

pytestmark = pytest.mark.django_db(transaction=True)

GOOD = {"prompt": "a green square", "width": 64, "height": 64, "steps": 4}


@pytest.fixture(autouse=True)
def _no_broker_needed(stay_queued):
    """These tests are about the API alone: the prompt check is not sent."""


@pytest.mark.parametrize(
    "body, field, words",
    [
        ({"width": 64, "height": 64}, "prompt", "required"),
        ({**GOOD, "prompt": ""}, "prompt", "blank"),
        ({**GOOD, "prompt": "x" * 2001}, "prompt", "2000"),
        ({**GOOD, "prompt": "a\x00b"}, "prompt", "Null"),
        ({**GOOD, "width": 512, "height": 512}, "width", "size menu"),
        ({**GOOD, "width": 64, "height": 65}, "height", "size menu"),
        ({**GOOD, "width": -64}, "width", "greater than or equal"),
        ({**GOOD, "width": "wide"}, "width", "valid integer"),
        ({**GOOD, "steps": 0}, "steps", "greater than or equal to 1"),
        ({**GOOD, "steps": 151}, "steps", "less than or equal to 150"),
        ({**GOOD, "seed": -1}, "seed", "greater than or equal to 0"),
        ({**GOOD, "seed": 2**32}, "seed", "less than or equal to 4294967295"),
        ({**GOOD, "count": 9}, "count", "less than or equal to 8"),
        ({**GOOD, "count": 0}, "count", "greater than or equal to 1"),
        ({**GOOD, "guidance_scale": 31}, "guidance_scale", "less than or equal to 30"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_why(alice_api, body, field, words):
    response = alice_api.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()
    assert field in errors, errors
    assert words.lower() in " ".join(errors[field]).lower()
    assert GenerationJob.objects.count() == 0


@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity", b"1e309"])
def test_a_non_finite_guidance_scale_is_a_400(alice_api, value):
    raw = b'{"prompt": "a cat", "guidance_scale": ' + value + b"}"
    response = alice_api.generic("POST", "/api/v1/jobs", raw, content_type="application/json")
    assert response.status_code == 400
    body = response.json()
    # The JSON parser refuses NaN/Infinity itself; 1e309 parses to inf and the field refuses it.
    assert "guidance_scale" in body or "not JSON compliant" in body["detail"]


def test_a_lone_surrogate_in_the_prompt_is_a_400(alice_api):
    raw = b'{"prompt": "a \\ud800 b", "width": 64, "height": 64}'
    response = alice_api.generic("POST", "/api/v1/jobs", raw, content_type="application/json")
    assert response.status_code == 400
    assert "surrogate" in " ".join(response.json()["prompt"]).lower()


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"null", b'"text"', b"{\"prompt\": {\"a\": 1}}"])
def test_malformed_bodies_are_400_not_500(alice_api, raw):
    response = alice_api.generic("POST", "/api/v1/jobs", raw, content_type="application/json")
    assert response.status_code == 400
    assert GenerationJob.objects.count() == 0


def test_a_valid_job_is_accepted_with_defaults_and_the_full_job_json(alice_api):
    response = alice_api.post("/api/v1/jobs", {"prompt": "  a green square  "}, format="json")
    assert response.status_code == 202
    job = response.json()
    for key in (
        "id", "status", "prompt", "negative_prompt", "width", "height", "steps", "seed", "count",
        "guidance_scale", "model", "created_at", "started_at", "finished_at", "progress", "reason",
        "images", "events_url", "websocket_url",
    ):
        assert key in job
    assert job["prompt"] == "a green square"
    assert (job["width"], job["height"], job["count"], job["status"]) == (64, 64, 1, "queued")
    assert job["events_url"] == f"/api/v1/jobs/{job['id']}/events"
    assert job["websocket_url"] == f"/ws/jobs/{job['id']}/"


def test_no_credentials_is_401_and_a_bad_token_too():
    assert APIClient().post("/api/v1/jobs", GOOD, format="json").status_code == 401
    assert APIClient().get("/api/v1/jobs").status_code == 401
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert bad.get("/api/v1/jobs").status_code == 401


def test_bob_cannot_see_list_or_cancel_alices_job(alice_api, bob_api):
    job = alice_api.post("/api/v1/jobs", GOOD, format="json").json()
    assert bob_api.get(f"/api/v1/jobs/{job['id']}").status_code == 404
    assert bob_api.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 404
    assert bob_api.get(f"/api/v1/jobs/{job['id']}/events").status_code == 404
    assert bob_api.get("/api/v1/jobs").json()["results"] == []
    assert GenerationJob.objects.get(id=job["id"]).status == "queued"


def test_the_list_is_the_callers_own_newest_first_and_paginated(alice_api, bob_api):
    ids = [alice_api.post("/api/v1/jobs", {**GOOD, "seed": i}, format="json").json()["id"] for i in range(5)]
    bob_api.post("/api/v1/jobs", GOOD, format="json")
    page = alice_api.get("/api/v1/jobs?page_size=2").json()
    assert [j["id"] for j in page["results"]] == ids[::-1][:2]
    following = alice_api.get(page["next"]).json()
    assert [j["id"] for j in following["results"]] == ids[::-1][2:4]


def test_cancel_of_a_queued_job_answers_202_and_a_second_cancel_409(alice_api):
    job = alice_api.post("/api/v1/jobs", GOOD, format="json").json()
    response = alice_api.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert response.status_code == 202
    assert response.json()["status"] == "cancelled"
    again = alice_api.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 409 and again.json()["status"] == "cancelled"


def test_an_unknown_job_id_is_404(alice_api):
    assert alice_api.get("/api/v1/jobs/00000000-0000-0000-0000-000000000000").status_code == 404
    assert alice_api.get("/api/v1/jobs/not-a-uuid").status_code == 404


def test_issue_token_creates_the_user_and_prints_the_token_last(capsys, transactional_db):
    call_command("issue_token", "carol")
    token = capsys.readouterr().out.strip().splitlines()[-1]
    from django.contrib.auth import get_user_model

    assert get_user_model().objects.filter(username="carol").exists()
    first = APIClient()
    first.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert first.get("/api/v1/jobs").status_code == 200
    call_command("issue_token", "carol", "--rotate")
    rotated = capsys.readouterr().out.strip().splitlines()[-1]
    assert rotated != token
    revoked = APIClient()
    revoked.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert revoked.get("/api/v1/jobs").status_code == 401
    fresh = APIClient()
    fresh.credentials(HTTP_AUTHORIZATION=f"Token {rotated}")
    assert fresh.get("/api/v1/jobs").status_code == 200


def test_healthz_answers_without_credentials():
    response = APIClient().get("/healthz")
    assert response.status_code == 200


def test_a_users_web_session_can_submit_with_csrf(transactional_db):
    make_user("dora")
    client = APIClient(enforce_csrf_checks=True)
    assert client.login(username="dora", password="dora-pw")
    # A session-authenticated write without the CSRF token is refused.
    assert client.post("/api/v1/jobs", GOOD, format="json").status_code == 403
