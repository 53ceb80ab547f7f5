"""Sync Django views on a pool of threads, inside an ASGI server.

Under ASGI, Django runs every sync view through `sync_to_async(thread_sensitive=True)`: one
thread per process, so one slow request (a database wait, a Redis round trip) holds up every
other. This ASGI app runs the plain WSGI handler on IMAGEGEN_WEB_THREADS threads instead, and
keeps the event loop for what needs it (websockets, server-sent events: imagegen/asgi.py routes
those to Django's ASGI handler and Channels).

Admission is bounded: at most threads + IMAGEGEN_WEB_BACKLOG requests are in the process at
once, and one that waited IMAGEGEN_WEB_QUEUE_TIMEOUT seconds for a thread is not run. Both
answer 429 + Retry-After naming the pool (`web_backlog`, `web_threads`) and the time waited, so a burst is shed cheaply instead of queueing without bound (the
latency a client sees stays bounded, and nothing ever times out as a 5xx).
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

BUSY_RETRY_AFTER = 1
BUSY_DETAIL = "The service is busy; try again shortly."

Message = dict[str, Any]
Send = Callable[[Message], Any]


def busy_response(pool: str, waited: float) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The shed answer: which pool was full (`web_backlog`: threads and backlog all taken, shed
    on arrival; `web_threads`: waited the queue timeout for a thread) and how long it waited."""
    body = json.dumps({"detail": f"{BUSY_DETAIL} ({pool} full; waited {waited:.3f}s)", "limit": "server_busy",
                       "eta_seconds": None, "retry_after": BUSY_RETRY_AFTER, "pool": pool,
                       "waited_seconds": round(waited, 3)}).encode()
    return 429, [(b"content-type", b"application/json"), (b"retry-after", str(BUSY_RETRY_AFTER).encode()),
                 (b"content-length", str(len(body)).encode())], body


def build_environ(scope: dict, body: bytes) -> dict:
    """A WSGI environ (PEP 3333) for an ASGI HTTP scope."""
    path = scope.get("path", "/")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    server = scope.get("server") or ("localhost", 80)
    client = scope.get("client") or ("", 0)
    environ = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": root.encode("utf8").decode("latin1"),
        "PATH_INFO": path.encode("utf8").decode("latin1"),
        "QUERY_STRING": scope.get("query_string", b"").decode("latin1"),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1] or 80),
        "REMOTE_ADDR": str(client[0]),
        "REMOTE_PORT": str(client[1]),
        "SERVER_PROTOCOL": "HTTP/" + scope.get("http_version", "1.1"),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin1").lower()
        value = raw_value.decode("latin1")
        if name == "content-type":
            environ["CONTENT_TYPE"] = value
            continue
        if name == "content-length":
            environ["CONTENT_LENGTH"] = value
            continue
        key = "HTTP_" + name.upper().replace("-", "_")
        if key in environ:
            value = environ[key] + ("; " if name == "cookie" else ",") + value
        environ[key] = value
    return environ


class TooLarge(Exception):
    pass


async def _read_body(receive: Callable[[], Any], limit: int) -> bytes | None:
    """The whole request body, or None if the client went away first; TooLarge past `limit`
    bytes (the API takes small JSON bodies: nothing is buffered without bound)."""
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class ThreadedWSGI:
    """An ASGI app that runs `wsgi_app` on a bounded pool of threads."""

    def __init__(self, wsgi_app: Callable, threads: int, backlog: int, queue_timeout: float,
                 max_body: int = 10 * 1024 * 1024):
        self.wsgi_app = wsgi_app
        self.max_body = max_body
        self.threads = max(1, threads)
        self.limit = self.threads + max(0, backlog)
        self.queue_timeout = queue_timeout
        self.in_flight = 0  # touched only on the event loop's thread
        self.shed = 0
        self.executor = ThreadPoolExecutor(self.threads, thread_name_prefix="web")

    async def __call__(self, scope: dict, receive: Callable, send: Send) -> None:
        try:
            body = await _read_body(receive, self.max_body)
        except TooLarge:
            detail = json.dumps({"detail": f"The request body is over {self.max_body} bytes."}).encode()
            await self._send_whole(send, 413, [(b"content-type", b"application/json"),
                                               (b"content-length", str(len(detail)).encode())], detail)
            return
        if body is None:
            return
        if self.in_flight >= self.limit:
            self.shed += 1
            await self._send_whole(send, *busy_response("web_backlog", 0.0))
            return
        loop = asyncio.get_running_loop()
        self.in_flight += 1
        # The client's disconnect while the view runs, for a view that waits (a `Prefer: wait`
        # submit): its thread is released at once (jobs/api/prefer.py).
        gone = threading.Event()

        async def watch() -> None:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()

        watcher = asyncio.ensure_future(watch())
        try:
            answer = await loop.run_in_executor(self.executor, self._run, scope, body, send, loop, time.monotonic(), gone)
        finally:
            self.in_flight -= 1
            watcher.cancel()
        if answer is not None:
            await self._send_whole(send, *answer)

    @staticmethod
    async def _send_whole(send: Send, status: int, headers: list, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _run(self, scope: dict, body: bytes, send: Send, loop: asyncio.AbstractEventLoop, queued_at: float,
             gone: threading.Event | None = None):
        """On a pool thread: the whole answer for a plain response (sent by the loop, one hop),
        or None after streaming a streaming response chunk by chunk from here."""
        waited = time.monotonic() - queued_at
        if waited > self.queue_timeout:
            self.shed += 1
            return busy_response("web_threads", waited)
        started: dict = {}

        def start_response(status: str, headers: list, exc_info=None):
            started["status"] = int(status.split(" ", 1)[0])
            started["headers"] = [(k.lower().encode("latin1"), v.encode("latin1")) for k, v in headers]
            return lambda data: None  # the legacy write() callable; Django never uses it

        environ = build_environ(scope, body)
        environ["imagegen.thread_wait"] = waited  # for the Server-Timing breakdown (jobs/api/timing.py)
        environ["imagegen.client_gone"] = gone  # jobs/api/prefer.py CLIENT_GONE
        result = self.wsgi_app(environ, start_response)
        try:
            if not getattr(result, "streaming", False):
                return started["status"], started["headers"], b"".join(result)

            def push(message: Message) -> None:
                asyncio.run_coroutine_threadsafe(send(message), loop).result()

            push({"type": "http.response.start", "status": started["status"], "headers": started["headers"]})
            for chunk in result:
                if chunk:
                    push({"type": "http.response.body", "body": chunk, "more_body": True})
            push({"type": "http.response.body", "body": b""})
            return None
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
