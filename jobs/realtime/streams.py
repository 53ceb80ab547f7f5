"""A per-user cap on open event streams (websockets and SSE together), shared by every web
process: a sorted set per user in Redis, one member per open stream, scored by when it expires.
A stream refreshes its member while it lives (every IMAGEGEN_WATCH_REREAD_SECONDS) and removes
it when it ends; a web process that dies leaves members that expire on their own, so a crash
never locks a user out for longer than STREAM_TTL.

Async callers only: the Redis calls run in a worker thread with a deadline, so a Redis that is
down or hanging never stalls the event loop, and `acquire` tells the caller at once that the
stream cannot start (the SSE view answers 503 + Retry-After; the websocket closes 1013).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from asgiref.sync import sync_to_async
from django.conf import settings

from imagegen.redis_client import PREFIX, get_redis

log = logging.getLogger(__name__)

REDIS_DEADLINE = 3.0  # seconds a stream waits on Redis before giving up

_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
"""
_script = None


class StreamsUnavailable(Exception):
    """Redis could not be reached in time: the stream cannot start."""


def stream_ttl() -> float:
    return max(30.0, 4 * settings.IMAGEGEN_WATCH_REREAD_SECONDS)


def _key(user_id) -> str:
    return f"{PREFIX}streams:{user_id}"


def _acquire(user_id, member: str, cap: int) -> bool:
    global _script
    if _script is None:
        _script = get_redis().register_script(_ACQUIRE)
    now, ttl = time.time(), stream_ttl()
    return bool(_script(keys=[_key(user_id)], args=[now, now + ttl, cap, member, int(ttl * 1000)]))


def _refresh(user_id, member: str) -> None:
    pipe = get_redis().pipeline()
    pipe.zadd(_key(user_id), {member: time.time() + stream_ttl()})  # re-created after a Redis restart
    pipe.pexpire(_key(user_id), int(stream_ttl() * 1000))
    pipe.execute()


def _release(user_id, member: str) -> None:
    get_redis().zrem(_key(user_id), member)


async def _call(fn, *args):
    try:
        return await asyncio.wait_for(sync_to_async(fn, thread_sensitive=False)(*args), REDIS_DEADLINE)
    except (TimeoutError, OSError) as exc:
        raise StreamsUnavailable(str(exc) or type(exc).__name__) from exc
    except Exception as exc:  # redis errors, whatever their class
        from redis.exceptions import RedisError

        if isinstance(exc, RedisError):
            raise StreamsUnavailable(str(exc)) from exc
        raise


class StreamSlot:
    def __init__(self, user_id, member: str):
        self.user_id, self.member = user_id, member
        self.refreshed = time.monotonic()

    async def refresh(self) -> None:
        """Keep the slot (best effort; at most every IMAGEGEN_WATCH_REREAD_SECONDS)."""
        if time.monotonic() - self.refreshed < settings.IMAGEGEN_WATCH_REREAD_SECONDS:
            return
        self.refreshed = time.monotonic()
        try:
            await _call(_refresh, self.user_id, self.member)
        except StreamsUnavailable:
            pass  # Redis is away; the slot is re-created when it is back

    async def release(self) -> None:
        try:
            await _call(_release, self.user_id, self.member)
        except StreamsUnavailable:
            pass  # it expires by itself


async def acquire(user_id) -> StreamSlot | None:
    """A slot for one more stream of this user, or None past IMAGEGEN_USER_MAX_STREAMS.
    Raises StreamsUnavailable when Redis cannot be reached."""
    cap = settings.IMAGEGEN_USER_MAX_STREAMS
    member = uuid.uuid4().hex
    if not await _call(_acquire, user_id, member, cap):
        return None
    return StreamSlot(user_id, member)


def retry_after() -> int:
    """For a refused stream: when the oldest stream of the user could have gone (a guess)."""
    return max(1, int(settings.IMAGEGEN_WATCH_REREAD_SECONDS))
