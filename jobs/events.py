"""Job events: published by workers to the channel layer group job.<id>.

The latest status/progress is also kept in Redis so that a late subscriber (websocket or SSE)
or a poll sees the current state at once; the channel layer alone is at-most-once.
"""

from __future__ import annotations

import json
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from gpu_tasks.redis_conn import PREFIX, get_redis

log = logging.getLogger(__name__)

STATE_TTL = 24 * 3600


def group_name(job_id) -> str:
    return f"job.{job_id}"


def _state_key(job_id) -> str:
    return f"{PREFIX}state:{job_id}"


def publish(job_id, event: dict) -> None:
    """Send one event to the job's watchers. Never raises: events are best effort, the row is truth."""
    event = {**event, "job": str(job_id)}
    try:
        if event["type"] in ("status", "progress"):
            get_redis().set(_state_key(job_id), json.dumps(event), ex=STATE_TTL)
        async_to_sync(get_channel_layer().group_send)(
            group_name(job_id), {"type": "job.event", "event": event}
        )
    except Exception:  # a watcher outage must not fail a generation
        log.exception("could not publish %s event for job %s", event.get("type"), job_id)


def last_state(job_id) -> dict | None:
    raw = get_redis().get(_state_key(job_id))
    return json.loads(raw) if raw else None
