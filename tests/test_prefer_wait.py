"""`Prefer: wait=N` (RFC 7240) on POST /api/v1/jobs: the finished job when it ends within N
seconds, the usual 202 otherwise; the job goes on either way."""

from __future__ import annotations

import time

import pytest

from tests.conftest import admitted_to, wait_for_status

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {"prompt": "a green square on a white background", "width": 64, "height": 64, "steps": 2}


def test_a_fast_job_is_answered_200_with_its_images(workers, alice_api):
    response = alice_api.post("/api/v1/jobs", {**BODY, "seed": 7001}, format="json", HTTP_PREFER="wait=60")
    assert response.status_code == 200, response.content
    job = response.json()
    assert job["status"] == "done" and len(job["images"]) == 1
    assert response["Preference-Applied"] == "wait=10"  # capped by IMAGEGEN_PREFER_WAIT_MAX


def test_a_job_that_does_not_end_in_time_is_answered_202_and_goes_on(alice_api, settings):
    settings.IMAGEGEN_PREFER_WAIT_MAX = 120  # a wait past the one asked would take longer than the bound below
    with admitted_to("nobody-serves-prefer"):
        started = time.monotonic()
        response = alice_api.post("/api/v1/jobs", {**BODY, "seed": 7002}, format="json", HTTP_PREFER="wait=1")
        took = time.monotonic() - started
    assert response.status_code == 202 and response["Preference-Applied"] == "wait=1"
    assert 0.9 <= took < 60, took
    assert response.json()["status"] in ("queued", "running")
    assert wait_for_status(response.json()["id"], ("queued",), timeout=5).status == "queued"  # not cancelled


@pytest.mark.parametrize("header", ["", "respond-async", "wait=soon", "wait=-3", "wait=nan", "handling=lenient"])
def test_without_a_valid_wait_the_answer_is_the_usual_202_at_once(alice_api, header, settings):
    settings.IMAGEGEN_PREFER_WAIT_MAX = 120  # a wait applied by mistake would pass the bound below
    with admitted_to("nobody-serves-prefer"):
        started = time.monotonic()
        response = alice_api.post("/api/v1/jobs", {**BODY, "seed": 7003}, format="json", HTTP_PREFER=header)
    assert response.status_code == 202 and "Preference-Applied" not in response
    assert time.monotonic() - started < 60
