"""Shedding that says why (issue 33, item 4): a server_busy 429 names the pool that was full and
how long the request waited, from the thread pool of the web process (imagegen/threaded_http.py)
and from the Django side (a Redis pool that stayed full)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from imagegen.threaded_http import ThreadedWSGI


def slow_app(release: threading.Event):
    def app(environ, start_response):
        release.wait(10)  # a slow view: holds its thread until the test lets it go
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]
    return app


async def call(app: ThreadedWSGI) -> tuple[int, dict, dict]:
    sent: list[dict] = []
    messages = iter([{"type": "http.request", "body": b"", "more_body": False}])

    async def receive():
        return next(messages)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}
    await app(scope, receive, send)
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, json.loads(body) if start["status"] == 429 else {}


def test_a_shed_request_names_the_full_pool_and_how_long_it_waited():
    release = threading.Event()
    app = ThreadedWSGI(slow_app(release), threads=1, backlog=1, queue_timeout=0.05)

    async def scenario():
        running = asyncio.create_task(call(app))   # takes the one thread
        queued = asyncio.create_task(call(app))    # waits for it
        deadline = asyncio.get_running_loop().time() + 10
        while app.in_flight < 2:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.005)
        shed_now = await call(app)                 # threads and backlog taken: shed on arrival
        await asyncio.sleep(0.1)                   # the queued one waits past the queue timeout
        release.set()
        return await running, await queued, shed_now

    running, queued, shed_now = asyncio.run(scenario())
    assert running[0] == 200
    status, headers, body = shed_now
    assert status == 429 and headers["retry-after"] == "1"
    assert body["limit"] == "server_busy" and body["pool"] == "web_backlog" and body["waited_seconds"] == 0
    status, headers, body = queued
    assert status == 429 and body["pool"] == "web_threads" and body["waited_seconds"] >= 0.05
    assert "web_threads" in body["detail"] and set(body) >= {"detail", "limit", "eta_seconds", "retry_after"}


@pytest.mark.django_db(transaction=True)
def test_a_full_redis_pool_answers_server_busy_naming_the_redis_pool(alice_api, settings):
    """Every Redis connection of the process held (by the test, for real), one more request
    waits the pool's timeout and is answered 429 naming the pool, as a DRF Throttled."""
    from imagegen.redis_client import get_redis

    settings.IMAGEGEN_THROTTLE_READ = "600/min"  # the throttle needs a connection
    pool = get_redis().connection_pool
    held = []
    try:
        while True:
            try:
                held.append(pool.get_connection("PING"))
            except Exception:
                break
        answer = alice_api.get("/api/v1/jobs")
    finally:
        for connection in held:
            pool.release(connection)
    assert answer.status_code == 429, answer.content
    body = answer.json()
    assert body["limit"] == "server_busy" and body["pool"] == "redis" and answer["Retry-After"] == "1"
    assert body["waited_seconds"] == settings.IMAGEGEN_REDIS_POOL_TIMEOUT and "redis full" in body["detail"]
