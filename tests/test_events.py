"""The event paths: the websocket consumer in process (Channels' WebsocketCommunicator through
the full imagegen.asgi.application), then websocket and SSE end to end over a real daphne with
real workers and real clients (the `websockets` package, httpx streaming)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from jobs.models import FIRST_STAGE, GenerationJob
from jobs.realtime import events

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://127.0.0.1:8000")
TERMINAL = {"done", "blocked", "failed", "cancelled"}


def make_job(owner, status="queued", steps=12) -> GenerationJob:
    return GenerationJob.objects.create(
        owner=owner, prompt="a red circle", width=64, height=64, steps=steps, guidance_scale=5.0,
        seed=1, model_version="tiny-random", stage=FIRST_STAGE[status], progress_total=steps,
    )


def token_header(user) -> tuple[bytes, bytes]:
    return (b"authorization", f"Token {user.auth_token.key}".encode())


def communicator(job_id, *headers) -> WebsocketCommunicator:
    from imagegen.asgi import application

    return WebsocketCommunicator(application, f"/ws/jobs/{job_id}/", headers=[(b"host", b"127.0.0.1:8000"), *headers])


# --- the consumer, in process -------------------------------------------------------------


def test_owner_gets_the_current_state_first_then_live_events_in_order(alice):
    job = make_job(alice, status="running")
    events.publish(job.id, {"type": "progress", "step": 3, "total": 12})

    async def scenario():
        ws = communicator(job.id, ORIGIN, token_header(alice))
        connected, _ = await ws.connect(timeout=60)
        assert connected
        first = await ws.receive_json_from(timeout=60)
        assert (first["type"], first["status"], first["job"]) == ("status", "running", str(job.id))
        replay = await ws.receive_json_from(timeout=60)
        assert (replay["type"], replay["step"], replay["total"]) == ("progress", 3, 12)
        publish = sync_to_async(events.publish)
        await publish(job.id, {"type": "progress", "step": 3, "total": 12})  # already replayed: dropped
        await publish(job.id, {"type": "progress", "step": 4, "total": 12})
        await publish(job.id, {"type": "preview", "step": 4, "image": "data:image/jpeg;base64,AA=="})
        live = await ws.receive_json_from(timeout=60)
        assert (live["type"], live["step"]) == ("progress", 4)
        assert isinstance(live["sent_at"], float)
        preview = await ws.receive_json_from(timeout=60)
        assert (preview["type"], preview["step"]) == ("preview", 4)
        await publish(job.id, {"type": "status", "status": "done", "reason": "", "images": []})
        done = await ws.receive_json_from(timeout=60)
        assert done["status"] == "done"
        closed = await ws.receive_output(timeout=60)
        assert closed == {"type": "websocket.close", "code": 1000}
        await ws.disconnect()

    async_to_sync(scenario)()


def test_the_session_cookie_authenticates_the_page_socket(alice):
    job = make_job(alice)
    client = Client()
    client.force_login(alice)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()

    async def scenario():
        ws = communicator(job.id, ORIGIN, (b"cookie", cookie))
        connected, _ = await ws.connect(timeout=60)
        assert connected
        first = await ws.receive_json_from(timeout=60)
        assert (first["type"], first["status"]) == ("status", "queued")
        assert await ws.receive_nothing(timeout=0.2)
        await ws.disconnect()

    async_to_sync(scenario)()


def test_another_user_anonymous_and_a_foreign_origin_are_refused_at_connect(alice, bob):
    job = make_job(alice)

    async def refused(*headers) -> bool:
        ws = communicator(job.id, *headers)
        connected, _ = await ws.connect(timeout=60)
        if connected:
            await ws.disconnect()
        return not connected

    async def scenario():
        assert await refused(ORIGIN, token_header(bob))
        assert await refused(ORIGIN)
        assert await refused(ORIGIN, (b"authorization", b"Token not-a-token"))
        assert await refused((b"origin", b"https://evil.example"), token_header(alice))
        assert not await refused(token_header(alice))  # no Origin, a token: a script (issue 28)
        assert await refused()  # no Origin, no token
        assert not await refused(ORIGIN, token_header(alice))

    async_to_sync(scenario)()


def test_a_finished_job_replays_its_final_status_and_closes(alice):
    job = make_job(alice, status="cancelled")

    async def scenario():
        ws = communicator(job.id, ORIGIN, token_header(alice))
        connected, _ = await ws.connect(timeout=60)
        assert connected
        first = await ws.receive_json_from(timeout=60)
        assert first["status"] == "cancelled"
        assert await ws.receive_output(timeout=60) == {"type": "websocket.close", "code": 1000}

    async_to_sync(scenario)()


def test_a_socket_closed_while_an_event_is_on_its_way_stops_its_forwarder_first():
    """The client goes away just as a live event reaches the socket's queue. The forwarder must
    have stopped before disconnect() releases the stream slot; on Python 3.11 a cancel that
    lands between the queue handing over the event and the forwarder resuming was swallowed by
    asyncio.wait_for, and the forwarder went on to refresh a slot disconnect() had already
    dropped ('NoneType' object has no attribute 'refresh', seen in the fleet's web logs). Every
    interleaving of the event's arrival and the disconnect is tried (the loop is deterministic)."""
    from jobs.realtime.consumers import JobEventsConsumer
    from jobs.realtime.state import EventOrder

    class Slot:
        released = 0

        async def refresh(self):
            pass

        async def release(self):
            Slot.released += 1

    class Subscription:
        def __init__(self):
            self.queue: asyncio.Queue = asyncio.Queue()

        async def close(self):
            pass

    async def one(turns: int) -> None:
        consumer = JobEventsConsumer()
        sent: list[dict] = []

        async def base_send(message):
            sent.append(message)

        consumer.base_send = base_send
        consumer.job_id, consumer.order, consumer.slot, consumer.closed = "j", EventOrder(), Slot(), False
        consumer.subscription = Subscription()
        consumer.order.admit({"type": "status", "status": "running"})
        forwarder = consumer.forwarder = asyncio.create_task(consumer._forward())
        await asyncio.sleep(0)  # the forwarder waits on the queue
        consumer.subscription.queue.put_nowait({"type": "progress", "step": 1, "total": 2})
        for _ in range(turns):
            await asyncio.sleep(0)
        await consumer.disconnect({"code": 1001})
        await asyncio.wait({forwarder}, timeout=2)
        assert forwarder.done(), f"the forwarder outlived the socket ({turns} turns)"
        assert forwarder.cancelled() or forwarder.exception() is None, (turns, forwarder.exception())

    async def scenario():
        for turns in range(8):
            await one(turns)
        assert Slot.released == 8

    async_to_sync(scenario)()


# --- end to end over daphne -----------------------------------------------------------------


async def read_websocket(server, job_id, token, first: asyncio.Event | None = None) -> tuple[list[dict], int | None]:
    """Every frame until the server closes; `first` is set once the first frame (the status the
    consumer sends when it has subscribed) has arrived."""
    received = []
    async with websockets.connect(
        f"{server.ws_url}/ws/jobs/{job_id}/",
        origin=server.origin,
        additional_headers={"Authorization": f"Token {token}"},
        open_timeout=10,
    ) as ws:
        try:
            async for frame in ws:
                received.append(json.loads(frame))
                if first is not None:
                    first.set()
        except websockets.ConnectionClosed:
            pass
        return received, ws.close_code


async def read_sse(server, job_id, token, first: asyncio.Event | None = None) -> tuple[list[tuple[str, dict]], dict]:
    """A plain HTTP client: parse `event:` / `data:` lines until the server ends the body
    (`first`: set at the first event, sent once the stream has subscribed)."""
    received, name, data = [], None, []
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client:
        async with client.stream(
            "GET", f"{server.url}/api/v1/jobs/{job_id}/events", headers={"Authorization": f"Token {token}"}
        ) as response:
            assert response.status_code == 200
            headers = dict(response.headers)
            async for line in response.aiter_lines():
                if line.startswith(":"):
                    continue
                if line.startswith("event: "):
                    name = line[len("event: "):]
                elif line.startswith("data: "):
                    data.append(line[len("data: "):])
                elif line == "" and data:
                    received.append((name, json.loads("\n".join(data))))
                    name, data = None, []
                    if first is not None:
                        first.set()
    return received, headers


def check_stream(stream: list[dict], steps: int) -> None:
    assert stream[0]["type"] == "status" and stream[0]["status"] in ("queued", "running"), stream[0]
    progress = [e["step"] for e in stream if e["type"] == "progress"]
    assert progress == sorted(set(progress)), progress  # strictly increasing
    assert progress[-1] == steps and all(e["total"] == steps for e in stream if e["type"] == "progress")
    assert progress == list(range(1, steps + 1)), progress  # every step: the stream was open before the first
    previews = [e for e in stream if e["type"] == "preview"]
    assert previews, [e["type"] for e in stream]
    assert all(p["image"].startswith("data:image/jpeg;base64,") for p in previews)
    final = stream[-1]
    assert final["type"] == "status" and final["status"] == "done", final
    assert [e for e in stream if e["type"] == "status" and e["status"] in TERMINAL] == [final]
    statuses = [e["status"] for e in stream if e["type"] == "status"]
    assert statuses in (["queued", "running", "done"], ["running", "done"]), statuses


def test_websocket_and_sse_stream_a_job_end_to_end(workers, daphne_server, alice, alice_api, settings):
    """The job is admitted held (in its bucket, its GPU lane not woken) and the lane is woken once
    both streams have subscribed, so every event of the run reaches both, however slowly the
    clients connect on a loaded machine."""
    from scheduling import lanes
    from tests.conftest import admitted_to

    server, token, steps = daphne_server, alice.auth_token.key, 16
    api = httpx.Client(base_url=server.url, headers={"Authorization": f"Token {token}"}, timeout=10)
    lane = settings.IMAGEGEN_MODEL_NAME
    with admitted_to(lane, held=True):
        response = alice_api.post("/api/v1/jobs", {"prompt": "a red circle", "width": 64, "height": 64, "steps": steps,
                                                   "seed": 3}, format="json")
    assert response.status_code == 202, response.content
    job = response.json()

    async def both():
        subscribed = [asyncio.Event(), asyncio.Event()]
        streams = asyncio.gather(read_websocket(server, job["id"], token, subscribed[0]),
                                 read_sse(server, job["id"], token, subscribed[1]))
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in subscribed)), 60)
        await sync_to_async(lanes.wake)(lane)
        return await asyncio.wait_for(streams, 120)

    (ws_events, close_code), (sse_pairs, sse_headers) = asyncio.run(both())

    check_stream(ws_events, steps)
    assert close_code == 1000
    sse_events = [event for _, event in sse_pairs]
    check_stream(sse_events, steps)
    assert all(name == event["type"] for name, event in sse_pairs)
    assert sse_headers["content-type"].startswith("text/event-stream")
    assert sse_headers["cache-control"] == "no-cache"

    [image] = ws_events[-1]["images"]
    assert sse_events[-1]["images"] == ws_events[-1]["images"]
    assert image["url"] == api.get(f"/api/v1/jobs/{job['id']}").json()["images"][0]["url"]
    png = httpx.get(server.url + image["url"])
    assert png.status_code == 200 and png.content[:8] == b"\x89PNG\r\n\x1a\n"

    # After the end, a new watcher gets the final status at once and the stream ends.
    late, _ = asyncio.run(read_sse(server, job["id"], token))
    assert [e["status"] for _, e in late] == ["done"]


def test_refusals_over_daphne(daphne_server, alice, bob):
    server = daphne_server
    job = make_job(alice)
    url = f"{server.ws_url}/ws/jobs/{job.id}/"

    async def handshake_status(origin, token) -> int:
        headers = {"Authorization": f"Token {token}"} if token else {}
        try:
            async with websockets.connect(url, origin=origin, additional_headers=headers, open_timeout=10):
                return 101
        except websockets.InvalidStatus as exc:
            return exc.response.status_code

    async def scenario():
        return [
            await handshake_status(server.origin, alice.auth_token.key),
            await handshake_status(server.origin, bob.auth_token.key),
            await handshake_status(server.origin, None),
            await handshake_status("https://evil.example", alice.auth_token.key),
        ]

    assert asyncio.run(scenario()) == [101, 403, 403, 403]

    sse = f"{server.url}/api/v1/jobs/{job.id}/events"
    assert httpx.get(sse, headers={"Authorization": f"Token {bob.auth_token.key}"}).status_code == 404
    anonymous = httpx.get(sse)
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Token"
