"""Query budgets of the hot paths (issue 33): a submit and a poll each run a pinned number of
database statements and Redis round trips, so a change that adds one (or one per queued job)
fails here. The budget is the count measured when it was pinned; lower it when you cut one."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.test_security import make_job

pytestmark = pytest.mark.django_db(transaction=True)

# 9 statements with the request-hash cache on (docs/benchmarks.md "Query budget of the hot paths"; 8 with it off, as here:
# 11 before the insert stopped taking a savepoint of its own), plus one when the shape's summary
# entry is stale and the submit recomputes it (the running batches: jobs/admission/summary.py).
SUBMIT_BUDGET = 9
POLL_BUDGET = 2
# Redis round trips of a submit in this process (the broker's publish of the prompt check
# aside): the request-hash cache, its askers and the summary entry in one pipeline; the prompt
# check's rate (a decision, before the insert); every counter and refresh marker in one
# pipeline at the end. Before: 9 with a fresh summary entry, 20 when the submit recomputed it.
SUBMIT_REDIS_BUDGET = 3
# A poll of a queued job: its position and its bucket's summary entry in one pipeline (3 before).
POLL_QUEUED_REDIS_BUDGET = 1


def statements(api, method: str, url: str, **kwargs) -> tuple[int, list[str], object]:
    with CaptureQueriesContext(connection) as captured:
        answer = getattr(api, method)(url, **kwargs)
    return len(captured), [q["sql"][:160] for q in captured.captured_queries], answer


def test_a_submit_stays_within_its_query_budget_whatever_the_backlog(alice, alice_api, stay_queued, settings):
    settings.IMAGEGEN_USER_MAX_IN_FLIGHT = 10_000
    body = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 2}
    alice_api.post("/api/v1/jobs", {**body, "seed": 0}, format="json")  # warm: caches, the served-model table
    n, sql, answer = statements(alice_api, "post", "/api/v1/jobs", data={**body, "seed": 1}, format="json")
    assert answer.status_code == 202, answer.content
    print("submit", n, *sql, sep="\n  ")
    assert n <= SUBMIT_BUDGET, "\n".join(sql)
    for _ in range(40):  # a backlog of the user's and others' queued jobs changes nothing
        make_job(alice, status="queued")
    again, sql, answer = statements(alice_api, "post", "/api/v1/jobs", data={**body, "seed": 2}, format="json")
    assert answer.status_code == 202 and again <= SUBMIT_BUDGET, "\n".join(sql)


def test_a_poll_stays_within_its_query_budget(alice, alice_api):
    job = make_job(alice, status="running", progress_step=1)
    alice_api.get(f"/api/v1/jobs/{job.id}")
    n, sql, answer = statements(alice_api, "get", f"/api/v1/jobs/{job.id}")
    assert answer.status_code == 200
    print("poll", n, *sql, sep="\n  ")
    assert n <= POLL_BUDGET, sql
    etag = answer["ETag"]
    conditional, sql, answer = statements(alice_api, "get", f"/api/v1/jobs/{job.id}", HTTP_IF_NONE_MATCH=etag)
    assert answer.status_code == 304 and conditional <= n, sql


@pytest.fixture
def redis_round_trips(monkeypatch):
    """Counts this thread's Redis round trips (a command, or a whole pipeline) while `on` is set:
    what jobs/api/timing.py reports as the request's `redis` entry."""
    tally = {"on": False, "n": 0, "what": []}
    me = threading.get_ident()

    def counted(original, what):
        def wrapped(self, *args, **kwargs):
            if tally["on"] and threading.get_ident() == me:
                tally["n"] += 1
                tally["what"].append(what(self, args))
            return original(self, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(redis.Redis, "execute_command", counted(redis.Redis.execute_command, lambda _, a: a[0]))
    monkeypatch.setattr(redis.client.Pipeline, "execute",
                        counted(redis.client.Pipeline.execute, lambda p, _: [c[0][0] for c in p.command_stack]))
    return tally


def test_a_submit_stays_within_its_redis_budget_with_its_summary_entry_fresh_or_stale(
        alice, alice_api, stay_queued, settings, redis_client, redis_round_trips):
    from imagegen.redis_client import PREFIX
    from jobs.admission import summary
    from scheduling import heartbeats

    settings.IMAGEGEN_USER_MAX_IN_FLIGHT = 10_000
    settings.IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE = 1_000
    redis_client.zadd(heartbeats.workers_key(settings.IMAGEGEN_MODEL_NAME), {"gpu-a": time.time() + 600})
    body = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 2}
    assert alice_api.post("/api/v1/jobs", {**body, "seed": 0}, format="json").status_code == 202  # the entry made
    key = f"{PREFIX}summary:{settings.IMAGEGEN_MODEL_NAME}"
    redis_client.set(summary._alive_key(), "1", px=10_000)  # a cpu worker's refresher, as make run has
    for seed in (1, 2, 3):
        if seed == 2:  # a stale entry: answered as it is, its refresh asked for in the last pipeline
            for field, raw in redis_client.hgetall(key).items():
                if field.startswith("new|"):
                    redis_client.hset(key, field, json.dumps({**json.loads(raw), "at": time.time() - 10}))
        if seed == 3:  # and a backlog of queued jobs changes nothing
            for _ in range(40):
                make_job(alice, status="queued")
        redis_round_trips.update(on=True, n=0, what=[])
        answer = alice_api.post("/api/v1/jobs", {**body, "seed": seed}, format="json")
        redis_round_trips["on"] = False
        assert answer.status_code == 202, answer.content
        print("submit", seed, redis_round_trips["n"], *redis_round_trips["what"], sep="\n  ")
        assert redis_round_trips["n"] <= SUBMIT_REDIS_BUDGET, redis_round_trips["what"]
    assert any(field.startswith("want|new|") for field in redis_client.hkeys(key))  # left to the refresher
    redis_client.delete(summary._alive_key())


