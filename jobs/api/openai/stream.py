"""`stream: true` on POST /v1/images/generations: the job's life as the Images API's stream.

The answer is `text/event-stream` in the shapes the official `openai` client parses
(openai-python's `ImageGenStreamEvent`):

    event: image_generation.partial_image
    data: {"type": "image_generation.partial_image", "b64_json", "partial_image_index", "size",
           "output_format", "quality", "background", "created_at"}

    event: image_generation.completed          (one per image, in index order)
    data: {"type": "image_generation.completed", "b64_json", "size", "output_format", "quality",
           "background", "created_at", "usage"}

A refusal or failure is one `error` event, `{"type": "error", "error": {message, type, param,
code[, moderation_details]}}`, which the client raises as `openai.APIError` (code
`moderation_blocked`, `content_policy_review`, `generation_failed`, `job_cancelled`, `timeout`).

Partial images are the job's previews as its watchers get them: the GPU worker passes every
preview through the image gate and publishes only the allowed ones on the job's channel-layer
group (gpu_tasks/previews.py, jobs/realtime/events.py); this module only listens there (the process's
JobHub), so nothing reaches a client that the gate has not seen. Previews are spread over the
run: the i-th partial image is the first preview at or past step ceil(steps * (i+1) / (N+1));
when the job finishes sooner, fewer arrive (as with OpenAI). They show the job's first image,
at preview size, converted to the requested output format.

Subscribed before the current state is read (so nothing falls in between), with `: keepalive`
comments every 15 s; a client that disconnects ends the stream (the job keeps running).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator

from channels.db import database_sync_to_async
from django.conf import settings
from django.http import StreamingHttpResponse

from jobs.api.openai.compat import event_quality, moderation_details, stopped_at_input
from jobs.media import encoding
from jobs.realtime.state import TERMINAL, EventOrder, current_events, job_hub

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15.0


def frame(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def thresholds(steps: int, partial_images: int) -> list[int]:
    """The step each partial image waits for: evenly spread over the run."""
    return [max(1, math.ceil(steps * (i + 1) / (partial_images + 1))) for i in range(partial_images)]


def usage(prompt: str) -> dict:
    """The client's type requires usage. This server meters GPU-seconds, not tokens: text tokens
    are the prompt's words, image tokens 0."""
    words = len(re.findall(r"\w+", prompt))
    return {"input_tokens": words, "input_tokens_details": {"image_tokens": 0, "text_tokens": words},
            "output_tokens": 0, "total_tokens": words}


def error_event(message: str, type_: str, code: str, param: str | None = None, **extra) -> dict:
    return {"type": "error", "error": {"message": message, "type": type_, "param": param, "code": code, **extra}}


class _Stream:
    def __init__(self, job, attrs: dict):
        self.job_id = str(job.id)
        self.prompt = job.prompt
        self.steps = job.steps
        self.size = f"{job.width}x{job.height}"
        self.output_format = job.output_format
        self.compression = job.output_compression
        self.quality = event_quality(attrs.get("quality"))
        self.want = thresholds(job.steps, int(attrs.get("partial_images") or 0))
        self.sent_partials = 0

    def _common(self) -> dict:
        return {"size": self.size, "output_format": self.output_format, "quality": self.quality,
                "background": "opaque", "created_at": int(time.time())}

    async def partial(self, event: dict) -> dict | None:
        if self.sent_partials >= len(self.want) or event.get("step", 0) < self.want[self.sent_partials]:
            return None
        header, _, payload = str(event.get("image", "")).partition(",")
        if not header.startswith("data:image/") or not payload:
            return None
        data = base64.b64decode(payload)
        if header != f"data:{encoding.FORMATS[self.output_format][0]};base64":
            data = (await asyncio.to_thread(encoding.convert, data, self.output_format, self.compression, None)).data
        index, self.sent_partials = self.sent_partials, self.sent_partials + 1
        return {"type": "image_generation.partial_image", "b64_json": base64.b64encode(data).decode("ascii"),
                "partial_image_index": index, **self._common()}

    async def finished(self, status: str) -> list[dict]:
        """The events for a terminal (or held) status: the completed images, or an error."""
        if status == "done":
            files = await asyncio.to_thread(_delivered_files, self.job_id)
            if not files:
                return [error_event(f"Job {self.job_id} finished without a delivered image.", "server_error",
                                    "generation_failed")]
            return [{"type": "image_generation.completed", "b64_json": base64.b64encode(data).decode("ascii"),
                     **self._common(), "usage": usage(self.prompt)} for data in files]
        return [await _refusal(self.job_id, status)]


