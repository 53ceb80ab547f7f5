"""Per-user limits that hold under concurrency and abuse (issue 18, items 1-3): the in-flight and
daily-image limits are one atomic step with the insert, the daily quota counts the GPU work
claimed (never given back by a delete), prompt checks are counted against a rate (blocked ones
too), and jobs held for review are bounded per user."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import pytest
from django.conf import settings

from jobs.models import GenerationJob
from tests.conftest import make_user, wait_for_status
from tests.live_server import start_daphne, stop_daphne

pytestmark = pytest.mark.django_db(transaction=True)

BLOCKED = "a pile of bloody gore and severed limbs"
HELD = "a red heart on a white background"


def concurrent_posts(base_url: str, token: str, bodies: list[dict]) -> list[int]:
    """POST every body at once (a barrier releases the threads together); the status codes. A
    429 must be an admission limit's, never `server_busy` (the server under test waits as long as
    it takes for a thread, see LIMITS_ONLY)."""
    barrier = threading.Barrier(len(bodies))

    def one(body: dict) -> int:
        with httpx.Client(base_url=base_url, headers={"Authorization": f"Token {token}"}, timeout=120) as client:
            barrier.wait()
            response = client.post("/api/v1/jobs", json=body)
            if response.status_code == 429:
                assert response.json()["limit"] in ("jobs_in_flight", "images_per_day"), response.json()
            return response.status_code

    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


# What a burst may be refused for here is the limits alone: a request waits for a web thread and a
# Redis connection as long as it takes (the defaults answer 429 server_busy after 2 s, which forty
# requests at once on a loaded 2-core machine passed: CI saw 8 accepted instead of 16).
LIMITS_ONLY = {"IMAGEGEN_WEB_QUEUE_TIMEOUT": "600", "IMAGEGEN_WEB_BACKLOG": "100", "IMAGEGEN_REDIS_POOL_TIMEOUT": "600"}


# --- 1. atomic limits -------------------------------------------------------------------------


def test_forty_concurrent_submits_never_pass_the_in_flight_or_the_daily_limit(worker_env, transactional_db):
    # The prompt checks go to a queue nobody consumes: every accepted job stays in flight.
    env = {**worker_env, **LIMITS_ONLY, "IMAGEGEN_QUEUE_CPU": "limits-nobody", "IMAGEGEN_USER_MAX_IN_FLIGHT": "16",
           "IMAGEGEN_USER_MAX_IMAGES_PER_DAY": "24"}
    server = start_daphne(env, settings.VAR_DIR, name="daphne-limits", collectstatic=False)
    try:
        alice, bob = make_user("alice"), make_user("bob")
        codes = concurrent_posts(server.url, alice.auth_token.key,
                                 [{"prompt": f"a red circle {i}", "seed": i, "steps": 2} for i in range(40)])
        assert set(codes) <= {202, 429}, codes
        assert codes.count(202) == 16, codes
        assert GenerationJob.objects.filter(owner=alice).count() == 16
        # count 2 each: the daily limit (24 images) binds before the in-flight one (16 jobs)
        codes = concurrent_posts(server.url, bob.auth_token.key,
                                 [{"prompt": f"a blue square {i}", "seed": i, "steps": 2, "count": 2} for i in range(40)])
        assert set(codes) <= {202, 429}, codes
        assert codes.count(202) == 12, codes
        assert sum(GenerationJob.objects.filter(owner=bob).values_list("count", flat=True)) == 24
    finally:
        stop_daphne(server)


# --- 2. the quota counts GPU work claimed ------------------------------------------------------


def test_deleting_delivered_jobs_gives_no_quota_back(workers, alice_api, settings):
    settings.IMAGEGEN_USER_MAX_IMAGES_PER_DAY = 3
    ids = []
    for i in range(3):
        response = alice_api.post("/api/v1/jobs", {"prompt": f"a green circle {i}", "seed": 50 + i, "steps": 2}, format="json")
        assert response.status_code == 202, response.content
        ids.append(response.json()["id"])
    for job_id in ids:
        wait_for_status(job_id, ("done",))
    more = {"prompt": "a green circle again", "seed": 99, "steps": 2}
    refused = alice_api.post("/api/v1/jobs", more, format="json")
    assert refused.status_code == 429 and refused.json()["limit"] == "images_per_day"
    for job_id in ids:
        assert alice_api.delete(f"/api/v1/jobs/{job_id}").status_code == 204
    again = alice_api.post("/api/v1/jobs", more, format="json")
    assert again.status_code == 429, "deleting delivered jobs gave the quota back"
    assert again.json()["limit"] == "images_per_day"


def test_a_job_cancelled_mid_run_is_charged_and_one_cancelled_before_it_ran_is_not(workers, alice_api, settings, monkeypatch):
    settings.IMAGEGEN_USER_MAX_IMAGES_PER_DAY = 4
    from jobs.realtime.events import last_state

    running = alice_api.post("/api/v1/jobs", {"prompt": "a long yellow circle", "seed": 5, "steps": 150, "count": 2},
                             format="json").json()
    deadline = time.monotonic() + 60
    while (last_state(running["id"]) or {}).get("step", 0) < 3:  # the worker's progress, every step
        assert time.monotonic() < deadline, GenerationJob.objects.get(id=running["id"]).status
        time.sleep(0.02)
    assert alice_api.post(f"/api/v1/jobs/{running['id']}/cancel").status_code == 202
    monkeypatch.setattr("jobs.pipeline.stages.send", lambda stage, *args, countdown=None: True)  # never leaves the queue
    never = alice_api.post("/api/v1/jobs", {"prompt": "a purple square", "seed": 6, "steps": 2, "count": 2}, format="json")
    assert never.status_code == 202
    assert alice_api.post(f"/api/v1/jobs/{never.json()['id']}/cancel").status_code == 202
    # charged: the 2 images claimed by the cancelled run; refunded: the 2 that never started
    over = alice_api.post("/api/v1/jobs", {"prompt": "a white cat", "seed": 7, "steps": 2, "count": 3}, format="json")
    assert over.status_code == 429 and over.json()["limit"] == "images_per_day", "the cancelled run charged nothing"
    fits = alice_api.post("/api/v1/jobs", {"prompt": "a white cat", "seed": 7, "steps": 2, "count": 2}, format="json")
    assert fits.status_code == 202, fits.content


# --- 3. refusals cost something too ------------------------------------------------------------


def test_prompt_checks_are_counted_per_user_against_a_rate_blocked_ones_included(workers, alice_api, bob_api, settings):
    settings.IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE = 5
    long_blocked = (BLOCKED + ", ") * 50
    body = {"prompt": long_blocked[:2000], "steps": 2}
    ids = []
    for i in range(5):
        response = alice_api.post("/api/v1/jobs", {**body, "seed": i}, format="json")
        assert response.status_code == 202, response.content
        ids.append(response.json()["id"])
    for job_id in ids:
        assert wait_for_status(job_id, ("blocked",)).blocked_stage == "prompt"
    refused = alice_api.post("/api/v1/jobs", {**body, "seed": 9}, format="json")
    assert refused.status_code == 429, "blocked prompts cost the user nothing"
    assert refused.json()["limit"] == "prompt_checks" and int(refused["Retry-After"]) >= 1
    assert bob_api.post("/api/v1/jobs", {**body, "seed": 9}, format="json").status_code == 202  # per user


def test_jobs_held_for_review_are_bounded_per_user(alice_api, bob_api, settings, stay_queued):
    from jobs.pipeline.tasks import check_prompt

    settings.IMAGEGEN_USER_MAX_IN_REVIEW = 3
    # all five pass the submit-time bound before any is checked; the gate keeps the bound
    ids = [alice_api.post("/api/v1/jobs", {"prompt": HELD, "seed": i, "steps": 2}, format="json").json()["id"] for i in range(5)]
    for job_id in ids:
        check_prompt.run(job_id)
    statuses = [GenerationJob.objects.get(id=job_id).status for job_id in ids]
    assert statuses == ["review"] * 3 + ["blocked"] * 2, statuses
    over = GenerationJob.objects.get(id=ids[-1])
    assert "review" in over.reason and over.blocked_stage == "prompt"
    # ordinary prompts still go through; appeals would add cases, so they wait too
    assert alice_api.post("/api/v1/jobs", {"prompt": "a red circle", "seed": 9, "steps": 2}, format="json").status_code == 202
    appeal = alice_api.post(f"/api/v1/jobs/{over.id}/appeal", {"note": "it is a heart"}, format="json")
    assert appeal.status_code == 429 and appeal.json()["limit"] == "held_for_review"
    assert bob_api.post("/api/v1/jobs", {"prompt": HELD, "seed": 1, "steps": 2}, format="json").status_code == 202
