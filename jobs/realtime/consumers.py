"""WS /ws/jobs/<id>/: the job's events as JSON text frames, owner only, current state first.

Refusals of who may watch happen at the handshake (the consumer closes before accepting, which
the server turns into HTTP 403): not the owner, not signed in, or (through
jobs.realtime.auth.OriginOrTokenScript in imagegen/asgi.py) an Origin that is not an allowed
host; a script sending a token and no Origin is let through to the token check. A
stream that may not start now is accepted, sent one `{"type": "error", "detail", "limit",
"retry_after"}` frame and closed with a code the client can act on: 4429 past the user's
open-stream cap (IMAGEGEN_USER_MAX_STREAMS), 4503 when Redis is unavailable (the websocket
twin of 503 + Retry-After; daphne allows only 1000 and 3000-4999 from the server, and drops
close reasons, hence the frame). After the terminal status the
server closes the socket with code 1000. The row's status arrives every
IMAGEGEN_WATCH_REREAD_SECONDS even when events are lost (a Redis restart): see jobs/realtime/state.py.
Each handler runs its sync work (the job check, the state read) on a thread of its own
(jobs/realtime/threads.py), so one socket's slow read holds no other socket of the process.
"""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from jobs.access.throttles import stream_refusal
from jobs.api.errors import RETRY_AFTER_SECONDS
from jobs.realtime import streams
from jobs.realtime.state import EventOrder, current_events, job_hub, owned_job
from jobs.realtime.threads import own_thread

CLOSE_NORMAL = 1000
CLOSE_UNAVAILABLE = 4503
CLOSE_TOO_MANY_STREAMS = 4429
CLOSE_NOT_FOUND = 4404  # sent before accept, so clients see a refused handshake (HTTP 403)


class JobEventsConsumer(AsyncJsonWebsocketConsumer):
    """Transport only: ownership checked at connect, the job's events from the process's
    JobHub, current state first."""

    # No channel of its own: events come through the JobHub. Channels would otherwise give each
    # socket a channel-layer channel and a Redis pop loop, whose error during a Redis restart
    # ended the socket (close 1011) without the terminal status. An alias that is not
    # configured means no layer (channels.layers.get_channel_layer answers None).
    channel_layer_alias = "none: events come through the JobHub"

    async def dispatch(self, message):
        async with own_thread():
            await super().dispatch(message)

    async def connect(self):
        self.job_id = str(self.scope["url_route"]["kwargs"]["job_id"])
        self.subscription = None
        self.forwarder = None
        self.slot = None
        self.closed = False
        self.order = EventOrder()
        user = self.scope.get("user")
        job = await owned_job(user, self.job_id)
        if job is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        refused = await sync_to_async(stream_refusal, thread_sensitive=False)(user.pk)  # Redis only: off the shared thread
        if refused is not None:
            detail = refused.detail
            await self._refuse(CLOSE_TOO_MANY_STREAMS, detail["detail"], detail["limit"], detail["retry_after"])
            return
        try:
            self.slot = await streams.acquire(user.pk)
        except streams.StreamsUnavailable:
            await self._refuse(CLOSE_UNAVAILABLE, "Live events are unavailable; try again shortly.", "unavailable",
                               RETRY_AFTER_SECONDS)
            return
        if self.slot is None:
            await self._refuse(CLOSE_TOO_MANY_STREAMS, (
                f"You have {settings.IMAGEGEN_USER_MAX_STREAMS} event streams open (websockets and SSE); close one "
                "first."), "streams", streams.retry_after())
            return
        # Subscribe before reading the state, so nothing in between is missed; live events
        # wait in the subscription's queue until the replay is out, and EventOrder drops what
        # the replay already covered.
        self.subscription = await job_hub().subscribe(self.job_id)
        await self.accept()
        for event in await current_events(self.job_id):
            await self._send(event)
        if not self.order.finished:
            # It outlives this handler's thread (own_thread): it makes no thread-sensitive call.
            self.forwarder = asyncio.create_task(self._forward())

    async def _refuse(self, code: int, detail: str, limit: str, retry_after: int) -> None:
        await self.accept()
        await self.send_json({"type": "error", "job": self.job_id, "detail": detail, "limit": limit,
                              "retry_after": retry_after})
        await self.close(code=code)

    async def _forward(self):
        # Its own references: disconnect() drops the consumer's as it closes them.
        subscription, slot = self.subscription, self.slot
        while not self.order.finished and not self.closed:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that
                # lands as the queue hands over an event, and the forwarder ran on past disconnect().
                async with asyncio.timeout(settings.IMAGEGEN_WATCH_REREAD_SECONDS):
                    event = await subscription.queue.get()
            except TimeoutError:
                await slot.refresh()
                continue
            await self._send(event)
            await slot.refresh()

    async def disconnect(self, code):
        self.closed = True
        forwarder, self.forwarder = self.forwarder, None
        if forwarder is not None:
            forwarder.cancel()
            # Stopped before its subscription and slot go (bounded: a Redis call it is in
            # gives up within its own deadline).
            await asyncio.wait({forwarder}, timeout=streams.REDIS_DEADLINE + 1)
        if self.subscription is not None:
            await self.subscription.close()
            self.subscription = None
        if self.slot is not None:
            await self.slot.release()
            self.slot = None

    async def _send(self, event: dict) -> None:
        if not self.order.admit(event):
            return
        await self.send_json(event)
        if self.order.finished:
            await self.close(code=CLOSE_NORMAL)

    async def receive_json(self, content, **kwargs):
        pass  # the socket is one-way; cancel goes through the REST API

    @classmethod
    async def decode_json(cls, text_data):
        return None  # ignore anything the client sends, even if it is not JSON
