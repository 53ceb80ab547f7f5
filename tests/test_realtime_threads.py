"""Issue 44, item 6: the websocket path's sync work (the handshake's token or session lookup, the
consumer's job check and state read) must not share one thread per server process. With
asgiref's default (thread_sensitive=True and no context of its own) every such call of every
socket queued on one thread: one slow database read held every other socket's handshake.

A real uvicorn process serves imagegen.asgi's application with two calls held at a gate
(tests/realtime_gated_asgi.py): alice's job check and carol's token lookup. While alice's is held,
bob's websocket gets its handshake and its job's state, bob's SSE stream its first event, and
carol's held lookup is entered beside alice's; then the gate opens and the held sockets go on.
The hub's periodic re-read of a job's row (what ends a stream whose events were lost) is held the
same way for one job, and another job's stream still gets its row's change by re-read.
Every wait is on a condition (a file the held call touches, a frame, an event) with a deadline."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import websockets

from jobs.models import FIRST_STAGE
from scripts.procs import free_port, stop_group
from tests.conftest import make_user, wait_until
from tests.live_server import LiveServer
from tests.test_events import make_job

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
# How long a check beside a held call may take: seconds when it runs on a thread of its own (a
# loaded CI machine included), for ever when it queues behind the held call.
BESIDE = 30.0


def start_gated_server(env: dict, log_dir: Path) -> LiveServer:
    port = free_port()
    log_path = log_dir / f"uvicorn-gated-{port}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.realtime_gated_asgi:application", "--host", "127.0.0.1", "--port",
         str(port), "--lifespan", "off", "--no-access-log"],
        cwd=ROOT, env=env, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    server = LiveServer(f"http://127.0.0.1:{port}", "127.0.0.1", port, proc, log_path)

    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"uvicorn exited:\n{server.log_tail()}")
        try:
            return httpx.get(f"{server.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(answers, 60, "the gated server answering /healthz")
    except BaseException:
        stop_group(proc, 10)
        raise
    return server


async def first_frame(server: LiveServer, job_id, token: str) -> dict:
    """The first frame of the job's websocket (a script: a token and no Origin)."""
    async with websockets.connect(f"{server.ws_url}/ws/jobs/{job_id}/", open_timeout=None,
                                  additional_headers={"Authorization": f"Token {token}"}) as ws:
        return json.loads(await ws.recv())


async def sse_events(server: LiveServer, job_id, token: str, got: list[dict], until_status: str | None = None) -> list[dict]:
    """The job's SSE events into `got`: its first only, or until the status `until_status`."""
    async with httpx.AsyncClient(timeout=None) as client:
        async with client.stream("GET", f"{server.url}/api/v1/jobs/{job_id}/events",
                                 headers={"Authorization": f"Token {token}"}) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    got.append(json.loads(line[len("data: "):]))
                    if until_status is None or got[-1].get("status") == until_status:
                        return got
    raise AssertionError(f"the SSE stream ended without the event waited for: {got}")


async def first_sse_event(server: LiveServer, job_id, token: str) -> dict:
    return (await sse_events(server, job_id, token, []))[0]


async def beside(work, what: str):
    try:
        return await asyncio.wait_for(work, BESIDE)
    except TimeoutError:
        raise AssertionError(f"{what} did not come within {BESIDE:.0f}s beside the held call (queued behind it?)") from None


