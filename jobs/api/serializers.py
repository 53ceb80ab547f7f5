from __future__ import annotations

import math

from django.conf import settings
from django.urls import reverse
from django.utils import timezone
from rest_framework import serializers

from jobs.api.openai.compat import QUALITIES, model_for, steps_for, variant_for
from jobs.media.storage import image_url
from jobs.models import GenerationJob, OutputFormat, Priority


def _no_lone_surrogates(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise serializers.ValidationError("contains characters that are not valid Unicode text (lone surrogates)") from None
    return value


class JobCreateSerializer(serializers.Serializer):
    prompt = serializers.CharField(min_length=1, max_length=settings.IMAGEGEN_MAX_PROMPT_CHARS, trim_whitespace=True)
    negative_prompt = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=settings.IMAGEGEN_MAX_PROMPT_CHARS
    )
    width = serializers.IntegerField(required=False, min_value=1, max_value=16384)
    height = serializers.IntegerField(required=False, min_value=1, max_value=16384)
    steps = serializers.IntegerField(
        required=False, min_value=settings.IMAGEGEN_MIN_STEPS, max_value=settings.IMAGEGEN_MAX_STEPS
    )
    seed = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=2**32 - 1)
    count = serializers.IntegerField(required=False, min_value=1, max_value=settings.IMAGEGEN_MAX_COUNT, default=1)
    guidance_scale = serializers.FloatField(required=False, min_value=0.0, max_value=30.0)
    allow_degrade = serializers.BooleanField(required=False, default=False)
    model = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=100,
        help_text="A served model version (GET /api/v1/models); absent: the default model. Its "
        "default steps and guidance apply when the request gives none.",
    )
    quality = serializers.ChoiceField(
        choices=QUALITIES, required=False, allow_blank=True, default="",
        help_text="A quality tier: its steps (unless `steps` is given), its levers, and with no `model` the tier's "
        "model where the server sends one elsewhere (docs/api.md). Absent or auto: the model's defaults.",
    )
    output_format = serializers.ChoiceField(
        choices=OutputFormat.choices, required=False, default=OutputFormat.PNG,
        help_text="The image files' format: png (lossless), jpeg or webp.",
    )
    output_compression = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=0, max_value=100,
        help_text="jpeg/webp quality, 0-100 (absent: 100, the best); png ignores it.",
    )

    # Scheduling tier, deadline and completion webhook (issue 19; docs/api.md).
    priority = serializers.ChoiceField(
        choices=Priority.choices, required=False, default=Priority.INTERACTIVE,
        help_text="interactive (default) or batch: batch work fills passes and idle GPUs, after interactive work.",
    )
    cancel_after = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=settings.IMAGEGEN_MAX_CANCEL_AFTER,
        help_text="Seconds: a job no GPU worker has claimed by then ends cancelled ('deadline passed'), not charged.",
    )
    webhook_url = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=2000,
        help_text="A signed POST (Standard Webhooks) of the job's JSON on each terminal status; https.",
    )

    def validate_webhook_url(self, value: str) -> str:
        from jobs.webhooks.delivery import WebhookURLError, validate_url

        try:
            return validate_url(value) if value else ""
        except WebhookURLError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate_prompt(self, value: str) -> str:
        return _no_lone_surrogates(value)

    def validate_negative_prompt(self, value: str) -> str:
        return _no_lone_surrogates(value)

    def validate_guidance_scale(self, value: float) -> float:
        if not math.isfinite(value):
            raise serializers.ValidationError("must be a finite number")
        return value

    def validate_model(self, value: str) -> str:
        from scheduling import catalogue

        if catalogue.get(value) is None:
            served = ", ".join(catalogue.served())
            raise serializers.ValidationError(f"{value!r} is not a served model; use one of: {served}")
        return value

    def validate(self, attrs: dict) -> dict:
        from scheduling import catalogue

        menu = settings.IMAGEGEN_SIZE_MENU
        width = attrs.get("width", menu[0][0])
        height = attrs.get("height", menu[0][1])
        if (width, height) not in menu:
            sizes = ", ".join(f"{w}x{h}" for w, h in menu)
            field = "width" if width not in {w for w, _ in menu} else "height"
            raise serializers.ValidationError({field: [f"{width}x{height} is not on the size menu ({sizes})"]})
        attrs["width"], attrs["height"] = width, height
        quality = attrs.get("quality") or ""
        if quality and quality != "auto":
            named = attrs.get("model") or ""
            model = model_for(quality, named)
            if catalogue.get(model) is None:  # IMAGEGEN_QUALITY_MODELS names a version not served
                model = named
            # A tier the server sends to another model runs at that model's defaults; on the
            # model asked for (or the default) it brings its steps and its levers.
            tier = quality if named or not model else None
            if tier is not None and "steps" not in attrs:
                attrs["steps"] = steps_for(tier, model)
            attrs["model"], attrs["variant"] = model, variant_for(tier, model)
        served = catalogue.get(attrs.get("model"))
        assert served is not None  # validate_model; a tier's model is served (catalogue)
        attrs.setdefault("steps", served.default_steps)
        attrs.setdefault("guidance_scale", served.guidance_scale)
        if attrs.get("negative_prompt"):
            if not served.negative_prompt:
                raise serializers.ValidationError(
                    {"negative_prompt": [f"{served.version} takes no negative prompt (its guidance is distilled in)"]}
                )
            from scheduling import heartbeats, lanes

            # What the lane's live workers said of their model at load (a Flux checkpoint, say):
            # refused here rather than as a failed job.
            caps = heartbeats.capabilities(lanes.lane_of(served.version)) or {}
            if caps.get("negative_prompt_refusal"):
                raise serializers.ValidationError({"negative_prompt": [caps["negative_prompt_refusal"]]})
        if attrs["steps"] > served.max_steps:
            raise serializers.ValidationError(
                {"steps": [f"{served.version} runs at most {served.max_steps} steps"]}
            )
        return attrs


