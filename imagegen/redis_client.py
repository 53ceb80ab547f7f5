"""One Redis client per process: scheduler state, cancel flags, the latest job state, metrics."""

from __future__ import annotations

from typing import Any

import redis
from django.conf import settings

_client: redis.Redis | None = None

PREFIX = "ig:"


def get_redis() -> Any:
    """The client decodes answers to str (decode_responses=True), which redis-py's types cannot
    express: typed as Any rather than as a client whose every answer would be bytes | str."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True, socket_timeout=10)
    return _client