def test_a_poll_of_a_finished_job_makes_no_redis_round_trip(alice, alice_api, redis_round_trips):
    job = make_job(alice, status="done")
    alice_api.get(f"/api/v1/jobs/{job.id}")
    redis_round_trips.update(on=True, n=0, what=[])
    answer = alice_api.get(f"/api/v1/jobs/{job.id}")
    redis_round_trips["on"] = False
    assert answer.status_code == 200 and redis_round_trips["n"] == 0, redis_round_trips["what"]


def test_a_poll_of_a_queued_job_makes_one_redis_round_trip_whatever_the_backlog(
        alice, alice_api, redis_client, redis_round_trips, settings, monkeypatch):
    """Its position (the jobs ahead in every shape's buckets) and its estimate (the bucket's
    summary entry) ride in one pipeline: before, three round trips (the shapes, their counts,
    the entry)."""
    import uuid

    from django.utils import timezone

    from jobs.actions import shape_of
    from jobs.models import GenerationJob
    from scheduling import heartbeats, scheduler
    from scheduling.lanes import lane_of

    # A version of its own, so its lane is one no worker of the session takes from (the jobs
    # ahead exist only in the scheduler).
    job = GenerationJob.objects.create(owner=alice, prompt="a red circle", width=64, height=64, steps=2,
                                       guidance_scale=5.0, seed=1, model_version="poll-budget", stage="waiting_gpu",
                                       progress_total=2, scheduled_at=timezone.now())
    lane = lane_of(job.model_version)
    redis_client.zadd(heartbeats.workers_key(lane), {"gpu-a": time.time() + 600})
    for _ in range(30):   # others queued ahead, in this shape and in another
        scheduler.enqueue(lane, shape_of(job), str(uuid.uuid4()), 1, time.time() - 60, owner="u")
        scheduler.enqueue(lane, shape_of(job).replace("|64x64|", "|64x128|"), str(uuid.uuid4()), 1, time.time() - 60, owner="u")
    scheduler.enqueue(lane, shape_of(job), str(job.id), 1, job.scheduled_at.timestamp(), owner=str(alice.id))
    # The summary entry stays fresh between the two polls (an entry is fresh for 20 times its
    # compute time, a few ms: a loaded machine's gap between them made it stale, and the poll
    # then asks the refresher for a new one, a second round trip; the submit test covers that).
    monkeypatch.setattr("jobs.admission.summary.FRESH_FACTOR", 1e6)
    settings.IMAGEGEN_SUMMARY_MAX_AGE = 600
    first = alice_api.get(f"/api/v1/jobs/{job.id}")
    assert first.status_code == 200 and first.json()["queue_position"] == 60, first.json()
    redis_round_trips.update(on=True, n=0, what=[])
    answer = alice_api.get(f"/api/v1/jobs/{job.id}")
    redis_round_trips["on"] = False
    assert answer.status_code == 200 and answer.json()["queue_position"] == 60
    print("poll", redis_round_trips["n"], *redis_round_trips["what"], sep="\n  ")
    assert redis_round_trips["n"] <= POLL_QUEUED_REDIS_BUDGET, redis_round_trips["what"]


def test_the_precompiled_limit_counts_answer_what_the_orm_statement_answers(alice, bob):
    import uuid
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from jobs.access import usage
    from jobs.models import UsageCharge

    for status in ("queued", "queued", "running", "review", "done"):
        make_job(alice, status=status, billable_images=2)
    make_job(alice, status="queued", priority="batch", billable_images=3)
    make_job(bob, status="queued")
    now = timezone.now()
    UsageCharge.objects.create(user=alice, job_id=uuid.uuid4(), images=4, image_steps=8, charged_at=now - timedelta(hours=1), priority="interactive")
    UsageCharge.objects.create(user=alice, job_id=uuid.uuid4(), images=5, image_steps=10, charged_at=now - timedelta(days=2), priority="interactive")
    for user in (alice, bob):
        for priority in ("interactive", "batch"):
            with transaction.atomic():
                precompiled = usage.lock_and_count(user.pk, priority, now=now)
            assert usage._COUNTS.is_compiled()  # the kept statement, not the per-call fallback
            row = usage._counts_query(user.pk, priority, now - usage.QUOTA_WINDOW).first()
            assert precompiled == tuple(v or 0 for v in row)
    with transaction.atomic():
        assert usage.lock_and_count(alice.pk, "interactive", now=now) == (3, 8, 4)
