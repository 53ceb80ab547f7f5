"""Shared by the websocket consumer and the SSE view: who is asking, and the current state."""

from __future__ import annotations

import asyncio
import logging
import weakref

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth.models import AnonymousUser

from jobs.events import group_name, last_state

try:  # pragma: no branch
    from channels_redis.core import RedisChannelLayer

    # channels_redis blocks in BZPOPMIN for brpop_timeout (5 s) per receive, and redis-py 8
    # gives every connection a default socket_timeout of 5 s: the read timer can fire before
    # the server's empty reply arrives, and the receive raises TimeoutError, which kills the
    # consumer (close 1011) of any socket idle for ~5 s. Block for less than the socket
    # timeout. The proper fix is a socket_timeout in CHANNEL_LAYERS (see docs/events.md).
    if RedisChannelLayer.brpop_timeout >= 5:
        RedisChannelLayer.brpop_timeout = 2
except ImportError:  # another channel layer backend
    pass
from jobs.models import GenerationJob, JobStatus
from jobs.serializers import status_event

log = logging.getLogger(__name__)


def _token_user(header: str):
    from rest_framework.authtoken.models import Token

    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != "token":
        return None
    token = Token.objects.select_related("user").filter(key=parts[1]).first()
    if token is None or not token.user.is_active:
        return None
    return token.user


@database_sync_to_async
def authenticate_header_or_session(header: str, request=None):
    if header:
        return _token_user(header)
    if request is not None:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return user
    return None


@database_sync_to_async
def token_user(header: str):
    return _token_user(header) or AnonymousUser()


@database_sync_to_async
def owned_job(user, job_id) -> GenerationJob | None:
    if user is None or not user.is_authenticated:
        return None
    return GenerationJob.objects.visible().filter(id=job_id, owner=user).first()


@database_sync_to_async
def current_events(job_id, status_only: bool = False) -> list[dict]:
    """The status from the database row, then the latest progress while it runs."""
    job = GenerationJob.objects.prefetch_related("images").filter(id=job_id).first()
    if job is None:  # deleted meanwhile: nothing to replay, the stream ends
        return [{"type": "status", "job": str(job_id), "status": "deleted", "reason": "the job was deleted", "images": []}]
    events = [status_event(job)]
    if not status_only and job.status == JobStatus.RUNNING:
        last = last_state(job_id)
        if last and last.get("type") == "progress":
            events.append(last)
    return events


TERMINAL = frozenset({"done", "blocked", "failed", "cancelled", "deleted"})


class EventOrder:
    """Keeps one watcher's stream in order across the replay / live seam.

    A watcher joins the group first and then reads the current state, so a live event that was
    already in flight can arrive after the replayed state: drop a repeated status, progress or
    previews at or below the last step already sent, and everything after a terminal status.
    A status change (a requeued job runs again from step 1) resets the step.
    """

    def __init__(self):
        self.status = None
        self.step = 0
        self.finished = False

    def admit(self, event: dict) -> bool:
        if self.finished:
            return False
        kind = event.get("type")
        if kind == "status":
            if event.get("status") == self.status:
                return False
            self.status = event.get("status")
            self.step = 0
            self.finished = self.status in TERMINAL
            return True
        if kind == "progress":
            if event.get("step", 0) <= self.step:
                return False
            self.step = event["step"]
            return True
        if kind == "preview":
            return event.get("step", 0) >= self.step
        return True


# --- one channel-layer subscription per job per process ----------------------------------


class _Subscription:
    def __init__(self, hub: JobHub, job_id: str):
        self.hub = hub
        self.job_id = job_id
        self.queue: asyncio.Queue = asyncio.Queue()

    async def close(self) -> None:
        await self.hub.unsubscribe(self)


class JobHub:
    """Fans a job's events out to every watcher in this process from ONE channel-layer channel.

    With a channel per watcher, channels_redis moves each event through Redis once per watcher
    (a Lua group send, then a blocking pop, a backup write and a cleanup per message on the
    receiving side); 50 watchers meant 50 round trips per step and a p99 over the goal. Here
    the group has one member per job per web process: the process pops each event once and
    puts it on the watchers' local queues, in order.
    """

    def __init__(self):
        self.subscribers: dict[str, set[_Subscription]] = {}
        self.readers: dict[str, tuple[str, asyncio.Task]] = {}
        self.lock = asyncio.Lock()

    async def subscribe(self, job_id) -> _Subscription:
        job_id = str(job_id)
        sub = _Subscription(self, job_id)
        async with self.lock:
            self.subscribers.setdefault(job_id, set()).add(sub)
            if job_id not in self.readers:
                layer = get_channel_layer()
                channel = await layer.new_channel()
                # Joined before the caller reads the current state: nothing falls in between.
                await layer.group_add(group_name(job_id), channel)
                self.readers[job_id] = (channel, asyncio.create_task(self._read(job_id, channel)))
        return sub

    async def unsubscribe(self, sub: _Subscription) -> None:
        async with self.lock:
            subs = self.subscribers.get(sub.job_id)
            if subs is None:
                return
            subs.discard(sub)
            if subs:
                return
            del self.subscribers[sub.job_id]
            channel, task = self.readers.pop(sub.job_id)
            task.cancel()
            try:
                await get_channel_layer().group_discard(group_name(sub.job_id), channel)
            except Exception:  # the group entry expires by itself
                log.warning("could not leave the group of job %s", sub.job_id, exc_info=True)

    async def _read(self, job_id: str, channel: str) -> None:
        layer = get_channel_layer()
        while True:
            try:
                message = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # a Redis hiccup must not end every watcher's stream
                log.warning("receiving events of job %s failed; retrying", job_id, exc_info=True)
                await asyncio.sleep(0.2)
                continue
            event = message.get("event")
            if event is None:
                continue
            for sub in list(self.subscribers.get(job_id, ())):
                sub.queue.put_nowait(event)


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, JobHub] = weakref.WeakKeyDictionary()


def job_hub() -> JobHub:
    """The hub of the running event loop (daphne has one; tests may run several in turn)."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = JobHub()
    return hub