def image_json(image) -> dict:
    return {
        "id": str(image.id),
        "index": image.index,
        "seed": image.seed,
        "url": image_url(image.storage_key),
        "width": image.width,
        "height": image.height,
    }


def delivered_images(job: GenerationJob) -> list[dict]:
    """Only delivered (public) images of a done job ever get a URL."""
    if job.status != "done":
        return []
    return [image_json(im) for im in job.images.all() if im.tier == "public"]


def status_event(job: GenerationJob) -> dict:
    return {
        "type": "status",
        "job": str(job.id),
        "status": job.status,
        "reason": job.reason,
        "images": delivered_images(job),
    }


class JobSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="model_version", read_only=True)
    webhook_url = serializers.CharField(read_only=True, help_text="Where terminal statuses are POSTed, signed; empty: none.")
    queue_wait_seconds = serializers.FloatField(read_only=True, allow_null=True)
    progress = serializers.SerializerMethodField()
    images = serializers.SerializerMethodField()
    batch = serializers.SerializerMethodField()
    events_url = serializers.SerializerMethodField()
    websocket_url = serializers.SerializerMethodField()

    class Meta:
        model = GenerationJob
        fields = [
            "id", "status", "prompt", "negative_prompt", "width", "height", "steps", "seed", "count",
            "guidance_scale", "model", "created_at", "started_at", "finished_at", "progress", "reason",
            "blocked_stage", "attempts", "queue_wait_seconds", "batch", "degraded", "requested_steps",
            "eta_seconds", "queue_position", "appeal", "output_format", "output_compression", "images", "events_url",
            "websocket_url", "priority", "cancel_after", "deadline_at", "webhook_url",
        ]
        read_only_fields = fields

    eta_seconds = serializers.SerializerMethodField()
    queue_position = serializers.SerializerMethodField()

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
        CPU of a submit or a poll. A field added to Meta.fields that this does not know goes
        through the generic path."""
        if tuple(self.Meta.fields) != _FAST_FIELDS:
            return super().to_representation(job)
        return {
            "id": str(job.id),
            "status": job.status,
            "prompt": job.prompt,
            "negative_prompt": job.negative_prompt,
            "width": int(job.width),
            "height": int(job.height),
            "steps": int(job.steps),
            "seed": int(job.seed),
            "count": int(job.count),
            "guidance_scale": float(job.guidance_scale),
            "model": job.model_version,
            "created_at": _iso(job.created_at),
            "started_at": _iso(job.started_at),
            "finished_at": _iso(job.finished_at),
            "progress": self.get_progress(job),
            "reason": job.reason,
            "blocked_stage": job.blocked_stage,
            "attempts": int(job.attempts),
            "queue_wait_seconds": _float_or_none(job.queue_wait_seconds),
            "batch": self.get_batch(job),
            "degraded": bool(job.degraded),
            "requested_steps": None if job.requested_steps is None else int(job.requested_steps),
            "eta_seconds": self.get_eta_seconds(job),
            "queue_position": self.get_queue_position(job),
            "appeal": self.get_appeal(job),
            "output_format": job.output_format,
            "output_compression": None if job.output_compression is None else int(job.output_compression),
            "images": self.get_images(job),
            "events_url": self.get_events_url(job),
            "websocket_url": self.get_websocket_url(job),
            "priority": job.priority,
            "cancel_after": job.cancel_after,
            "deadline_at": _iso(job.deadline_at),
            "webhook_url": job.webhook_url,
        }


_FAST_FIELDS = (
    "id", "status", "prompt", "negative_prompt", "width", "height", "steps", "seed", "count",
    "guidance_scale", "model", "created_at", "started_at", "finished_at", "progress", "reason",
    "blocked_stage", "attempts", "queue_wait_seconds", "batch", "degraded", "requested_steps",
    "eta_seconds", "queue_position", "appeal", "output_format", "output_compression", "images", "events_url",
    "websocket_url", "priority", "cancel_after", "deadline_at", "webhook_url",
)


def _iso(value) -> str | None:
    """DRF's DateTimeField output: ISO 8601 in the current time zone, "Z" for UTC."""
    if value is None:
        return None
    text = timezone.localtime(value).isoformat() if timezone.is_aware(value) else value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _float_or_none(value) -> float | None:
    return None if value is None else float(value)
