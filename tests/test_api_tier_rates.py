"""Scoped request rates (issue 28, item 13): submits, reads and streams each have a rate of their
own, a conditional poll answered 304 costs a tenth, and every answer says where the client
stands (RateLimit-*). Through the HTTP API (Django's test client, the whole middleware and DRF
stack), with the throttle's clock driven so five minutes of polling take seconds."""

from __future__ import annotations

import pytest

from imagegen.redis_client import PREFIX, get_redis
from jobs.access import ratelimit
from tests.test_security import make_job

pytestmark = pytest.mark.django_db(transaction=True)

START = 1_000_000_020.0  # a fixed instant, 20 s into a minute window


@pytest.fixture(autouse=True)
def fresh_counters():
    def clear():
        r = get_redis()
        keys = list(r.scan_iter(f"{PREFIX}rl:*"))
        if keys:
            r.delete(*keys)

    clear()
    yield
    clear()


@pytest.fixture
def clock(monkeypatch):
    now = [START]
    monkeypatch.setattr(ratelimit, "now", lambda: now[0], raising=False)
    return now


@pytest.fixture
def shipped_rates(settings):
    """The shipped defaults (the test settings turn the abuse limits off)."""
    settings.IMAGEGEN_THROTTLE_SUBMIT = "120/min"
    settings.IMAGEGEN_THROTTLE_READ = "600/min"
    settings.IMAGEGEN_THROTTLE_STREAM = "60/min"
    settings.IMAGEGEN_THROTTLE_IP = "600/min"


def test_a_client_polling_two_jobs_every_half_second_for_five_minutes_is_never_refused(alice, alice_api, clock,
                                                                                      shipped_rates):
    jobs = [make_job(alice, status="running", progress_step=1), make_job(alice, status="queued")]
    refused = []
    for tick in range(600):  # 5 minutes, a poll of each job every half second, no If-None-Match
        clock[0] = START + tick * 0.5
        for job in jobs:
            answer = alice_api.get(f"/api/v1/jobs/{job.id}")
            if answer.status_code != 200:
                refused.append((tick, answer.status_code, answer.content[:200]))
    assert refused == [], refused[:3]
    last = alice_api.get(f"/api/v1/jobs/{jobs[0].id}")
    assert last["RateLimit-Limit"] == "600" and last["RateLimit-Policy"] == "600;w=60"
    assert 0 < int(last["RateLimit-Remaining"]) < 600 and 0 <= int(last["RateLimit-Reset"]) <= 60
    # the reads used nothing of the submits: a submit right after is not refused by a rate
    assert alice_api.post("/api/v1/jobs", {"prompt": ""}, format="json").status_code == 400


def test_a_conditional_poll_answered_304_costs_a_tenth_of_a_read(alice, alice_api, clock, settings):
    settings.IMAGEGEN_THROTTLE_READ = "3/min"
    job = make_job(alice)
    first = alice_api.get(f"/api/v1/jobs/{job.id}")
    etag = first["ETag"]
    assert first.status_code == 200 and first["RateLimit-Remaining"] == "2"
    answers = [alice_api.get(f"/api/v1/jobs/{job.id}", HTTP_IF_NONE_MATCH=etag) for _ in range(10)]
    assert [a.status_code for a in answers] == [304] * 10  # ten 304s cost one read
    assert answers[-1]["RateLimit-Remaining"] == "1"
    assert alice_api.get(f"/api/v1/jobs/{job.id}").status_code == 200  # the third read
    over = alice_api.get(f"/api/v1/jobs/{job.id}")
    assert over.status_code == 429 and over.json()["limit"] == "reads_per_user" and int(over["Retry-After"]) >= 1
    assert over["RateLimit-Remaining"] == "0"
    # a conditional read that is not a 304 is charged in full
    clock[0] += 120
    answers = [alice_api.get(f"/api/v1/jobs/{job.id}", HTTP_IF_NONE_MATCH='"stale"').status_code for _ in range(4)]
    assert answers == [200, 200, 200, 429], answers


def test_submits_and_reads_have_rates_of_their_own(alice, alice_api, clock, settings):
    settings.IMAGEGEN_THROTTLE_SUBMIT = "2/min"
    settings.IMAGEGEN_THROTTLE_READ = "4/min"
    posts = [alice_api.post("/api/v1/jobs", {"prompt": ""}, format="json") for _ in range(3)]
    assert [p.status_code for p in posts] == [400, 400, 429]
    assert posts[-1].json()["limit"] == "submits_per_user" and posts[0]["RateLimit-Limit"] == "2"
    reads = [alice_api.get("/api/v1/jobs").status_code for _ in range(5)]
    assert reads == [200] * 4 + [429]
    clock[0] += 120  # both windows slide out
    assert alice_api.get("/api/v1/jobs").status_code == 200
