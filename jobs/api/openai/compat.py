"""What the OpenAI-compatible route adds to an ordinary job: the request parameters of the
Images API beyond prompt/n/size (output format and compression, quality tiers, streaming with
partial images, background), the details of a refusal, and OpenAI-shaped 404s for unknown
routes under /v1 (never Django's HTML page).

Quality maps to documented step tiers (docs/api.md), clipped to the server's step limits; the
steps of each tier are a setting per served model (IMAGEGEN_QUALITY_STEPS, docs/families.md):

| quality            | steps (default)               |
| ------------------ | ----------------------------- |
| low                | 8                             |
| medium, standard   | 20                            |
| high, hd           | 40                            |
| auto (or absent)   | the server default (IMAGEGEN_DEFAULT_STEPS) |

A tier also bundles levers (IMAGEGEN_QUALITY_LEVERS, default low: cfg-cutoff=0.5; a served model's
serving.json `quality_levers`): the job carries them as its variant (gpu_tasks/levers.py).
A served model's serving.json may give its own tiers (`quality_steps`), and IMAGEGEN_QUALITY_MODELS
may send a tier to another served model when the request names no model (by default `low` goes
to the shipped distilled student at its own steps: scheduling/catalogue.py).
"""

from __future__ import annotations

from django.conf import settings
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import serializers

from imagegen import stage_table
from jobs.api.strict import StrictBooleanField, StrictChoiceField, StrictIntegerField, StrictSerializer
from jobs.media.encoding import OUTPUT_FORMATS

_TIER_OF = {"low": "low", "medium": "medium", "standard": "medium", "high": "high", "hd": "high"}
QUALITIES = ("auto", "low", "medium", "high", "standard", "hd")
# What the events echo: the values the official client's types allow.
_EVENT_QUALITY = {"standard": "medium", "hd": "high"}
MAX_PARTIAL_IMAGES = 3


def model_for(quality: str | None, model: str | None) -> str:
    """The served version a request runs on: the one it names, else its quality tier's."""
    if model:
        return model
    return settings.IMAGEGEN_QUALITY_MODELS.get(quality or "auto", "")


def steps_for(quality: str | None, model: str | None = None) -> int:
    """A tier's steps on the model: the deployment's IMAGEGEN_QUALITY_STEPS for the default
    model, a served model's own `quality_steps` (serving.json) for another."""
    from scheduling import catalogue

    served = catalogue.get(model)
    if served is None or served.default:
        default, tiers, top = settings.IMAGEGEN_DEFAULT_STEPS, settings.IMAGEGEN_QUALITY_STEPS, settings.IMAGEGEN_MAX_STEPS
    else:
        default, tiers, top = served.default_steps, served.quality_steps, served.max_steps
    tier = _TIER_OF.get(quality or "")
    floor = served.min_steps if served is not None else settings.IMAGEGEN_MIN_STEPS  # the model's own (serving.json)
    if tier is None or tier not in tiers:
        return max(floor, default)
    return max(floor, min(top, tiers[tier]))


def variant_for(quality: str | None, model: str | None = None) -> str:
    """The levers a tier bundles on the model (gpu_tasks/levers.py variants; "" for none): the
    deployment's IMAGEGEN_QUALITY_LEVERS for the default model, a served model's own
    `quality_levers` (serving.json) for another."""
    from scheduling import catalogue

    tier = _TIER_OF.get(quality or "")
    if tier is None:
        return ""
    served = catalogue.get(model)
    tiers = settings.IMAGEGEN_QUALITY_LEVERS if served is None or served.default else served.quality_levers
    return tiers.get(tier, "")


def event_quality(quality: str | None) -> str:
    return _EVENT_QUALITY.get(quality or "auto", quality or "auto")


class OpenAIImageOptions(StrictSerializer):
    """The Images API request fields the native job does not have under these names."""

    stream = StrictBooleanField(
        required=False, allow_null=True, default=False,
        help_text="`true`: answer `text/event-stream` with `image_generation.partial_image` and "
                  "`image_generation.completed` events (docs/api.md).",
    )
    partial_images = StrictIntegerField(
        required=False, allow_null=True, default=0, min_value=0, max_value=MAX_PARTIAL_IMAGES,
        help_text="With `stream`: at most this many partial images (0-3), the job's gated previews.",
    )
    output_format = StrictChoiceField(
        choices=list(OUTPUT_FORMATS), required=False, allow_null=True, default="png",
        help_text="png (default), jpeg or webp: the files' format, encoded once on the GPU worker.",
    )
    output_compression = StrictIntegerField(
        required=False, allow_null=True, default=None, min_value=0, max_value=100,
        help_text="jpeg/webp quality 0-100 (absent: 100); png ignores it.",
    )
    quality = StrictChoiceField(
        choices=list(QUALITIES), required=False, allow_null=True, default="auto",
        help_text="Denoising steps: low 8, medium/standard 20, high/hd 40, auto the server default.",
    )
    background = StrictChoiceField(
        choices=["auto", "opaque", "transparent"], required=False, allow_null=True, default="auto",
        help_text="Images are opaque; `transparent` is refused.",
    )
    moderation = StrictChoiceField(
        choices=["auto", "low"], required=False, allow_null=True,
        help_text="Accepted for compatibility; the safety gates are never lowered.",
    )

    def validate_background(self, value):
        if value == "transparent":
            raise serializers.ValidationError("transparent backgrounds are not supported: the model paints every pixel")
        return value


def native_fields(attrs: dict) -> dict:
    """The native job's fields that these options set. The quality tier goes through as the
    native `quality`: the native serializer turns it into steps, model and levers, for both routes."""
    out: dict = {"quality": attrs.get("quality") or "", "model": attrs.get("model") or "",
                 "output_format": attrs.get("output_format") or "png"}
    if attrs.get("output_compression") is not None:
        out["output_compression"] = attrs["output_compression"]
    return out


def response_fields(job) -> dict:
    """What the Images API's non-streaming answer says besides the images."""
    return {"output_format": job.output_format, "size": f"{job.width}x{job.height}", "background": "opaque"}


def stopped_at_input(job) -> bool:
    """The job was blocked or held at a check before generation (the prompt, or its rewrite: the
    holds the stage table declares before the generate stage), not at its images."""
    return job.blocked_stage in stage_table.holds_before("generate")


def moderation_details(job) -> dict:
    """Where a refused job was stopped (`input`: the prompt; `output`: an image) and the
    policy's categories that stopped it."""
    stage = "input" if stopped_at_input(job) else "output"
    categories = sorted(
        {c for c in job.verdicts.filter(decision__in=["block", "review"]).values_list("category", flat=True) if c}
    )
    return {"stage": stage, "categories": categories}


@csrf_exempt  # changes nothing; a POST from an API client carries no CSRF token and must get the JSON 404
def unknown_route(request, path: str = ""):
    """Any path under /v1 that is not a route: OpenAI's 404 shape, as its own API answers it."""
    return JsonResponse(
        {"error": {"message": f"Invalid URL ({request.method} /v1/{path})", "type": "invalid_request_error",
                   "param": None, "code": "unknown_url"}},
        status=404,
    )
