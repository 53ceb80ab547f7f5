"""Query budgets of the hot paths (issue 33): a submit and a poll each run a pinned number of
database statements, so a change that adds one (or one per queued job) fails here. The budget
is the count measured when it was pinned; lower it when you cut one."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.test_security import make_job

pytestmark = pytest.mark.django_db(transaction=True)

# 11 statements (README "Query budget"), plus one when the shape's summary entry is stale and
# the submit recomputes it (the running batches: jobs/admission/summary.py).
SUBMIT_BUDGET = 12
POLL_BUDGET = 2


@pytest.fixture
def no_dispatch(monkeypatch):
    # The budget is the web process's; the prompt check's message is not a query.
    monkeypatch.setattr("jobs.pipeline.stages.send", lambda stage, *args, countdown=None: True)


def statements(api, method: str, url: str, **kwargs) -> tuple[int, list[str], object]:
    with CaptureQueriesContext(connection) as captured:
        answer = getattr(api, method)(url, **kwargs)
    return len(captured), [q["sql"][:160] for q in captured.captured_queries], answer


def test_a_submit_stays_within_its_query_budget_whatever_the_backlog(alice, alice_api, no_dispatch, settings):
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
