"""A per-request breakdown in a `Server-Timing` header (IMAGEGEN_SERVER_TIMING, off by default):
wall time, this thread's CPU time, database statements and their time, Redis round trips and
their time (imagegen/timing.py counts them), and the time the request waited for a thread
(imagegen/threaded_http.py). What bench/api_load.py --breakdown reads from the service as
`make run` starts it.

    Server-Timing: total;dur=9.1, cpu;dur=6.2, db;dur=1.9;desc="10", redis;dur=0.8;desc="3", wait;dur=0.1
"""

from __future__ import annotations

from imagegen.timing import tallied


class ServerTimingMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        with tallied() as tally:
            response = self.get_response(request)
        wait = float(request.META.get("imagegen.thread_wait", 0.0))
        response["Server-Timing"] = (
            f"total;dur={tally['wall_s'] * 1000:.2f}, cpu;dur={tally['cpu_s'] * 1000:.2f}, "
            f'db;dur={tally["db_s"] * 1000:.2f};desc="{tally["db_n"]}", '
            f'redis;dur={tally["redis_s"] * 1000:.2f};desc="{tally["redis_n"]}", wait;dur={wait * 1000:.2f}'
        )
        return response
