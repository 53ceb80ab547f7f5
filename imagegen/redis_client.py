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


# --- one round trip for a request's reads, one for its counters (the submit's hot path) ---

_batch = threading.local()


class batched:
    """Inside this block (one request's work, on one thread), writes passed to `write` are held
    and sent in one pipeline at the end, and reads queued with `read_ahead` ride in the next
    pipeline this thread sends through `pipeline_with_reads`. The held writes are counters and
    markers whose loss costs a figure, never a job: a failure to send them is logged, not raised
    (the block's work, a committed job, stands). Nested blocks join the outermost."""

    def __enter__(self) -> batched:
        self.outer = getattr(_batch, "writes", None) is None
        if self.outer:
            _batch.writes, _batch.ahead, _batch.got = [], [], {}
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.outer:
            return
        writes = _batch.writes
        _batch.writes = _batch.ahead = _batch.got = None
        if writes:
            try:
                pipe = get_redis().pipeline(transaction=False)
                for add in writes:
                    add(pipe)
                pipe.execute()
            except Exception:
                import logging

                logging.getLogger(__name__).warning("%d batched Redis writes not sent", len(writes), exc_info=True)


def write(add: Any) -> None:
    """`add(pipe)` queues commands: held for the block's one pipeline inside `batched`, else sent
    now (a pipeline of its own: one round trip)."""
    writes = getattr(_batch, "writes", None)
    if writes is not None:
        writes.append(add)
        return
    pipe = get_redis().pipeline(transaction=False)
    add(pipe)
    pipe.execute()


def read_ahead(*commands: tuple) -> None:
    """Queue read commands (("HMGET", key, field, ...), ("EXISTS", key)) to ride in this block's
    next pipeline; `reads` then answers them without a round trip. Outside `batched`: nothing."""
    ahead = getattr(_batch, "ahead", None)
    if ahead is not None:
        ahead.extend(c for c in commands if c not in ahead)


def pipeline_with_reads() -> tuple[Any, int]:
    """A pipeline with this block's queued reads already in it, and how many replies they take
    (the caller's own replies follow); pass the replies to `keep_reads`."""
    pipe = get_redis().pipeline(transaction=False)
    ahead = getattr(_batch, "ahead", None) or []
    for command in ahead:
        pipe.execute_command(*command)
    return pipe, len(ahead)


def keep_reads(replies: list, n: int) -> list:
    """Keep the first `n` replies (the queued reads') for `reads`; returns the caller's own."""
    got, ahead = getattr(_batch, "got", None), getattr(_batch, "ahead", None)
    if got is not None and ahead is not None and n:
        got.update(zip(ahead[:n], replies[:n], strict=True))
        del ahead[:n]
    return replies[n:]


def reads(*commands: tuple) -> list:
    """The answers to these read commands: those read ahead in this block (each used once),
    the others in one round trip."""
    got = getattr(_batch, "got", None) or {}
    missing = [c for c in commands if c not in got]
    fetched: dict = {}
    if missing:
        pipe = get_redis().pipeline(transaction=False)
        for command in missing:
            pipe.execute_command(*command)
        fetched = dict(zip(missing, pipe.execute(), strict=True))
    return [fetched[c] if c in fetched else got.pop(c) for c in commands]
