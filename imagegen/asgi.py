"""ASGI entry point: websockets through Channels; HTTP through Django.

Sync views (the REST API, the page, the admin) run on a pool of threads per process
(imagegen/threaded_http.py) instead of Django's one thread per process under ASGI; async views
(the server-sent events stream) stay on the event loop through Django's ASGI handler. Serve it
with several processes on one port: `uvicorn imagegen.asgi:application --workers N` (what
`make run` starts), gunicorn with uvicorn workers, or daphne.
"""

import json
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")

from imagegen.lifetime import die_with_parent_if_asked  # noqa: E402

die_with_parent_if_asked()  # a uvicorn worker process goes with its master (imagegen/lifetime.py)

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from django.core.exceptions import ImproperlyConfigured  # noqa: E402

from imagegen import signing_credentials  # noqa: E402

try:  # a web process signs (a cached image converted to another format): it needs the key
    signing_credentials.require()
except signing_credentials.CredentialsError as _exc:
    raise ImproperlyConfigured(f"content credentials (a web process signs images): {_exc}") from None

from asgiref.sync import iscoroutinefunction  # noqa: E402
from channels.routing import URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.handlers.wsgi import WSGIHandler  # noqa: E402
from django.urls import Resolver404, get_resolver  # noqa: E402

from imagegen.threaded_http import ThreadedWSGI  # noqa: E402
from jobs.api.client_gone import ClientGone  # noqa: E402
from jobs.realtime.auth import OriginOrTokenScript, TokenOrSessionAuthMiddleware  # noqa: E402
from jobs.realtime.routing import websocket_urlpatterns  # noqa: E402

# Async views (the OpenAI-compatible wait, SSE) run on the event loop; ClientGone tells a waiting
# view its client has left (Django cannot cancel it past the sync-only WhiteNoise middleware).
async_http_app = ClientGone(django_asgi_app)
websocket_app = OriginOrTokenScript(TokenOrSessionAuthMiddleware(URLRouter(websocket_urlpatterns)))
# Django refuses bodies over DATA_UPLOAD_MAX_MEMORY_SIZE itself; never buffer more than that,
# on any route (BodyCap below), before any view or authentication runs.
MAX_BODY = (settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 10 * 1024 * 1024) + 64 * 1024
threaded_app = ThreadedWSGI(
    WSGIHandler(),
    threads=settings.IMAGEGEN_WEB_THREADS,
    backlog=settings.IMAGEGEN_WEB_BACKLOG,
    queue_timeout=settings.IMAGEGEN_WEB_QUEUE_TIMEOUT,
    max_body=MAX_BODY,
)


# A refused body is read and thrown away before the 413, up to these bounds (what nginx's lingering
# close does): a client that sends its whole body before reading (Python's http.client, most
# scripts; no `Expect: 100-continue`) then reads the answer instead of a connection reset.
LINGER_BYTES = 64 * 1024 * 1024
LINGER_IDLE_SECONDS = 2.0


async def _discard_body(receive, declared: int | None) -> None:
    """Read and drop the rest of a refused body: until its end, LINGER_BYTES, or a pause of
    LINGER_IDLE_SECONDS (a client that waits for the answer before sending more)."""
    import asyncio

    if declared is not None and declared > LINGER_BYTES:
        return
    read = 0
    while read <= LINGER_BYTES:
        try:
            message = await asyncio.wait_for(receive(), LINGER_IDLE_SECONDS)
        except TimeoutError:
            return
        if message["type"] != "http.request":
            return
        read += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def _too_large(send, limit: int) -> None:
    detail = json.dumps({"detail": f"The request body is over {limit} bytes.", "limit": "body_size"}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(detail)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": detail})


class BodyCap:
    """Every HTTP route, sync or async, refuses a body over `limit` bytes with a 413 and a JSON
    body before the app (authentication, parsers, Django's spooling to disk) sees any of it: at
    once from Content-Length, else (chunked) as soon as the bytes read pass the limit. The body
    under the limit is read here and handed on whole, followed by whatever the client sends
    next (a disconnect), so views that watch for one still see it."""

    def __init__(self, inner, limit: int):
        self.inner = inner
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0 or declared > self.limit:
                    await _discard_body(receive, declared if declared >= 0 else None)
                    return await _too_large(send, self.limit)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before its body was in
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                if message.get("more_body", False):
                    await _discard_body(receive, None)
                return await _too_large(send, self.limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        return await self.inner(scope, replay, send)


def is_async_view(path: str) -> bool:
    try:
        match = get_resolver().resolve(path)
    except Resolver404:
        return False
    return iscoroutinefunction(match.func)


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _route(scope, receive, send):
    if scope["type"] == "http":
        if is_async_view(scope["path"]):
            await async_http_app(scope, receive, send)
        else:
            await threaded_app(scope, receive, send)
    elif scope["type"] == "websocket":
        await websocket_app(scope, receive, send)
    elif scope["type"] == "lifespan":
        await _lifespan(receive, send)
    else:
        raise ValueError(f"unsupported ASGI scope type {scope['type']!r}")


application = BodyCap(_route, MAX_BODY)
