"""Issue 28, item 3: /metrics is for operators (a bearer token or an allow-listed address; the
embedded default lets in loopback), its database aggregates are cached for a few seconds, and
/readyz tells anonymous callers only ready or not."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from tests.conftest import make_user

pytestmark = pytest.mark.django_db(transaction=True)

OUTSIDE = "203.0.113.7"


def test_metrics_from_an_outside_address_without_the_token_is_refused(settings):
    settings.IMAGEGEN_METRICS_TOKEN = "s3cret-scrape"
    response = Client(REMOTE_ADDR=OUTSIDE).get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert "IMAGEGEN_METRICS_TOKEN" in response.json()["detail"]
    assert Client(REMOTE_ADDR=OUTSIDE).get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401


def test_metrics_with_the_token_or_from_an_allowed_address_are_served(settings):
    settings.IMAGEGEN_METRICS_TOKEN = "s3cret-scrape"
    ok = Client(REMOTE_ADDR=OUTSIDE).get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape")
    assert ok.status_code == 200 and b"imagegen_review_queue_depth" in ok.content
    assert Client().get("/metrics").status_code == 200  # loopback: the embedded default's allow-list
    settings.IMAGEGEN_METRICS_ALLOW = ["203.0.113.0/24"]
    assert Client(REMOTE_ADDR=OUTSIDE).get("/metrics").status_code == 200
    settings.IMAGEGEN_METRICS_ALLOW = []
    assert Client().get("/metrics").status_code == 401


def test_a_scrape_within_the_cache_time_runs_no_database_aggregates(settings):
    settings.IMAGEGEN_METRICS_CACHE_SECONDS = 60
    client = Client()
    assert client.get("/metrics").status_code == 200
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/metrics").status_code == 200
    assert [q["sql"] for q in queries.captured_queries] == []
    settings.IMAGEGEN_METRICS_CACHE_SECONDS = 0
    with CaptureQueriesContext(connection) as queries:
        client.get("/metrics")
    assert len(queries.captured_queries) >= 5


def test_readyz_tells_an_anonymous_caller_only_ready_or_not(settings):
    settings.IMAGEGEN_METRICS_ALLOW = []
    settings.IMAGEGEN_METRICS_TOKEN = "s3cret-scrape"
    anonymous = Client(REMOTE_ADDR=OUTSIDE).get("/readyz")
    assert set(anonymous.json()) == {"status"} and anonymous.json()["status"] in ("ready", "not ready")
    operator = Client(REMOTE_ADDR=OUTSIDE).get("/readyz", HTTP_AUTHORIZATION="Bearer s3cret-scrape")
    assert operator.status_code == anonymous.status_code
    assert "database" in operator.json()["checks"]
    staff = Client(REMOTE_ADDR=OUTSIDE)
    staff.force_login(make_user("olga", is_staff=True))
    assert staff.get("/readyz").json()["checks"]["redis"] == "ok"
