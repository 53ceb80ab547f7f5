"""Server-sent events: GET /api/v1/jobs/{id}/events, owner only.

Takes one of the user's stream slots (IMAGEGEN_USER_MAX_STREAMS, jobs/realtime/streams.py; 429 past it,
503 + Retry-After when Redis cannot be reached, at once rather than a stream that hangs), then
subscribes to the job's events (the process's JobHub) and replays the current state, so nothing
that happens in between is missed; ends after the terminal status. The hub also puts the row's
status in the stream every IMAGEGEN_WATCH_REREAD_SECONDS, so a final event lost with Redis still
ends it. Framing: one `event: <type>` line and one `data: <json>` line per event, a blank line
after each; a `: keepalive` comment after KEEPALIVE_SECONDS of silence. Works with any HTTP
client (curl -N, httpx, EventSource).
"""

from __future__ import annotations

import asyncio
import json
import time

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import JsonResponse, StreamingHttpResponse

from jobs.access.throttles import stream_refusal
from jobs.api.errors import REDIS_DOWN, RETRY_AFTER_SECONDS
from jobs.realtime import streams
from jobs.realtime.state import EventOrder, authenticate_header_or_session, current_events, job_hub, owned_job

KEEPALIVE_SECONDS = 15.0


def _frame(event: dict) -> str:
    # json.dumps never emits a raw newline, so one data: line carries the whole event.
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


async def job_events(request, job_id):
    user = await authenticate_header_or_session(request.headers.get("Authorization", ""), request)
    if user is None:
        return JsonResponse(
            {"detail": "Authentication credentials were not provided."}, status=401, headers={"WWW-Authenticate": "Token"}
        )
    job = await owned_job(user, job_id)
    if job is None:
        return JsonResponse({"detail": "Not found."}, status=404)
    refused = await sync_to_async(stream_refusal, thread_sensitive=False)(user.pk)  # Redis only: off the shared thread
    if refused is not None:
        return JsonResponse(refused.detail, status=429, headers={"Retry-After": str(refused.detail["retry_after"])})
    try:
        slot = await streams.acquire(user.pk)
    except streams.StreamsUnavailable:
        return JsonResponse({"detail": REDIS_DOWN}, status=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    if slot is None:
        wait = streams.retry_after()
        return JsonResponse(
            {"detail": f"You have {settings.IMAGEGEN_USER_MAX_STREAMS} event streams open (websockets and SSE); "
                       "close one first.", "limit": "streams", "eta_seconds": None, "retry_after": wait},
            status=429, headers={"Retry-After": str(wait)},
        )

    async def stream():
        order = EventOrder()
        subscription = None
        try:
            subscription = await job_hub().subscribe(job_id)
            for event in await current_events(job_id):
                if order.admit(event):
                    yield _frame(event)
                if order.finished:
                    return
            last_sent = time.monotonic()
            while True:
                try:
                    event = await asyncio.wait_for(subscription.queue.get(), timeout=settings.IMAGEGEN_WATCH_REREAD_SECONDS)
                except TimeoutError:
                    event = None
                await slot.refresh()
                if event is not None and order.admit(event):
                    yield _frame(event)
                    last_sent = time.monotonic()
                elif time.monotonic() - last_sent >= KEEPALIVE_SECONDS:
                    yield ": keepalive\n\n"
                    last_sent = time.monotonic()
                if order.finished:
                    return
        finally:
            if subscription is not None:
                await subscription.close()
            await slot.release()

    response = StreamingHttpResponse(stream(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