def test_a_held_sync_call_on_one_websocket_stalls_no_other_socket_nor_an_sse_stream(worker_env, tmp_path):
    alice, bob, carol = make_user("alice"), make_user("bob"), make_user("carol")
    held_job, bobs_job, carols_job = make_job(alice), make_job(bob), make_job(carol)
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {**worker_env, "IMAGEGEN_TEST_GATE_DIR": str(gate), "IMAGEGEN_TEST_HELD_JOB": str(held_job.id),
           "IMAGEGEN_TEST_HELD_TOKEN": carol.auth_token.key}
    server = start_gated_server(env, tmp_path)

    def entered(name: str):
        return lambda: (gate / f"{name}.entered").exists()

    async def scenario() -> dict:
        alices = asyncio.create_task(first_frame(server, held_job.id, alice.auth_token.key))
        carols = None
        try:
            await asyncio.to_thread(wait_until, entered("owned_job"), 60, "alice's job check held at the gate")
            # Alice's job check is held on its thread. Beside it, on the same process:
            carols = asyncio.create_task(first_frame(server, carols_job.id, carol.auth_token.key))
            bobs_ws = await beside(first_frame(server, bobs_job.id, bob.auth_token.key), "bob's websocket state")
            bobs_sse = await beside(first_sse_event(server, bobs_job.id, bob.auth_token.key), "bob's first SSE event")
            await asyncio.to_thread(wait_until, entered("token_user"), BESIDE, "carol's token lookup entered beside alice's")
            still_held = not alices.done() and not carols.done()
            (gate / "open").touch()
            alices_frame, carols_frame = await asyncio.wait_for(asyncio.gather(alices, carols), 60)
            return {"bob ws": bobs_ws, "bob sse": bobs_sse, "still held": still_held, "alice": alices_frame,
                    "carol": carols_frame}
        finally:
            (gate / "open").touch()
            for task in (alices, carols):
                if task is not None and not task.done():
                    task.cancel()
            await asyncio.gather(*(t for t in (alices, carols) if t is not None), return_exceptions=True)

    try:
        seen = asyncio.run(scenario())
    finally:
        stop_group(server.proc, 10)
    assert (seen["bob ws"]["type"], seen["bob ws"]["status"], seen["bob ws"]["job"]) == ("status", "queued", str(bobs_job.id))
    assert (seen["bob sse"]["type"], seen["bob sse"]["status"]) == ("status", "queued")
    # Bob's checks ran while both held calls were still in progress, not after the gate opened.
    assert seen["still held"]
    assert (seen["alice"]["status"], seen["alice"]["job"]) == ("queued", str(held_job.id))
    assert (seen["carol"]["status"], seen["carol"]["job"]) == ("queued", str(carols_job.id))


def test_a_held_re_read_of_one_job_delays_no_other_jobs_re_read(worker_env, tmp_path):
    """The hub re-reads each watched job's row every IMAGEGEN_WATCH_REREAD_SECONDS (how a stream
    ends whose final event Redis lost). Alice's job's re-read is held; bob's job's row changes
    with no event sent (a direct update), and his SSE stream still gets the change by re-read."""
    from jobs.models import GenerationJob

    alice, bob = make_user("alice"), make_user("bob")
    held_job, bobs_job = make_job(alice), make_job(bob)
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {**worker_env, "IMAGEGEN_TEST_GATE_DIR": str(gate), "IMAGEGEN_TEST_HELD_REREAD_JOB": str(held_job.id),
           "IMAGEGEN_WATCH_REREAD_SECONDS": "0.3"}
    server = start_gated_server(env, tmp_path)

    async def scenario() -> tuple[list[dict], bool]:
        alices = asyncio.create_task(sse_events(server, held_job.id, alice.auth_token.key, [], until_status="cancelled"))
        bobs_events: list[dict] = []
        bobs = None
        try:
            await asyncio.to_thread(wait_until, lambda: (gate / "reread.entered").exists(), 60, "alice's job's re-read held")
            bobs = asyncio.create_task(sse_events(server, bobs_job.id, bob.auth_token.key, bobs_events, until_status="cancelled"))
            await asyncio.to_thread(wait_until, lambda: bobs_events, 60, "bob's stream's first event")
            # No event is published: only a re-read of the row can tell bob's stream.
            await asyncio.to_thread(lambda: GenerationJob.objects.filter(id=bobs_job.id).update(stage=FIRST_STAGE["cancelled"],
                                                                                          status="cancelled"))
            await beside(bobs, "the re-read of bob's job")
            return bobs_events, not alices.done()
        finally:
            (gate / "open").touch()
            for task in (alices, bobs):
                if task is not None and not task.done():
                    task.cancel()
            await asyncio.gather(*(t for t in (alices, bobs) if t is not None), return_exceptions=True)

    try:
        bobs_events, still_held = asyncio.run(scenario())
    finally:
        stop_group(server.proc, 10)
    assert [e["status"] for e in bobs_events] == ["queued", "cancelled"], bobs_events
    assert still_held
