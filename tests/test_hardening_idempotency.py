"""Issue 28, item 12: a key reserved by a web process that died mid-submit (a row without a
job) is taken over by the next request with it after a short bound, instead of answering 409
for a day; a reservation younger than the bound is still waited on."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.api.idempotency import body_digest
from jobs.models import GenerationJob, IdempotencyKey

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {"prompt": "a red circle on a blue background", "width": 64, "height": 64, "steps": 2}


def crashed_reservation(user, key: str, age_seconds: float) -> IdempotencyKey:
    """What a web process killed between reserving the key and making the job leaves behind."""
    return IdempotencyKey.objects.create(user=user, scope="jobs", key=key, body_sha256=body_digest(BODY),
                                         created_at=timezone.now() - timedelta(seconds=age_seconds))


def test_a_reservation_left_by_a_crash_is_taken_over_after_the_bound(alice, alice_api, settings):
    settings.IMAGEGEN_IDEMPOTENCY_TAKEOVER_SECONDS = 30
    crashed_reservation(alice, "order-crash", age_seconds=31)
    started = time.monotonic()
    response = alice_api.post("/api/v1/jobs", BODY, format="json", HTTP_IDEMPOTENCY_KEY="order-crash")
    assert response.status_code == 202, response.content
    assert time.monotonic() - started < 20  # taken over at once, not after the 30 s bound
    job_id = response.json()["id"]
    assert IdempotencyKey.objects.get(key="order-crash").job_id is not None
    again = alice_api.post("/api/v1/jobs", BODY, format="json", HTTP_IDEMPOTENCY_KEY="order-crash")
    assert again.status_code == 200 and again.json()["id"] == job_id
    assert GenerationJob.objects.filter(owner=alice).count() == 1


def test_another_body_on_an_abandoned_key_is_still_422(alice, alice_api):
    crashed_reservation(alice, "order-crash-2", age_seconds=3600)
    response = alice_api.post("/api/v1/jobs", {**BODY, "steps": 3}, format="json", HTTP_IDEMPOTENCY_KEY="order-crash-2")
    assert response.status_code == 422
