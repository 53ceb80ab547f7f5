"""One Redis client per process: scheduler state, cancel flags, the latest job state, metrics.

The client's pool is a blocking one sized to the process's threads (IMAGEGEN_REDIS_POOL_SIZE):
a thread that finds every connection in use waits up to IMAGEGEN_REDIS_POOL_TIMEOUT seconds for
one, then gets PoolBusy, which the API answers with 429 + Retry-After (busy), never a 503 or a
500. redis-py's default pool never waits: past its limit it raises "Too many connections".
"""

from __future__ import annotations

import threading
from typing import Any

import redis
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError

_client: redis.Redis | None = None
_lock = threading.Lock()

PREFIX = "ig:"


class PoolBusy(RedisConnectionError):
    """Every connection of this process's pool stayed in use for the pool timeout: the process
    is busy, Redis is not down."""


class _Pool(redis.BlockingConnectionPool):
    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().get_connection(*args, **kwargs)
        except RedisConnectionError as exc:
            if str(exc) == "No connection available.":  # the pool's own wait ran out
                raise PoolBusy(f"all {self.max_connections} Redis connections of this process are in use") from exc
            raise


def make_client(url: str | None = None, max_connections: int | None = None, timeout: float | None = None) -> Any:
    pool = _Pool.from_url(
        url or settings.REDIS_URL,
        max_connections=max_connections or settings.IMAGEGEN_REDIS_POOL_SIZE,
        timeout=settings.IMAGEGEN_REDIS_POOL_TIMEOUT if timeout is None else timeout,
        decode_responses=True,
        socket_timeout=10,
        socket_connect_timeout=5,
    )
    return redis.Redis(connection_pool=pool)


def get_redis() -> Any:
    """The client decodes answers to str (decode_responses=True), which redis-py's types cannot
    express: typed as Any rather than as a client whose every answer would be bytes | str."""
    global _client
    if _client is None:
        with _lock:  # threads of one web process share one pool
            if _client is None:
                _client = make_client()
    return _client
