"""API errors: DRF's field-error shape for 4xx; a clear 503 instead of a 500 when a backing
service (database, Redis) is down."""

from __future__ import annotations

import logging

from django.db import DatabaseError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

log = logging.getLogger(__name__)


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is not None:
        return response
    try:
        from redis.exceptions import RedisError
    except ImportError:  # pragma: no cover
        RedisError = ()  # type: ignore[assignment]
    if isinstance(exc, DatabaseError):
        log.error("database unavailable: %s", exc)
        return Response({"detail": "The database is unavailable; nothing was changed. Try again shortly."}, status=503, headers={"Retry-After": "5"})
    if isinstance(exc, RedisError):
        log.error("redis unavailable: %s", exc)
        return Response({"detail": "The queue service is unavailable. Try again shortly."}, status=503, headers={"Retry-After": "5"})
    return None
