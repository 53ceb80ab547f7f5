"""Issue 28, item 1: every route, the async ones (/v1/images/generations, the event stream)
included, refuses a body over the cap with a 413 and a JSON body before authentication and
before any of it is spooled; black-box over the server the deploy files run (uvicorn; daphne
reads a whole body before it calls the app, so it cannot show the difference)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from scripts.procs import free_port, stop_group
from tests.live_server import ROOT, LiveServer

pytestmark = pytest.mark.django_db(transaction=True)

TEN_MB = 10 * 1024 * 1024
ROUTES = [
    "/v1/images/generations",  # async (Django's ASGI handler)
    f"/api/v1/jobs/{uuid.UUID(int=1)}/events",  # async (a fixed id: every pytest-xdist worker collects the same tests)
    "/api/v1/jobs",
    "/api/v1/account/webhook-secret",
    "/accounts/login/",
    "/admin/login/",
    "/metrics",
    "/healthz",
    "/v1/no-such-route",
    "/",
]


def start_uvicorn(env: dict, name: str = "uvicorn", extra: tuple[str, ...] = ()) -> LiveServer:
    port = free_port()
    log_path = Path(settings.VAR_DIR) / f"{name}-{port}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "imagegen.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--lifespan", "off", "--no-access-log", *extra],
        cwd=ROOT, env=env, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    server = LiveServer(f"http://127.0.0.1:{port}", "127.0.0.1", port, proc, log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"uvicorn exited:\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.1)
    stop_group(proc, 10)
    raise RuntimeError(f"uvicorn did not answer /healthz:\n{server.log_tail()}")


@pytest.fixture(scope="module")
def uvicorn_server(worker_env):
    server = start_uvicorn(worker_env)
    yield server
    stop_group(server.proc, 10)


def _exchange(server, head: bytes, body_chunks) -> tuple[int, dict, bytes]:
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(head)
        try:
            for chunk in body_chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-body: the answer is already on its way
        data = b""
        while b"\r\n\r\n" not in data:
            part = sock.recv(65536)
            if not part:
                break
            data += part
        head_bytes, _, rest = data.partition(b"\r\n\r\n")
        lines = head_bytes.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        want = int(headers.get("content-length", "0"))
        while len(rest) < want:
            part = sock.recv(65536)
            if not part:
                break
            rest += part
        return status, headers, rest


@pytest.mark.parametrize("path", ROUTES)
def test_a_ten_megabyte_body_is_413_json_on_every_route(uvicorn_server, path):
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{uvicorn_server.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {TEN_MB}\r\nConnection: close\r\n\r\n").encode()
    status, headers, body = _exchange(uvicorn_server, head, [b" " * 65536])  # the rest is never needed
    assert status == 413, (status, body[:200])
    assert headers["content-type"] == "application/json"
    assert "over" in json.loads(body)["detail"]


def test_a_chunked_body_without_a_length_is_cut_off_at_the_cap(uvicorn_server):
    head = (f"POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1:{uvicorn_server.port}\r\n"
            "Authorization: Bearer nope\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
            "Connection: close\r\n\r\n").encode()
    piece = b" " * 65536
    chunks = (b"%x\r\n" % len(piece) + piece + b"\r\n" for _ in range(TEN_MB // len(piece)))
    status, headers, body = _exchange(uvicorn_server, head, chunks)
    assert status == 413, (status, body[:200])
    assert json.loads(body)["limit"] == "body_size"


def test_a_body_under_the_cap_still_reaches_the_view(uvicorn_server):
    payload = json.dumps({"prompt": "a red circle"}).encode()
    head = (f"POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1:{uvicorn_server.port}\r\n"
            f"Authorization: Bearer nope\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n").encode()
    status, _, _ = _exchange(uvicorn_server, head, [payload])
    assert status == 401  # authentication ran on the whole body


@pytest.mark.parametrize("client", ["httpx", "http.client"])
def test_a_client_that_sends_its_whole_body_before_reading_gets_the_413(uvicorn_server, client):
    """Issue 44, item 10: a 10 MB body from a client without `Expect: 100-continue` (Python's
    http.client, httpx) met a connection reset, not the 413 the server sent: the server closed
    with the body unread. It now reads and discards the body, up to a bound, before closing."""
    import http.client

    body = b" " * (TEN_MB + 1024)
    if client == "httpx":
        response = httpx.post(f"{uvicorn_server.url}/api/v1/jobs", content=body,
                              headers={"Content-Type": "application/json"}, timeout=120)
        status, detail = response.status_code, response.json()
    else:
        conn = http.client.HTTPConnection(uvicorn_server.host, uvicorn_server.port, timeout=120)
        try:
            conn.request("POST", "/api/v1/jobs", body=body, headers={"Content-Type": "application/json"})
            answer = conn.getresponse()
            status, detail = answer.status, json.loads(answer.read())
        finally:
            conn.close()
    assert status == 413 and detail["limit"] == "body_size", (status, detail)
