from __future__ import annotations

import math

from django.conf import settings
from rest_framework import serializers

from jobs.api.openai.compat import QUALITIES, model_for, steps_for, variant_for
from jobs.api.strict import (
    StrictBooleanField,
    StrictCharField,
    StrictChoiceField,
    StrictFloatField,
    StrictIntegerField,
    StrictSerializer,
)
from jobs.models import OutputFormat, Priority


def _no_lone_surrogates(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise serializers.ValidationError("contains characters that are not valid Unicode text (lone surrogates)") from None
    return value


class JobCreateSerializer(StrictSerializer):
    unknown_field_hints = {
        "size": "give `width` and `height` (numbers of pixels, from the size menu) instead",
        "n": "give `count` instead",
    }

    prompt = StrictCharField(min_length=1, max_length=settings.IMAGEGEN_MAX_PROMPT_CHARS, trim_whitespace=True)
    negative_prompt = StrictCharField(
        required=False, allow_blank=True, default="", max_length=settings.IMAGEGEN_MAX_PROMPT_CHARS
    )
    width = StrictIntegerField(required=False, min_value=1, max_value=16384)
    height = StrictIntegerField(required=False, min_value=1, max_value=16384)
    steps = StrictIntegerField(
        required=False, min_value=settings.IMAGEGEN_MIN_STEPS, max_value=settings.IMAGEGEN_MAX_STEPS
    )
    seed = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=2**32 - 1)
    count = StrictIntegerField(required=False, min_value=1, max_value=settings.IMAGEGEN_MAX_COUNT, default=1)
    guidance_scale = StrictFloatField(required=False, min_value=0.0, max_value=30.0)
    frames = StrictIntegerField(
        required=False, min_value=1, max_value=1024,
        help_text="A video: frames per clip (a video model's, GET /api/v1/models `frames`); with no `model`, the "
        "served video model of that many frames draws it. Absent: the model's (1 for an image model).",
    )
    allow_degrade = StrictBooleanField(required=False, default=False)
    model = StrictCharField(
        required=False, allow_blank=True, default="", max_length=100,
        help_text="A served model version (GET /api/v1/models); absent: the default model. Its "
        "default steps and guidance apply when the request gives none.",
    )
    quality = StrictChoiceField(
        choices=QUALITIES, required=False, allow_blank=True, default="",
        help_text="A quality tier: its steps (unless `steps` is given), its levers, and with no `model` the tier's "
        "model where the server sends one elsewhere (docs/api.md). Absent or auto: the model's defaults.",
    )
    output_format = StrictChoiceField(
        choices=OutputFormat.choices, required=False, default=OutputFormat.PNG,
        help_text="The image files' format: png (lossless), jpeg or webp.",
    )
    output_compression = StrictIntegerField(
        required=False, allow_null=True, default=None, min_value=0, max_value=100,
        help_text="jpeg/webp quality, 0-100 (absent: 100, the best); png ignores it.",
    )

    rewrite = StrictChoiceField(
        choices=["auto", "on", "off"], required=False, default="auto",
        help_text="The prompt rewriter (docs/rewriter.md): on, off, or auto (the server's default, "
        "IMAGEGEN_REWRITE_DEFAULT). The prompt it writes is checked again, drawn, and shown as revised_prompt.",
    )

    # Scheduling tier, deadline and completion webhook (issue 19; docs/api.md).
    priority = StrictChoiceField(
        choices=Priority.choices, required=False, default=Priority.INTERACTIVE,
        help_text="interactive (default) or batch: batch work fills passes and idle GPUs, after interactive work.",
    )
    cancel_after = StrictIntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=settings.IMAGEGEN_MAX_CANCEL_AFTER,
        help_text="Seconds: a job no GPU worker has claimed by then ends cancelled ('deadline passed'), not charged.",
    )
    webhook_url = StrictCharField(
        required=False, allow_blank=True, default="", max_length=2000,
        help_text="A signed POST (Standard Webhooks) of the job's JSON on each terminal status; https.",
    )

    def validate_webhook_url(self, value: str) -> str:
        from jobs.webhooks.delivery import WebhookURLError, validate_url

        try:
            request = self.context.get("request")
            return validate_url(value, getattr(getattr(request, "user", None), "pk", None)) if value else ""
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

    def validate_rewrite(self, value: str) -> str:
        from jobs.pipeline import rewrite

        if value == "on" and not rewrite.configured():
            raise serializers.ValidationError("this server has no prompt rewriter (IMAGEGEN_REWRITER_PATH is not set)")
        return value

    def validate(self, attrs: dict) -> dict:
        from scheduling import catalogue

        video = _video_model(attrs)
        menu = list(video.sizes or settings.IMAGEGEN_SIZE_MENU) if video else settings.IMAGEGEN_SIZE_MENU
        width = attrs.get("width", menu[0][0])
        height = attrs.get("height", menu[0][1])
        if video is not None and (width, height) not in menu:
            sizes = ", ".join(f"{w}x{h}" for w, h in menu)
            raise serializers.ValidationError({"width" if width not in {w for w, _ in menu} else "height": [
                f"the video model {video.version} draws {sizes} only, not {width}x{height}"]})
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
        attrs["frames"], attrs["fps"] = served.frames, served.fps
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
        if attrs["steps"] < served.min_steps:
            raise serializers.ValidationError({"steps": [served.below_floor()]})
        if attrs["steps"] > served.max_steps:
            raise serializers.ValidationError(
                {"steps": [f"{served.version} runs at most {served.max_steps} steps"]}
            )
        return attrs


def _video_model(attrs: dict):
    """The video model a request asks for (by `model`, or by `frames` with no model: the served
    video model of that many frames), None for an image request; a 400 naming `frames` where the
    frames do not fit the model, or no video model is served."""
    from scheduling import catalogue

    frames = attrs.get("frames")
    named = catalogue.get(attrs.get("model") or None) if attrs.get("model") else None
    if named is not None:
        if frames is not None and frames != named.frames:
            said = (f"{named.version} draws clips of {named.frames} frames" if named.is_video
                    else f"{named.version} is an image model (1 frame); a video needs a video model")
            raise serializers.ValidationError({"frames": [said]})
        return named if named.is_video else None
    if frames is None or frames == 1:
        return None
    videos = [m for m in catalogue.served().values() if m.is_video]
    chosen = next((m for m in videos if m.frames == frames), None)
    if chosen is None:
        offered = ", ".join(f"{m.version}: {m.frames}" for m in videos) or "none is served here"
        raise serializers.ValidationError({"frames": [f"no served video model draws {frames} frames ({offered})"]})
    attrs["model"] = chosen.version
    return chosen


class AppealSerializer(StrictSerializer):
    note = StrictCharField(required=False, allow_blank=True, default="", max_length=1000,
                           help_text="A note for the moderator.")
