"""WS /ws/jobs/<id>/: the job's events as JSON text frames, owner only, current state first.

Refusals happen at the handshake (the consumer closes before accepting, which the server turns
into HTTP 403): not the owner, not signed in, or (through AllowedHostsOriginValidator in
imagegen/asgi.py) an Origin that is not an allowed host. After the terminal status the server
closes the socket with code 1000.
"""

from __future__ import annotations

import asyncio

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from jobs.realtime import EventOrder, current_events, job_hub, owned_job

CLOSE_NORMAL = 1000
CLOSE_NOT_FOUND = 4404  # sent before accept, so clients see a refused handshake (HTTP 403)


class JobEventsConsumer(AsyncJsonWebsocketConsumer):
    """Transport only: ownership checked at connect, the job's events from the process's
    JobHub, current state first."""

    async def connect(self):
        self.job_id = str(self.scope["url_route"]["kwargs"]["job_id"])
        self.subscription = None
        self.forwarder = None
        self.order = EventOrder()
        job = await owned_job(self.scope.get("user"), self.job_id)
        if job is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        # Subscribe before reading the state, so nothing in between is missed; live events
        # wait in the subscription's queue until the replay is out, and EventOrder drops what
        # the replay already covered.
        self.subscription = await job_hub().subscribe(self.job_id)
        await self.accept()
        for event in await current_events(self.job_id):
            await self._send(event)
        if not self.order.finished:
            self.forwarder = asyncio.create_task(self._forward())

    async def _forward(self):
        while not self.order.finished:
            await self._send(await self.subscription.queue.get())

    async def disconnect(self, code):
        if self.forwarder is not None:
            self.forwarder.cancel()
            self.forwarder = None
        if self.subscription is not None:
            await self.subscription.close()
            self.subscription = None

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
