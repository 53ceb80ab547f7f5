"""API errors: DRF's field-error shape for 4xx; a clear 503 instead of a 500 when a backing
service (database, Redis) is down; 429 + Retry-After when the process is merely busy (a
connection pool stayed full for its timeout, SQLite's write lock stayed taken); a 4xx instead of a 500 for input that only the database
layer recognises as invalid (a forged pagination cursor, a NUL byte on PostgreSQL).

Two entry points:

- ``exception_handler`` (REST_FRAMEWORK["EXCEPTION_HANDLER"]): every DRF view. Errors raised
  while authenticating (the token lookup) happen inside DRF's dispatch, so they come here too.
- ``ServiceUnavailableMiddleware``: the same mapping for the plain Django views (the SSE stream
  /api/v1/jobs/{id}/events, /media/, /staff/images/...), which DRF's handler never sees. Add
  ``"jobs.api.errors.ServiceUnavailableMiddleware"`` to MIDDLEWARE (it handles sync and async
  views) to cover them; see docs/reliability.md.
"""

from __future__ import annotations

import logging

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DatabaseError
from django.http import Http404, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from jobs.access.throttles import RateLimited

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5
DATABASE_DOWN = "The database is unavailable; nothing was changed. Try again shortly."
REDIS_DOWN = "The queue service is unavailable. Try again shortly."
BUSY = "The service is busy; try again shortly."
BUSY_RETRY_AFTER_SECONDS = 1


def _redis_error_class():
    try:
        from redis.exceptions import RedisError
    except ImportError:  # pragma: no cover
        return ()
    return RedisError


def _is_broker_error(exc: BaseException) -> bool:
    try:
        from kombu.exceptions import OperationalError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, OperationalError)


def _is_nul_error(exc: BaseException) -> bool:
    # psycopg: "A string literal cannot contain NUL (0x00) characters."
    return isinstance(exc, ValueError) and "NUL (0x00)" in str(exc)


def busy_pool(exc: BaseException) -> tuple[str, float | None] | None:
    """(the pool that was full, how long the request waited for it) when a local resource ran
    out, not a dependency: this process's Redis pool stayed full for its timeout (`redis`), a
    non-blocking Redis pool hit its limit, SQLite's write lock stayed taken past its timeout
    (`database_lock`), or a database pool had no free connection in time (`database`). Each
    of these waits its pool's whole timeout before it fails, so that is the time waited."""
    try:
        from redis.exceptions import MaxConnectionsError

        from imagegen.redis_client import PoolBusy
    except ImportError:  # pragma: no cover
        return None
    if isinstance(exc, PoolBusy):
        return "redis", settings.IMAGEGEN_REDIS_POOL_TIMEOUT
    if isinstance(exc, MaxConnectionsError):
        return "redis", 0.0
    if isinstance(exc, DatabaseError) and "database is locked" in str(exc):
        return "database_lock", settings.DATABASES["default"].get("OPTIONS", {}).get("timeout")
    if type(exc).__name__ == "PoolTimeout" or type(getattr(exc, "__cause__", None)).__name__ == "PoolTimeout":
        return "database", None
    return None


def _is_busy(exc: BaseException) -> bool:
    return busy_pool(exc) is not None


def busy(exc: BaseException) -> RateLimited:
    """The server_busy 429, naming the pool that was full and how long the request waited."""
    pool, waited = busy_pool(exc) or ("unknown", None)
    said = f" ({pool} full" + (f"; waited {waited:g}s)" if waited is not None else ")")
    return RateLimited(BUSY_RETRY_AFTER_SECONDS, "server_busy", BUSY + said, pool=pool, waited_seconds=waited)


def classify(exc: BaseException, request=None) -> tuple[int, str] | None:
    """(status, detail) for the exceptions this module maps, else None."""
    if _is_busy(exc):
        log.warning("busy: %s", exc)
        return 429, BUSY
    if isinstance(exc, DatabaseError):
        log.error("database unavailable: %s", exc)
        return 503, DATABASE_DOWN
    redis_error = _redis_error_class()
    if redis_error and isinstance(exc, redis_error):
        log.error("redis unavailable: %s", exc)
        return 503, REDIS_DOWN
    if _is_broker_error(exc):
        # The task could not be sent (broker down, e.g. RabbitMQ while Redis is up). NB: when
        # this comes from an on_commit hook the job row is already committed; the reaper
        # re-sends its prompt check (jobs.actions.rebuild_scheduler_state).
        log.error("broker unavailable: %s", exc)
        return 503, REDIS_DOWN
    if isinstance(exc, DjangoValidationError):
        # A value that passed the view but not the model field: in this API only a forged or
        # corrupted pagination cursor gets that far (DRF answers 404 "Invalid cursor" for
        # the cursors it can decode itself, so the same here).
        params = getattr(request, "GET", None) if request is not None else None
        if params is not None and "cursor" in params:
            return 404, "Invalid cursor"
        return 400, "Invalid request: " + "; ".join(exc.messages)[:500]
    if isinstance(exc, RecursionError):
        # json.loads of a body nested thousands of levels deep (DRF's JSONParser catches only
        # ValueError, so it would be a 500).
        return 400, "JSON parse error - the body is nested too deeply."
    if _is_nul_error(exc):
        return 400, "Text fields must not contain NUL (0x00) characters."
    return None


@csrf_exempt  # a 404 for any method: never Django's HTML CSRF page
def unknown_route(request, path: str = ""):
    """Any path under /api that is not a route (a malformed id included): JSON, never HTML."""
    return json_error(404, "Not found.")


def exception_handler(exc, context):
    if isinstance(exc, Http404):  # its message names the model ("No GenerationJob matches ..."): not for clients
        exc = NotFound()
    response = drf_exception_handler(exc, context)
    if response is not None:
        return response
    request = context.get("request")
    mapped = classify(exc, request)
    if mapped is None:
        return None
    status, detail = mapped
    if status == 429:  # every 429 is a Throttled, answered by DRF's own handler
        return drf_exception_handler(busy(exc), context)
    return Response(_body(status, detail), status=status, headers=_retry_after(status))


def _retry_after(status: int) -> dict[str, str] | None:
    if status == 503:
        return {"Retry-After": str(RETRY_AFTER_SECONDS)}
    if status == 429:
        return {"Retry-After": str(BUSY_RETRY_AFTER_SECONDS)}
    return None


def _body(status: int, detail: str) -> dict:
    if status == 429:  # the 429 shape of the contract: {detail, limit, eta_seconds, retry_after}
        return {"detail": detail, "limit": "server_busy", "eta_seconds": None, "retry_after": BUSY_RETRY_AFTER_SECONDS}
    return {"detail": detail}


def json_error(status: int, detail: str) -> JsonResponse:
    return JsonResponse(_body(status, detail), status=status, headers=_retry_after(status))


class ServiceUnavailableMiddleware:
    """503 + Retry-After (never 500) for plain Django views when the database or Redis is down,
    and the same 4xx mapping as the DRF handler. Sync and async capable."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(self.get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self.__acall__(request)
        return self.get_response(request)

    async def __acall__(self, request):
        return await self.get_response(request)

    def process_exception(self, request, exc):
        mapped = classify(exc, request)
        if mapped is None:
            return None
        if mapped[0] == 429:
            limited = busy(exc)
            return JsonResponse(limited.detail, status=429, headers={"Retry-After": str(limited.wait)})
        return json_error(*mapped)
