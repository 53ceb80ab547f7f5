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
_stop = threading.Event()


def workers_key(model_name: str) -> str:
    from gpu_tasks.redis_conn import PREFIX

    return f"{PREFIX}workers:{model_name}"


def _heartbeat_loop(model_name: str, worker_id: str) -> None:
    from gpu_tasks.redis_conn import get_redis

    while not _stop.is_set():
        try:
            get_redis().zadd(workers_key(model_name), {worker_id: time.time()})
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

    get_model()  # load once, before the first batch, so no request pays for it
    for queue in gpu_queues:
        model_name = queue[len(settings.QUEUE_GPU_PREFIX):]
        threading.Thread(target=_heartbeat_loop, args=(model_name, WORKER_ID), daemon=True).start()
    log.info("GPU worker ready for %s", ", ".join(gpu_queues))


@worker_shutdown.connect
def _on_worker_shutdown(**kwargs):
    _stop.set()
