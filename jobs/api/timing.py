"""A per-request breakdown in a `Server-Timing` header (IMAGEGEN_SERVER_TIMING, off by default):
wall time, this thread's CPU time, database statements and their time, Redis round trips and
their time, and the time the request waited for a thread (imagegen/threaded_http.py). What
bench/api_load.py --breakdown reads from the service as `make run` starts it.

    Server-Timing: total;dur=9.1, cpu;dur=6.2, db;dur=1.9;desc="10", redis;dur=0.8;desc="3", wait;dur=0.1
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from django.db import connection

_local = threading.local()
_patched = False


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
    """Count round trips: a command (Redis.execute_command) or a whole pipeline (execute)."""
    global _patched
    if _patched:
        return
    redis.Redis.execute_command = _count_redis(redis.Redis.execute_command)  # type: ignore[method-assign]
    redis.client.Pipeline.execute = _count_redis(redis.client.Pipeline.execute)  # type: ignore[method-assign]
    _patched = True


class ServerTimingMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        _patch_redis()

    def __call__(self, request):
        tally = {"db_n": 0, "db_s": 0.0, "redis_n": 0, "redis_s": 0.0}

        def db(execute, sql, params, many, context):
            began = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                tally["db_n"] += 1
                tally["db_s"] += time.perf_counter() - began

        _local.tally = tally
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            with connection.execute_wrapper(db):
                response = self.get_response(request)
        finally:
            _local.tally = None
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        wait = float(request.META.get("imagegen.thread_wait", 0.0))
        response["Server-Timing"] = (
            f"total;dur={wall * 1000:.2f}, cpu;dur={cpu * 1000:.2f}, "
            f'db;dur={tally["db_s"] * 1000:.2f};desc="{tally["db_n"]}", '
            f'redis;dur={tally["redis_s"] * 1000:.2f};desc="{tally["redis_n"]}", wait;dur={wait * 1000:.2f}'
        )
        return response
