"""What a job looks like to its owner: the job JSON (the API's answers, the webhook body), its
images' JSON, and the status event (websocket, SSE, the events after each transition). Read by
the API, the realtime streams and the webhooks; it writes nothing."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse
from django.utils import timezone
from rest_framework import serializers

from imagegen.precompiled import Precompiled
from jobs.media.storage import image_url
from jobs.models import GeneratedImage, GenerationJob


def image_json(image) -> dict:
    return {
        "id": str(image.id),
        "index": image.index,
        "seed": image.seed,
        "url": image_url(image.storage_key),
        "width": image.width,
        "height": image.height,
    }


def video_json(image) -> dict:
    """A delivered clip: its MP4 (`url`), poster, sprite sheet and HLS playlist, each an immutable
    public object (jobs/pipeline/publish.py publish_clip)."""
    media = image.media or {}
    frames, fps = int(media.get("frames") or 0), int(media.get("fps") or 0)
    return {
        "id": str(image.id),
        "index": image.index,
        "seed": image.seed,
        "url": image_url(image.storage_key),
        "poster_url": image_url(media["poster"]),
        "playlist_url": image_url(media["playlist"]),
        "sprites_url": image_url(media["sprites"]),
        "width": image.width,
        "height": image.height,
        "frames": frames,
        "fps": fps,
        "seconds": round(frames / fps, 3) if fps else None,
        "content_type": image.content_type,
    }


# A done job's images, read once per poll: compiled once (imagegen/precompiled.py).
_IMAGES_OF = Precompiled(lambda job: GeneratedImage.objects.filter(job_id=job),
                         job=GeneratedImage._meta.get_field("job"))


def delivered_images(job: GenerationJob) -> list[dict]:
    """Only delivered (public) images of a done job ever get a URL."""
    if job.status != "done":
        return []
    prefetched = getattr(job, "_prefetched_objects_cache", {}).get("images")
    images = prefetched if prefetched is not None else _IMAGES_OF(job=job.pk)
    return [image_json(im) for im in images if im.tier == "public" and not im.media]


def delivered_videos(job: GenerationJob) -> list[dict]:
    """A done video job's clips (only delivered ones ever get a URL); [] for an image job."""
    if job.status != "done" or job.frames == 1:
        return []
    prefetched = getattr(job, "_prefetched_objects_cache", {}).get("images")
    images = prefetched if prefetched is not None else _IMAGES_OF(job=job.pk)
    return [video_json(im) for im in images if im.tier == "public" and im.media]


def status_event(job: GenerationJob) -> dict:
    event: dict[str, Any] = {
        "type": "status",
        "job": str(job.id),
        "status": job.status,
        "reason": job.reason,
        "images": delivered_images(job),
    }
    if job.frames > 1:
        event["videos"] = delivered_videos(job)
    if job.rewrite:  # what is drawn, once the rewriter has run (null before), and what it substituted
        event["revised_prompt"] = revised_prompt(job)
        event["rewrite_notes"] = rewrite_notes(job)
    return event


def rewritten_event(job_id, revised: str, notes=()) -> dict:
    """Sent when the rewriter has written the job's prompt (before its second check)."""
    return {"type": "rewritten", "job": str(job_id), "revised_prompt": revised, "rewrite_notes": list(notes)}


class JobSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="model_version", read_only=True)
    webhook_url = serializers.CharField(read_only=True, help_text="Where terminal statuses are POSTed, signed; empty: none.")
    rewrite = serializers.BooleanField(read_only=True, help_text="Whether the prompt goes through the rewriter.")
    revised_prompt = serializers.SerializerMethodField(
        help_text="The prompt drawn, as the rewriter wrote it (the user's own where it kept it); null: not rewritten (yet).")
    rewriter = serializers.SerializerMethodField(help_text="The rewriter's identity (version and settings); null: none.")
    rewrite_notes = serializers.SerializerMethodField(help_text=(
        "What the rewriter substituted, in words (\"pink is drawn as red (the nearest colour this model draws)\"), "
        "or what the model cannot draw; empty: nothing to say, or not rewritten (yet)."))
    queue_wait_seconds = serializers.FloatField(read_only=True, allow_null=True)
    stage = serializers.SerializerMethodField(help_text=(
        "Where the pipeline has the job (prompt, rewrite, rewrite_check, waiting_gpu, generate, classify, "
        "publish, review, done, blocked, failed, cancelled); `status` is the user's view of it, derived from it."))
    progress = serializers.SerializerMethodField()
    images = serializers.SerializerMethodField()
    videos = serializers.SerializerMethodField(help_text=(
        "A video job's delivered clips: `url` (the MP4, H.264, faststart, with content credentials), `poster_url`, "
        "`playlist_url` (HLS, fMP4 segments, two renditions), `sprites_url`, `width`, `height`, `frames`, `fps`, "
        "`seconds`, `content_type`; [] for an image job and until done."))
    frames = serializers.IntegerField(read_only=True, help_text="Frames per clip: 1 for an image job.")
    fps = serializers.IntegerField(read_only=True, help_text="A video job's frames per second; 0 for an image job.")
    batch = serializers.SerializerMethodField()
    events_url = serializers.SerializerMethodField()
    websocket_url = serializers.SerializerMethodField()

    class Meta:
        model = GenerationJob
        fields = [
            "id", "status", "stage", "prompt", "negative_prompt", "width", "height", "steps", "seed", "count",
            "guidance_scale", "model", "created_at", "started_at", "finished_at", "progress", "reason",
            "blocked_stage", "attempts", "queue_wait_seconds", "batch", "degraded", "requested_steps",
            "eta_seconds", "queue_position", "appeal", "output_format", "output_compression", "images", "events_url",
            "websocket_url", "priority", "cancel_after", "deadline_at", "webhook_url", "rewrite", "revised_prompt",
            "rewriter", "rewrite_notes", "frames", "fps", "videos",
        ]
        read_only_fields = fields

    eta_seconds = serializers.SerializerMethodField()
    queue_position = serializers.SerializerMethodField()

    def get_revised_prompt(self, job) -> str | None:
        return revised_prompt(job)

    def get_stage(self, job) -> str:
        # A cross-user cache hit's reveal shows as the GPU queue a fresh job would wait in (jobs/media/cache.py).
        return "waiting_gpu" if job.stage == "reveal" else job.stage

    def get_rewriter(self, job) -> str | None:
        return job.rewriter_version or None

    def get_rewrite_notes(self, job) -> list[str]:
        return rewrite_notes(job)

    def _estimate(self, job):
        """The estimate made at submit, or a fresh one for a job still queued."""
        if not hasattr(job, "_current_estimate"):
            est = getattr(job, "estimate", None)
            if est is None and job.status == "queued" and job.scheduled_at is not None and self.context.get("estimate"):
                # From the per-shape summary (jobs/admission/summary.py): a poll costs the same
                # whatever the backlog, instead of a replay of the whole queue.
                from jobs.actions import shape_of
                from jobs.admission.summary import queued_job_estimate

                est = queued_job_estimate(shape_of(job), job.count, job.scheduled_at.timestamp(), job_id=str(job.id))
            job._current_estimate = est
        return job._current_estimate

    def get_eta_seconds(self, job) -> float | None:
        if job.status in ("done", "failed", "blocked", "cancelled"):
            return 0.0 if job.status == "done" else None
        est = self._estimate(job)
        return round(est.eta_seconds, 2) if est is not None and est.eta_seconds is not None else None

    def get_queue_position(self, job) -> int | None:
        est = self._estimate(job)
        return est.position if est is not None and job.status == "queued" else None

    appeal = serializers.SerializerMethodField()

    def get_appeal(self, job) -> dict | None:
        if job.appealed_at is None:
            return None
        return {"status": job.appeal_outcome or "pending", "note": job.appeal_note, "appealed_at": job.appealed_at}

    def get_progress(self, job) -> dict:
        return {"step": job.progress_step, "total": job.progress_total}

    def get_images(self, job) -> list[dict]:
        return delivered_images(job)

    def get_videos(self, job) -> list[dict]:
        return delivered_videos(job)

    def get_batch(self, job) -> dict | None:
        if job.batch_id is None:
            return None
        return {"id": str(job.batch_id), "size": job.batch.size}

    def get_events_url(self, job) -> str:
        return reverse("job-events", args=[job.id])

    def get_websocket_url(self, job) -> str:
        return f"/ws/jobs/{job.id}/"

    def to_representation(self, job) -> dict:
        """The same dict as DRF's generic path (tests/test_api_tier.py compares them), without
        building this ModelSerializer's fields for every instance: that was about a third of the
        CPU of a submit or a poll. One getter per field of Meta.fields (checked at import)."""
        return {name: _FAST[name](self, job) for name in self.Meta.fields}


