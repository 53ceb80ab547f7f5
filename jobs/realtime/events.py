"""Job events: published by workers to the channel layer group job.<id>.

The latest status/progress is also kept in Redis so that a late subscriber (websocket or SSE)
or a poll sees the current state at once; the channel layer alone is at-most-once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from imagegen.redis_client import PREFIX, get_redis

log = logging.getLogger(__name__)

STATE_TTL = 24 * 3600


def group_name(job_id) -> str:
    return f"job.{job_id}"


def _state_key(job_id) -> str:
    return f"{PREFIX}state:{job_id}"


_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0
_loop_lock = threading.Lock()
SEND_TIMEOUT = 5.0


def _publisher_loop() -> asyncio.AbstractEventLoop:
    """One event loop thread per process for group sends.

    async_to_sync() would make a fresh loop per call, and channels_redis keeps its connection
    pools per loop, so every event paid a new Redis connection (about 4-5 ms each, measured).
    A long-lived loop keeps the pool warm: well under a millisecond per event. Re-created after
    a fork (a prefork Celery child inherits the object but not the thread).
    """
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid() or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="job-events-publisher", daemon=True).start()
            _loop, _loop_pid = loop, os.getpid()
        return _loop


def _group_send(group: str, message: dict) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        future = asyncio.run_coroutine_threadsafe(get_channel_layer().group_send(group, message), _publisher_loop())
        future.result(timeout=SEND_TIMEOUT)
        return
    # Called from inside a running loop's thread: async_to_sync raises there, and that is logged.
    async_to_sync(get_channel_layer().group_send)(group, message)


def stamp(job_id, event: dict) -> dict:
    """The event as sent: with its job id, and for progress the wall-clock send time
    (`sent_at`, seconds since the epoch) so a watcher on a synchronised clock can measure
    delivery latency (bench/websocket_watchers.py does). Call it where the event is made (the
    step callback), so time spent in a publishing queue counts too."""
    event = {**event, "job": str(job_id)}
    if event["type"] == "progress":
        event.setdefault("sent_at", time.time())
    return event


def publish(job_id, event: dict) -> None:
    """Send one event to the job's watchers. Never raises: events are best effort, the row is truth."""
    event = stamp(job_id, event)
    try:
        if event["type"] in ("status", "progress"):
            get_redis().set(_state_key(job_id), json.dumps(event), ex=STATE_TTL)
        _group_send(group_name(job_id), {"type": "job.event", "event": event})
    except Exception:  # a watcher outage must not fail a generation
        log.exception("could not publish %s event for job %s", event.get("type"), job_id)


def last_state(job_id) -> dict | None:
    raw = get_redis().get(_state_key(job_id))
    return json.loads(raw) if raw else None


def publish_status(sender=None, job_ids=(), **kwargs) -> None:
    """Receiver of jobs.actions.notify.status_committed: each job's status event, after the
    transaction that changed it committed."""
    from jobs.models import GenerationJob
    from jobs.representation import status_event

    for job in GenerationJob.objects.filter(id__in=list(job_ids)).prefetch_related("images"):
        publish(job.id, status_event(job))
