"""GPU worker heartbeats: which workers of a lane are alive, and how busy each one is."""

from __future__ import annotations

import json
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


def capabilities_key(lane: str) -> str:
    return f"{PREFIX}capabilities:{lane}"


def capabilities(lane: str) -> dict | None:
    """What the lane's live workers said their model can honour (None: no worker said lately, or
    Redis cannot say: the worker still refuses what its model cannot do)."""
    try:
        raw = get_redis().get(capabilities_key(lane))
    except Exception:
        log.warning("could not read the capabilities of lane %s", lane, exc_info=True)
        return None
    return json.loads(raw) if raw else None


def _loop(lane: str, worker_id: str, caps: str | None) -> None:
    while not _stop.is_set():
        try:
            now = time.time()
            get_redis().zadd(workers_key(lane), {worker_id: now})
            get_redis().hset(busy_key(lane), worker_id, _busy_fraction(now))
            if caps is not None:
                get_redis().set(capabilities_key(lane), caps, ex=int(HEARTBEAT_TTL))
        except Exception:
            log.warning("heartbeat to Redis failed", exc_info=True)
        _stop.wait(HEARTBEAT_EVERY)


def start(lane: str, worker_id: str, caps: dict | None = None) -> None:
    """Heartbeats for one lane every HEARTBEAT_EVERY seconds, with the lane's model capabilities."""
    encoded = json.dumps(caps, sort_keys=True) if caps is not None else None
    threading.Thread(target=_loop, args=(lane, worker_id, encoded), name=f"heartbeat-{lane}", daemon=True).start()


def stop() -> None:
    _stop.set()
