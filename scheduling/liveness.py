"""Every Celery worker's liveness, whatever its process type: a heartbeat per node (`cpu@host`,
`classify@host`, ...) with the queues it consumes, so an operator sees a host that stopped
consuming a queue within one TTL (`/metrics`: imagegen_worker_up, imagegen_worker_heartbeat_age_seconds,
imagegen_queue_consumers; the staff dashboard). The GPU lanes' own heartbeats (busy fraction,
capabilities) stay in scheduling/heartbeats.py.

Started on Celery's worker_ready in the worker's main process (jobs/apps.py connects it); a
node not heard of for FORGET_SECONDS is dropped from the list."""

from __future__ import annotations

import json
import logging
import threading
import time

from imagegen.redis_client import PREFIX, get_redis

log = logging.getLogger(__name__)

EVERY = 2.0
TTL = 10.0
FORGET_SECONDS = 3600.0
NODES_KEY = f"{PREFIX}nodes"  # sorted set: node -> time of its last heartbeat
QUEUES_KEY = f"{PREFIX}node-queues"  # hash: node -> JSON list of the queues it consumes
_stop = threading.Event()


def beat(node: str, queues: list[str], now: float | None = None) -> None:
    r = get_redis()
    r.zadd(NODES_KEY, {node: time.time() if now is None else now})
    r.hset(QUEUES_KEY, node, json.dumps(sorted(queues)))


def nodes(now: float | None = None) -> dict[str, dict]:
    """node -> {age (seconds since its last heartbeat), live, queues}."""
    r = get_redis()
    now = time.time() if now is None else now
    gone = r.zrangebyscore(NODES_KEY, 0, now - FORGET_SECONDS)
    if gone:
        r.zrem(NODES_KEY, *gone)
        r.hdel(QUEUES_KEY, *gone)
    queues = r.hgetall(QUEUES_KEY)
    return {
        node: {"age": max(0.0, now - float(at)), "live": now - float(at) <= TTL, "queues": json.loads(queues.get(node, "[]"))}
        for node, at in r.zrange(NODES_KEY, 0, -1, withscores=True)
    }


def consumers(expected: set[str], now: float | None = None) -> dict[str, int]:
    """Live nodes consuming each queue: every queue in `expected` (0 when none does) and any
    other queue a live node consumes."""
    counts = dict.fromkeys(expected, 0)
    for info in nodes(now).values():
        if info["live"]:
            for queue in info["queues"]:
                counts[queue] = counts.get(queue, 0) + 1
    return counts


def _loop(node: str, queues: list[str]) -> None:
    while not _stop.is_set():
        try:
            beat(node, queues)
        except Exception:
            log.warning("liveness heartbeat to Redis failed", exc_info=True)
        _stop.wait(EVERY)


def start_for_worker(sender=None, **kwargs) -> None:
    """worker_ready: heartbeats for this node and the queues its consumer reads."""
    node = getattr(sender, "hostname", None) or "unknown"
    try:
        queues = [q.name for q in sender.task_consumer.queues]
    except AttributeError:
        queues = []
    threading.Thread(target=_loop, args=(node, queues), name="liveness", daemon=True).start()


def stop() -> None:
    _stop.set()
