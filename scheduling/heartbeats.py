"""GPU worker heartbeats: which workers of a lane are alive, and how busy each one is."""

from __future__ import annotations

import logging
import threading
import time

from imagegen.redis_client import PREFIX, get_redis

log = logging.getLogger(__name__)

HEARTBEAT_EVERY = 2.0
HEARTBEAT_TTL = 10.0
BUSY_WINDOW = 60.0
_stop = threading.Event()
_busy_lock = threading.Lock()
_busy_spans: list[tuple[float, float]] = []  # (start, end) of recent pipeline passes


def record_busy(start: float, end: float) -> None:
    """Called after each pass (time.time() values) for the busy-fraction gauge."""
    with _busy_lock:
        _busy_spans.append((start, end))


def _busy_fraction(now: float) -> float:
    cutoff = now - BUSY_WINDOW
    with _busy_lock:
        _busy_spans[:] = [(a, b) for a, b in _busy_spans if b > cutoff]
        busy = sum(b - max(a, cutoff) for a, b in _busy_spans)
    return min(1.0, busy / BUSY_WINDOW)


def busy_key(lane: str) -> str:
    return f"{PREFIX}busy:{lane}"


def workers_key(lane: str) -> str:
    return f"{PREFIX}workers:{lane}"


def busy_fractions(lane: str) -> dict[str, float]:
    live = set(live_workers(lane))
    return {w: float(f) for w, f in get_redis().hgetall(busy_key(lane)).items() if w in live}


def live_workers(lane: str) -> list[str]:
    r = get_redis()
    now = time.time()
    r.zremrangebyscore(workers_key(lane), 0, now - HEARTBEAT_TTL)
    return list(r.zrangebyscore(workers_key(lane), now - HEARTBEAT_TTL, "+inf"))


def _loop(lane: str, worker_id: str) -> None:
    while not _stop.is_set():
        try:
            now = time.time()
            get_redis().zadd(workers_key(lane), {worker_id: now})
            get_redis().hset(busy_key(lane), worker_id, _busy_fraction(now))
        except Exception:
            log.warning("heartbeat to Redis failed", exc_info=True)
        _stop.wait(HEARTBEAT_EVERY)


def start(lane: str, worker_id: str) -> None:
    threading.Thread(target=_loop, args=(lane, worker_id), name=f"heartbeat-{lane}", daemon=True).start()


def stop() -> None:
    _stop.set()
