"""What a fleet operator sees of its workers: every Celery worker, whatever its process type,
heartbeats with the queues it consumes; /metrics reports each one up or silent with the age of
its last heartbeat, the live consumers of every routed queue (0 for a queue nobody consumes) and
the messages waiting in each on the broker; the staff dashboard shows the same."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.conftest import make_user, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def scrape() -> str:
    response = Client().get("/metrics")
    assert response.status_code == 200
    return response.content.decode()


def series(text: str, name: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf"^{re.escape(name)}\{{([^}}]*)\}} ([0-9.e+-]+)$", text, re.M)}


def containing(fetch, *needles: str):
    """A predicate for wait_for: fetch()'s text when it contains every needle, else None."""
    def check():
        text = fetch()
        return text if all(n in text for n in needles) else None
    return check


def wait_for(predicate, timeout: float = 60.0):
    return wait_until(predicate, timeout, pause=0.5)


def test_every_worker_heartbeats_with_its_queues_and_every_routed_queue_shows_its_consumers(workers, settings):
    text = wait_for(containing(scrape, 'worker="cpu@', 'worker="gpu1@'))
    up = series(text, "imagegen_worker_up")
    cpu = next(labels for labels in up if 'worker="cpu@' in labels)
    assert up[cpu] == 1.0 and settings.QUEUE_CLASSIFY in cpu and settings.QUEUE_IO in cpu
    consumers = series(text, "imagegen_queue_consumers")
    for queue in (settings.QUEUE_CPU, settings.QUEUE_IO, settings.QUEUE_CLASSIFY, settings.QUEUE_WEBHOOKS, settings.QUEUE_GPU):
        assert consumers[f'queue="{queue}"'] >= 1, (queue, consumers)
    assert f'queue="{settings.QUEUE_GPU}"' in series(text, "imagegen_queue_messages")


def test_a_killed_worker_shows_silent_and_its_queue_without_consumers(start_worker, workers, settings):
    queue = "liveness-only"
    worker = start_worker("liveness", queue)
    assert series(wait_for(containing(scrape, 'worker="liveness@')), "imagegen_queue_consumers")[f'queue="{queue}"'] == 1
    worker.kill()

    def silent():
        text = scrape()
        up = {k: v for k, v in series(text, "imagegen_worker_up").items() if 'worker="liveness@' in k}
        return text if up and set(up.values()) == {0.0} else None

    text = wait_for(silent, timeout=60)
    ages = {k: v for k, v in series(text, "imagegen_worker_heartbeat_age_seconds").items() if 'worker="liveness@' in k}
    from scheduling.liveness import TTL

    # not live: older than TTL (the metric rounds to a millisecond, so 10.0004 s reads 10.0)
    assert ages and min(ages.values()) >= TTL
    assert series(text, "imagegen_queue_consumers").get(f'queue="{queue}"', 0.0) == 0.0


def test_the_dashboard_lists_the_workers_and_the_queue_consumers(workers, transactional_db):
    staff = make_user("ops", is_staff=True)
    client = Client()
    client.force_login(staff)
    page = wait_for(containing(lambda: client.get("/staff/dashboard").content.decode(), "gpu1@"))
    assert "Queue consumers" in page and "cpu@" in page and "live" in page
