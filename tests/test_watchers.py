"""Watchers and waiters that survive Redis (issue 18, items 5 and 6), on a deployment slice with
a Redis of its own: daphne, a cpu/io/classify worker with the reaper and a GPU worker on a lane of
their own. A websocket and an SSE stream opened before a Redis restart still get the terminal
status; opened while Redis is down they are refused at once with a retry hint; a committed
cancel answers 202 even when the Redis cancel flag cannot be set; an OpenAI-compatible request
whose client went away stops waiting (and its job is cancelled)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from types import SimpleNamespace

import httpx
import pytest
import websockets
from django.conf import settings

from jobs.models import GenerationJob
from scripts.private_redis import start as start_redis
from tests.conftest import _database_url, make_user
from tests.live_server import start_daphne, stop_daphne
from tests.test_security import make_job

pytestmark = pytest.mark.django_db(transaction=True)

LANE = "watchlane"


@pytest.fixture(scope="module")
def slice_(worker_env, start_shared_worker, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("watchers")
    holder = SimpleNamespace()
    holder.redis, url = start_redis(tmp / "redis")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    env = {"REDIS_URL": url, "IMAGEGEN_MODEL_NAME": LANE}
    cpu = start_shared_worker("watch-cpu", f"{settings.QUEUE_CPU},{settings.QUEUE_IO},{settings.QUEUE_CLASSIFY},{settings.QUEUE_WEBHOOKS}", beat=True,
                       wait=False, **env)
    # The simulated accelerator (it sleeps by the cost model): a 150-step pass lasts ~12 s, so
    # Redis surely goes away in the middle of it.
    gpu = start_shared_worker("watch-gpu", f"{settings.QUEUE_GPU_PREFIX}{LANE}", IMAGEGEN_ACCELERATOR="simulated",
                       IMAGEGEN_SIM_STEP_MS="80", **env)
    cpu.wait_ready()
    web = start_daphne({**os.environ, "DATABASE_URL": _database_url(), "DJANGO_SETTINGS_MODULE": "imagegen.settings", **env},
                       tmp, name="watch-web")

    def kill_redis():
        holder.redis.kill()
        holder.redis.wait()

    def start_again():
        holder.redis, _ = start_redis(tmp / "redis", port=port)

    holder.web, holder.kill_redis, holder.start_again, holder.url = web, kill_redis, start_again, url
    yield holder
    stop_daphne(web)
    gpu.stop()
    cpu.stop()
    holder.redis.terminate()


def auth(user) -> dict:
    return {"Authorization": f"Token {user.auth_token.key}"}


async def watch_websocket(web, job_id, user, until: float, got: list[dict] | None = None) -> list[dict]:
    got = [] if got is None else got
    url = f"{web.ws_url}/ws/jobs/{job_id}/"
    async with websockets.connect(url, origin=web.origin, additional_headers=auth(user), open_timeout=10) as ws:
        while time.monotonic() < until:
            try:
                got.append(json.loads(await asyncio.wait_for(ws.recv(), max(0.1, until - time.monotonic()))))
            except (TimeoutError, websockets.ConnectionClosed):
                break
            if got[-1].get("type") == "status" and got[-1]["status"] in ("done", "failed", "blocked", "cancelled"):
                break
    return got


async def watch_sse(web, job_id, user, until: float, got: list[dict] | None = None) -> list[dict]:
    got = [] if got is None else got
    timeout = httpx.Timeout(10, read=max(1.0, until - time.monotonic()))
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            async with http.stream("GET", f"{web.url}/api/v1/jobs/{job_id}/events", headers=auth(user)) as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("data: "):
                        got.append(json.loads(line[6:]))
                    if time.monotonic() > until:
                        break
    except httpx.ReadTimeout:
        pass
    return got


def statuses(events: list[dict]) -> list[str]:
    return [e["status"] for e in events if e.get("type") == "status"]


def test_watchers_opened_before_a_redis_restart_get_the_terminal_status(slice_, transactional_db):
    alice = make_user("alice")
    api = httpx.Client(base_url=slice_.web.url, headers=auth(alice), timeout=30)
    response = api.post("/api/v1/jobs", json={"prompt": "a red circle through a restart", "steps": 150, "seed": 8})
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]

    async def scenario():
        until = time.monotonic() + 90
        seen_ws: list[dict] = []
        seen_sse: list[dict] = []
        watchers = asyncio.gather(watch_websocket(slice_.web, job_id, alice, until, seen_ws),
                                  watch_sse(slice_.web, job_id, alice, until, seen_sse))
        deadline = time.monotonic() + 60
        # Both watchers are open and have seen the job running: the restart comes mid-run.
        while not ("running" in statuses(seen_ws) and "running" in statuses(seen_sse)):
            assert time.monotonic() < deadline, ("the watchers never saw the job running", seen_ws, seen_sse)
            await asyncio.sleep(0.05)
        await asyncio.to_thread(slice_.kill_redis)
        await asyncio.sleep(1.0)  # the outage under test: Redis stays away a second
        await asyncio.to_thread(slice_.start_again)
        return await watchers

    ws_events, sse_events = asyncio.run(scenario())
    final = GenerationJob.objects.get(id=job_id)
    assert final.status == "done", (final.status, final.reason)
    assert statuses(ws_events)[-1:] == ["done"], statuses(ws_events)
    assert statuses(sse_events)[-1:] == ["done"], statuses(sse_events)


def test_streams_opened_while_redis_is_down_are_refused_at_once_with_a_retry_hint(slice_, transactional_db):
    alice = make_user("alice")
    job = make_job(alice, status="running")
    slice_.kill_redis()
    try:
        started = time.monotonic()
        try:
            sse = httpx.get(f"{slice_.web.url}/api/v1/jobs/{job.id}/events", headers=auth(alice), timeout=20)
        except httpx.ReadTimeout:
            pytest.fail("the SSE stream hung without a byte while Redis was down")
        assert sse.status_code == 503 and int(sse.headers["retry-after"]) >= 1, sse.status_code
        assert time.monotonic() - started < 20

        async def websocket_refusal():
            url = f"{slice_.web.ws_url}/ws/jobs/{job.id}/"
            frames = []
            try:
                async with websockets.connect(url, origin=slice_.web.origin, additional_headers=auth(alice), open_timeout=10) as ws:
                    while True:
                        frames.append(json.loads(await asyncio.wait_for(ws.recv(), 15)))
            except websockets.ConnectionClosed as exc:
                return exc.rcvd.code if exc.rcvd else None, frames
            except websockets.InvalidStatus as exc:
                return exc.response.status_code, frames

        started = time.monotonic()
        code, frames = asyncio.run(websocket_refusal())
        assert code == 4503 and time.monotonic() - started < 40, (code, frames)
        assert [f["type"] for f in frames] == ["error"] and frames[0]["retry_after"] >= 1, frames
    finally:
        slice_.start_again()


def test_a_committed_cancel_answers_202_even_when_the_redis_flag_cannot_be_set(slice_, transactional_db):
    alice = make_user("alice")
    queued = make_job(alice, status="queued")
    slice_.kill_redis()
    try:
        cancel = httpx.post(f"{slice_.web.url}/api/v1/jobs/{queued.id}/cancel", headers=auth(alice), timeout=30)
        assert GenerationJob.objects.get(id=queued.id).status == "cancelled"
        assert cancel.status_code == 202, (cancel.status_code, cancel.text)
        assert cancel.json()["status"] == "cancelled"
    finally:
        slice_.start_again()


def test_an_openai_request_whose_client_left_stops_waiting_and_its_job_is_cancelled(worker_env, transactional_db):
    # The prompt check goes to a queue nobody consumes: the job would wait the full 120 s.
    env = {**worker_env, "IMAGEGEN_QUEUE_CPU": "openai-nobody"}
    server = start_daphne(env, settings.VAR_DIR, name="daphne-openai-left", collectstatic=False)
    try:
        carol = make_user("carol")
        for i in range(3):
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{server.url}/v1/images/generations", json={"prompt": f"a slow red circle {i}"},
                           headers={"Authorization": f"Bearer {carol.auth_token.key}"}, timeout=httpx.Timeout(10, read=1.5))
        deadline = time.monotonic() + 120
        while GenerationJob.objects.filter(owner=carol).exclude(status="cancelled").exists():
            assert time.monotonic() < deadline, list(GenerationJob.objects.filter(owner=carol).values_list("status", flat=True))
            time.sleep(0.2)
        assert all("disconnected" in reason for reason in GenerationJob.objects.filter(owner=carol).values_list("reason", flat=True))
    finally:
        stop_daphne(server)
