"""Server-sent events: GET /api/v1/jobs/{id}/events, owner only.

Subscribes to the job's events (the process's JobHub) first, then replays the current state, so nothing
that happens in between is missed; ends after the terminal status. Framing: one `event: <type>`
line and one `data: <json>` line per event, a blank line after each; a `: keepalive` comment
every KEEPALIVE_SECONDS of silence. Works with any HTTP client (curl -N, httpx, EventSource).
"""

from __future__ import annotations

import asyncio
import json

from django.http import JsonResponse, StreamingHttpResponse

from jobs.realtime import TERMINAL, EventOrder, authenticate_header_or_session, current_events, job_hub, owned_job

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
        return JsonResponse({"detail": "No GenerationJob matches the given query."}, status=404)

    async def stream():
        order = EventOrder()
        subscription = await job_hub().subscribe(job_id)
        try:
            for event in await current_events(job_id):
                if order.admit(event):
                    yield _frame(event)
                if order.finished:
                    return
            while True:
                try:
                    event = await asyncio.wait_for(subscription.queue.get(), timeout=KEEPALIVE_SECONDS)
                except TimeoutError:
                    yield ": keepalive\n\n"
                    # The row is the truth: a final event lost in transit still ends the stream.
                    for event in await current_events(job_id, status_only=True):
                        if event["status"] in TERMINAL and order.admit(event):
                            yield _frame(event)
                            return
                    continue
                if order.admit(event):
                    yield _frame(event)
                if order.finished:
                    return
        finally:
            await subscription.close()

    response = StreamingHttpResponse(stream(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
