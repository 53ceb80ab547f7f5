"""GPU worker start-up: load the model before the first token, and send heartbeats."""

from __future__ import annotations

import logging
import threading
import time

from celery.signals import worker_ready, worker_shutdown
from django.conf import settings

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


def busy_key(model_name: str) -> str:
    from gpu_tasks.redis_conn import PREFIX

    return f"{PREFIX}busy:{model_name}"


def busy_fractions(model_name: str) -> dict[str, float]:
    from gpu_tasks.redis_conn import get_redis

    live = set(live_workers(model_name))
    return {w: float(f) for w, f in get_redis().hgetall(busy_key(model_name)).items() if w in live}


def workers_key(model_name: str) -> str:
    from gpu_tasks.redis_conn import PREFIX

    return f"{PREFIX}workers:{model_name}"


def _heartbeat_loop(model_name: str, worker_id: str) -> None:
    from gpu_tasks.redis_conn import get_redis

    while not _stop.is_set():
        try:
            now = time.time()
            get_redis().zadd(workers_key(model_name), {worker_id: now})
            get_redis().hset(busy_key(model_name), worker_id, _busy_fraction(now))
        except Exception:
            log.warning("heartbeat to Redis failed", exc_info=True)
        _stop.wait(HEARTBEAT_EVERY)


def live_workers(model_name: str) -> list[str]:
    from gpu_tasks.redis_conn import get_redis

    r = get_redis()
    now = time.time()
    r.zremrangebyscore(workers_key(model_name), 0, now - HEARTBEAT_TTL)
    return list(r.zrangebyscore(workers_key(model_name), now - HEARTBEAT_TTL, "+inf"))


@worker_ready.connect
def _on_worker_ready(sender=None, **kwargs):
    consumer = getattr(sender, "task_consumer", None)
    queues = {q.name for q in consumer.queues} if consumer is not None else set()
    gpu_queues = [q for q in queues if q.startswith(settings.QUEUE_GPU_PREFIX)]
    if not gpu_queues:
        return
    from gpu_tasks.batch import WORKER_ID
    from gpu_tasks.pipeline import get_model

    model = get_model()  # load once, before the first batch, so no request pays for it
    if settings.IMAGEGEN_WARM_UP and settings.IMAGEGEN_ACCELERATOR == "real":
        from gpu_tasks.pipeline import warm_up

        log.info("warmed up every menu shape in %.1fs", warm_up(model))
    for queue in gpu_queues:
        model_name = queue[len(settings.QUEUE_GPU_PREFIX):]
        threading.Thread(target=_heartbeat_loop, args=(model_name, WORKER_ID), daemon=True).start()
    log.info("GPU worker ready for %s", ", ".join(gpu_queues))


@worker_shutdown.connect
def _on_worker_shutdown(**kwargs):
    _stop.set()