def _delivered_files(job_id: str) -> list[bytes]:
    from django.db import close_old_connections

    from jobs.media.storage import public_storage
    from jobs.models import GeneratedImage

    close_old_connections()
    out = []
    for image in GeneratedImage.objects.filter(job__id=job_id, tier="public").order_by("index"):
        with public_storage().open(image.storage_key, "rb") as fh:
            out.append(fh.read())
    return out


@database_sync_to_async
def _refusal(job_id: str, status: str) -> dict:
    from jobs.models import GenerationJob

    job = GenerationJob.objects.filter(id=job_id).first()
    if job is None or status == "deleted":
        return error_event(f"Job {job_id} was deleted while streaming.", "invalid_request_error", "not_found")
    follow = f"GET /api/v1/jobs/{job.id} (or its /events stream)"
    if job.status == "blocked":
        return error_event(
            f"Your request was rejected by the safety system ({job.blocked_stage or 'policy'}): {job.reason} "
            f"(job {job.id}; an appeal is possible through the native API).",
            "invalid_request_error", "moderation_blocked", "prompt" if stopped_at_input(job) else None,
            moderation_details=moderation_details(job),
        )
    if job.status == "review":
        return error_event(
            f"Your request is held for review by a moderator: {job.reason}. Job {job.id}; follow it with {follow}.",
            "invalid_request_error", "content_policy_review", "prompt" if stopped_at_input(job) else None,
        )
    if job.status == "failed":
        return error_event(f"Image generation failed: {job.reason} (job {job.id}).", "server_error", "generation_failed")
    if job.status == "cancelled":
        return error_event(f"Job {job.id} was cancelled: {job.reason}.", "invalid_request_error", "job_cancelled")
    return error_event(
        f"Job {job.id} did not finish within {settings.IMAGEGEN_OPENAI_WAIT_SECONDS:g} s (it is {job.status}); "
        f"it keeps running: follow it with {follow}.", "server_error", "timeout",
    )


_STOP = TERMINAL | {"review"}


async def events(job, attrs: dict) -> AsyncIterator[str]:
    stream = _Stream(job, attrs)
    order = EventOrder()
    deadline = time.monotonic() + settings.IMAGEGEN_OPENAI_WAIT_SECONDS
    subscription = await job_hub().subscribe(stream.job_id)

    async def handle(event: dict) -> tuple[list[str], bool]:
        if not order.admit(event):
            return [], order.finished
        if event.get("type") == "preview":
            partial = await stream.partial(event)
            return ([frame(partial)] if partial else []), False
        if event.get("type") == "status" and event.get("status") in _STOP:
            return [frame(e) for e in await stream.finished(event["status"])], True
        return [], False

    try:
        for event in await current_events(stream.job_id):
            frames, done = await handle(event)
            for f in frames:
                yield f
            if done:
                return
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                yield frame(await _refusal(stream.job_id, "timeout"))
                return
            try:
                event = await asyncio.wait_for(subscription.queue.get(), timeout=min(KEEPALIVE_SECONDS, remaining))
            except TimeoutError:
                yield ": keepalive\n\n"
                # The row is the truth: a final event lost in transit still ends the stream.
                for event in await current_events(stream.job_id, status_only=True):
                    if event["status"] in _STOP:
                        for f in (await handle(event))[0]:
                            yield f
                        return
                continue
            frames, done = await handle(event)
            for f in frames:
                yield f
            if done:
                return
    finally:
        await subscription.close()


def stream(request, job, attrs: dict) -> StreamingHttpResponse:
    """The streaming answer for a submitted job (called by jobs.api.openai.views after submit)."""
    response = StreamingHttpResponse(events(job, attrs), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
