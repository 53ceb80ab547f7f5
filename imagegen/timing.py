"""Where one unit of work's time goes: wall time, this thread's CPU time, database statements
and their time, Redis round trips and their time, plus what the code notes on the way (a prompt
check's batch size). Read by jobs/api/timing.py (a `Server-Timing` header on every answer) and
by the prompt-check task (a record per check in Redis), both only with IMAGEGEN_SERVER_TIMING
on: what bench/api_load.py --breakdown reports of the service as `make run` starts it.

Redis round trips are counted by wrapping redis-py's two entry points once per process (a
command: Redis.execute_command; a whole pipeline: Pipeline.execute); database statements by
Django's execute_wrapper. Only the thread that opened the tally is counted.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from django.db import connection

_local = threading.local()
_patched = False
RECORDS_KEPT = 20_000   # per kind, newest first (LTRIM)


def _count_redis(original):
    def wrapped(self, *args: Any, **kwargs: Any):
        tally = getattr(_local, "tally", None)
        if tally is None:
            return original(self, *args, **kwargs)
        began = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            tally["redis_n"] += 1
            tally["redis_s"] += time.perf_counter() - began
    return wrapped


def _patch_redis() -> None:
    global _patched
    if _patched:
        return
    redis.Redis.execute_command = _count_redis(redis.Redis.execute_command)  # type: ignore[method-assign]
    redis.client.Pipeline.execute = _count_redis(redis.client.Pipeline.execute)  # type: ignore[method-assign]
    _patched = True


@contextmanager
def tallied() -> Iterator[dict[str, Any]]:
    """Count this thread's work inside the block. The dict it yields holds, once the block
    ends: wall_s, cpu_s, db_n, db_s, redis_n, redis_s, and whatever `note` added."""
    _patch_redis()
    tally: dict[str, Any] = {"db_n": 0, "db_s": 0.0, "redis_n": 0, "redis_s": 0.0}

    def db(execute, sql, params, many, context):
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            tally["db_n"] += 1
            tally["db_s"] += time.perf_counter() - began

    outer = getattr(_local, "tally", None)
    _local.tally = tally
    wall, cpu = time.perf_counter(), time.thread_time()
    try:
        with connection.execute_wrapper(db):
            yield tally
    finally:
        _local.tally = outer
        tally["wall_s"] = time.perf_counter() - wall
        tally["cpu_s"] = time.thread_time() - cpu


def note(**values: Any) -> None:
    """Add facts to the open tally of this thread (nothing when none is open)."""
    tally = getattr(_local, "tally", None)
    if tally is not None:
        tally.update(values)


def records_key(kind: str) -> str:
    from imagegen.redis_client import PREFIX

    return f"{PREFIX}timing:{kind}"


def record(kind: str, tally: dict[str, Any]) -> None:
    """Keep one tally (in ms) under `kind` in Redis, for the benchmark to read; never raises."""
    from imagegen.redis_client import get_redis

    row = {k: round(v * 1000, 3) if k.endswith("_s") else v for k, v in tally.items()}
    try:
        pipe = get_redis().pipeline(transaction=False)
        pipe.lpush(records_key(kind), json.dumps(row))
        pipe.ltrim(records_key(kind), 0, RECORDS_KEPT - 1)
        pipe.execute()
    except redis.RedisError:
        pass


def read_records(kind: str) -> list[dict[str, Any]]:
    from imagegen.redis_client import get_redis

    return [json.loads(raw) for raw in get_redis().lrange(records_key(kind), 0, -1)]
