"""Shared by the websocket consumer and the SSE view: who is asking, and the current state."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import cast

from channels import DEFAULT_CHANNEL_LAYER
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from redis.exceptions import RedisError

from jobs.realtime.events import group_name, last_state

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
from jobs.representation import status_event

log = logging.getLogger(__name__)


def _token_user(header: str):
    """The user an `Authorization` header names, by the API's own token authentication class
    (the same parsing, lookup and checks as every REST request); None for anything else."""
    from rest_framework import exceptions
    from rest_framework.request import Request

    from jobs.access.tokens import HashedTokenAuthentication

    try:
        # DRF's authentication reads only request.headers: the header is all it needs.
        result = HashedTokenAuthentication().authenticate(cast(Request, SimpleNamespace(headers={"authorization": header})))
    except exceptions.AuthenticationFailed:
        return None
    return result[0] if result else None


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


def _current_events(job_id, status_only: bool = False) -> list[dict]:
    """The status from the database row, then the latest progress while it runs."""
    job = GenerationJob.objects.prefetch_related("images").filter(id=job_id).first()
    if job is None:  # deleted meanwhile: nothing to replay, the stream ends
        return [{"type": "status", "job": str(job_id), "status": "deleted", "reason": "the job was deleted", "images": []}]
    events = [status_event(job)]
    if not status_only and job.status == JobStatus.RUNNING:
        try:
            last = last_state(job_id)
        except RedisError:  # the row is enough to start with; progress follows live
            last = None
        if last and last.get("type") == "progress":
            events.append(last)
    return events


current_events = database_sync_to_async(_current_events)

# The hub's periodic re-reads (_Reader._reread) belong to no request or handler, so asgiref ran
# them on its one thread per process: one job's slow read held every other job's. They run on a
# small pool of their own (plain autocommit reads: any thread will do; each keeps its database
# connection as CONN_MAX_AGE says), so a slow one takes one thread of it, and no route's.
REREAD_THREADS = 4
reread_events = database_sync_to_async(
    _current_events, thread_sensitive=False,
    executor=ThreadPoolExecutor(max_workers=REREAD_THREADS, thread_name_prefix="job-reread"),
)


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


JOIN_DEADLINE = 2.0  # seconds a new watcher waits for the group join before replaying anyway


class _Subscription:
    def __init__(self, hub: JobHub, job_id: str):
        self.hub = hub
        self.job_id = job_id
        self.queue: asyncio.Queue = asyncio.Queue()

    async def close(self) -> None:
        await self.hub.unsubscribe(self)


class _Reader:
    """One job's events in this process: one channel in the job's group, popped by one task
    and fanned out to the subscriptions; a keeper task that (re-)joins the group; a re-reader
    that reads the row every IMAGEGEN_WATCH_REREAD_SECONDS.

    The channel layer lives in Redis, and a Redis restart forgets every group: with no error
    seen (redis-py reconnects on its own) a reader would wait forever on a channel nobody sends
    to. So the keeper joins again periodically (and at once after a receive error), and the
    re-read puts the row's status in the queues, so the terminal status reaches every watcher
    even when its event was lost; EventOrder drops the repeats.
    """

    def __init__(self, hub: JobHub, job_id: str):
        self.hub, self.job_id = hub, job_id
        self.joined = asyncio.Event()
        self.rejoin = asyncio.Event()
        self.live_events = 0  # events received, so a re-read racing a live event is dropped
        self.tasks: list[asyncio.Task] = []
        self.channel_ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def start(self) -> None:
        # A context of their own: a reader outlives the request that started it (an SSE stream,
        # an OpenAI-compatible wait), whose thread-sensitive context would otherwise pin its
        # database reads to that request's executor thread after the request ended.
        self.tasks = [asyncio.create_task(coro, context=contextvars.Context())
                      for coro in (self._receive(), self._keep_joined(), self._reread())]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.channel_ready.done() and not self.channel_ready.cancelled():
            try:
                await asyncio.wait_for(self.hub.layer.group_discard(group_name(self.job_id), self.channel_ready.result()),
                                       JOIN_DEADLINE)
            except Exception:  # the group entry expires by itself
                log.warning("could not leave the group of job %s", self.job_id, exc_info=True)

    def _fan_out(self, event: dict) -> None:
        for sub in list(self.hub.subscribers.get(self.job_id, ())):
            sub.queue.put_nowait(event)

    async def _receive(self) -> None:
        layer = self.hub.layer
        channel = await layer.new_channel()  # a name only: no Redis call
        self.channel_ready.set_result(channel)
        while True:
            try:
                message = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # a Redis hiccup must not end every watcher's stream
                log.warning("receiving events of job %s failed; joining again", self.job_id, exc_info=True)
                self.joined.clear()
                self.rejoin.set()
                await asyncio.sleep(0.5)
                continue
            event = message.get("event")
            if event is None:
                continue
            self.live_events += 1
            self._fan_out(event)

    async def _keep_joined(self) -> None:
        layer = self.hub.layer
        channel = await self.channel_ready
        while True:
            try:
                await asyncio.wait_for(layer.group_add(group_name(self.job_id), channel), JOIN_DEADLINE)
                self.joined.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                if self.joined.is_set() or not self.rejoin.is_set():
                    log.warning("could not join the events of job %s; retrying", self.job_id, exc_info=True)
                self.joined.clear()
            self.rejoin.clear()
            every = settings.IMAGEGEN_WATCH_REREAD_SECONDS if self.joined.is_set() else 1.0
            try:
                await asyncio.wait_for(self.rejoin.wait(), every)
            except TimeoutError:
                pass

    async def _reread(self) -> None:
        while True:
            await asyncio.sleep(settings.IMAGEGEN_WATCH_REREAD_SECONDS)
            seen = self.live_events
            try:
                events = await reread_events(self.job_id, status_only=True)
            except asyncio.CancelledError:
                raise
            except Exception:  # the database is away: try again next time
                log.warning("re-reading job %s failed", self.job_id, exc_info=True)
                continue
            for event in events:
                # A non-terminal status read while a live event arrived may be older than it.
                if event.get("status") in TERMINAL or self.live_events == seen:
                    self._fan_out(event)


class JobHub:
    """Fans a job's events out to every watcher in this process from ONE channel-layer channel.

    With a channel per watcher, channels_redis moves each event through Redis once per watcher
    (a Lua group send, then a blocking pop, a backup write and a cleanup per message on the
    receiving side); 50 watchers meant 50 round trips per step and a p99 over the goal. Here
    the group has one member per job per web process: the process pops each event once and
    puts it on the watchers' local queues, in order. Watchers also get the row's status every
    IMAGEGEN_WATCH_REREAD_SECONDS (see _Reader), so they survive a Redis restart.
    """

    def __init__(self):
        self.subscribers: dict[str, set[_Subscription]] = {}
        self.readers: dict[str, _Reader] = {}
        self.lock = asyncio.Lock()
        # A channel layer of this hub's own: channels_redis binds a layer's receive lock to the
        # loop that first receives on it, so a second loop (a test client's next async request)
        # receiving on the process-wide layer waits on the first loop's lock forever.
        self.layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)

    async def subscribe(self, job_id) -> _Subscription:
        """Never fails for Redis: the join is retried in the background, and until it succeeds
        the watcher still gets the row's status."""
        job_id = str(job_id)
        sub = _Subscription(self, job_id)
        async with self.lock:
            self.subscribers.setdefault(job_id, set()).add(sub)
            reader = self.readers.get(job_id)
            if reader is None:
                reader = self.readers[job_id] = _Reader(self, job_id)
                reader.start()
        # Joined before the caller reads the current state, so nothing falls in between
        # (unless Redis is away, when waiting longer would not help).
        started = time.monotonic()
        try:
            await asyncio.wait_for(reader.joined.wait(), JOIN_DEADLINE)
        except TimeoutError:
            log.warning("watching job %s before its events are joined (%.1fs)", job_id, time.monotonic() - started)
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
            reader = self.readers.pop(sub.job_id)
        await reader.stop()


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, JobHub] = weakref.WeakKeyDictionary()


def job_hub() -> JobHub:
    """The hub of the running event loop (daphne has one; tests may run several in turn)."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = JobHub()
    return hub
