from __future__ import annotations

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from jobs.events import group_name
from jobs.realtime import current_events, owned_job


class JobEventsConsumer(AsyncJsonWebsocketConsumer):
    """Transport only: ownership checked at connect, one group per job, current state first."""

    async def connect(self):
        self.job_id = str(self.scope["url_route"]["kwargs"]["job_id"])
        self.group = None
        job = await owned_job(self.scope.get("user"), self.job_id)
        if job is None:
            await self.close(code=4404)
            return
        self.group = group_name(self.job_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        for event in await current_events(self.job_id):
            await self.send_json(event)

    async def disconnect(self, code):
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def job_event(self, message):
        await self.send_json(message["event"])

    async def receive_json(self, content, **kwargs):
        pass  # the socket is one-way; cancel goes through the REST API