def revised_prompt(job) -> str | None:
    """The prompt the image model drew when the rewriter ran (the user's own where it kept it);
    None when the job does not go through the rewriter or it has not run yet."""
    return job.revised_prompt or None if job.rewrite and job.rewritten_at is not None else None


def rewrite_notes(job) -> list[str]:
    """What the rewriter substituted (or found it cannot draw), once it has run; [] before, or
    without it."""
    return [str(n) for n in job.rewrite_notes or []] if job.rewrite and job.rewritten_at is not None else []


def _int_or_none(value) -> int | None:
    return None if value is None else int(value)


_FAST = {
    "id": lambda s, job: str(job.id),
    "status": lambda s, job: job.status,
    "stage": JobSerializer.get_stage,
    "prompt": lambda s, job: job.prompt,
    "negative_prompt": lambda s, job: job.negative_prompt,
    "width": lambda s, job: int(job.width),
    "height": lambda s, job: int(job.height),
    "steps": lambda s, job: int(job.steps),
    "seed": lambda s, job: int(job.seed),
    "count": lambda s, job: int(job.count),
    "guidance_scale": lambda s, job: float(job.guidance_scale),
    "model": lambda s, job: job.model_version,
    "created_at": lambda s, job: _iso(job.created_at),
    "started_at": lambda s, job: _iso(job.started_at),
    "finished_at": lambda s, job: _iso(job.finished_at),
    "progress": JobSerializer.get_progress,
    "reason": lambda s, job: job.reason,
    "blocked_stage": lambda s, job: job.blocked_stage,
    "attempts": lambda s, job: int(job.attempts),
    "queue_wait_seconds": lambda s, job: _float_or_none(job.queue_wait_seconds),
    "batch": JobSerializer.get_batch,
    "degraded": lambda s, job: bool(job.degraded),
    "requested_steps": lambda s, job: _int_or_none(job.requested_steps),
    "eta_seconds": JobSerializer.get_eta_seconds,
    "queue_position": JobSerializer.get_queue_position,
    "appeal": JobSerializer.get_appeal,
    "output_format": lambda s, job: job.output_format,
    "output_compression": lambda s, job: _int_or_none(job.output_compression),
    "images": JobSerializer.get_images,
    "events_url": JobSerializer.get_events_url,
    "websocket_url": JobSerializer.get_websocket_url,
    "priority": lambda s, job: job.priority,
    "cancel_after": lambda s, job: job.cancel_after,
    "deadline_at": lambda s, job: _iso(job.deadline_at),
    "webhook_url": lambda s, job: job.webhook_url,
    "rewrite": lambda s, job: bool(job.rewrite),
    "revised_prompt": lambda s, job: revised_prompt(job),
    "rewriter": lambda s, job: job.rewriter_version or None,
    "rewrite_notes": lambda s, job: rewrite_notes(job),
    "frames": lambda s, job: int(job.frames),
    "fps": lambda s, job: int(job.fps),
    "videos": JobSerializer.get_videos,
}
if set(_FAST) != set(JobSerializer.Meta.fields):  # a field added to Meta.fields needs its getter here
    raise ImproperlyConfigured(f"JobSerializer fast path out of step: {sorted(set(_FAST) ^ set(JobSerializer.Meta.fields))}")


def _iso(value) -> str | None:
    """DRF's DateTimeField output: ISO 8601 in the current time zone, "Z" for UTC."""
    if value is None:
        return None
    text = timezone.localtime(value).isoformat() if timezone.is_aware(value) else value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _float_or_none(value) -> float | None:
    return None if value is None else float(value)
