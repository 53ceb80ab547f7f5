"""The OpenAI Images API shape: POST /v1/images/generations, GET /v1/models[/{id}].

A request becomes a normal job through jobs.pipeline.submit.submit_job (the same prompt and image
gates, batching and cache as the native API), and the view waits for it on the job's events
(the channel layer, through the process's JobHub, which also re-reads the row every
IMAGEGEN_WATCH_REREAD_SECONDS), for at most IMAGEGEN_OPENAI_WAIT_SECONDS. The wait is async: it
holds no database polling loop, and it ends when the client disconnects (jobs/api/client_gone.py),
cancelling the job (IMAGEGEN_OPENAI_CANCEL_ON_DISCONNECT): nobody would get its images. Auth is `Authorization: Bearer <token>` with the
native API tokens. Errors are in OpenAI's shape, `{"error": {message, type, param, code}}`:

| situation                                   | status | type / code                                   |
| ------------------------------------------- | ------ | --------------------------------------------- |
| invalid field (size not on the menu, n, ...) | 400    | invalid_request_error / invalid_value, param  |
| a parameter the Images API does not define  | 400    | invalid_request_error / unknown_parameter, param |
| a value of the wrong JSON type ("n": "2")    | 400    | invalid_request_error / invalid_type, param   |
| GIF/SVG-only parameters (frame_count, svg)   | 400    | invalid_request_error / unsupported_parameter, param |
| unknown model                               | 400    | invalid_request_error / model_not_found       |
| prompt or image blocked by the policy       | 400    | invalid_request_error / moderation_blocked (+ moderation_details) |
| held for a moderator (review)               | 400    | invalid_request_error / content_policy_review (job id in message) |
| missing or wrong key                        | 401    | authentication_error / invalid_api_key        |
| cancelled meanwhile (native cancel)         | 409    | invalid_request_error / job_cancelled         |
| throttled / over an admission limit         | 429    | rate_limit_error / the limit's name (e.g. jobs_in_flight) or rate_limit_exceeded; Retry-After |
| generation failed                           | 500    | server_error / generation_failed              |
| database or queue down                      | 503    | server_error / service_unavailable, Retry-After |
| not finished within the wait                | 504    | server_error / timeout (job keeps running; id in message) |
"""

from __future__ import annotations

import asyncio
import base64
import logging
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import actions
from jobs.access import tokens
from jobs.api import idempotency
from jobs.api.client_gone import CLIENT_GONE
from jobs.api.errors import exception_handler as native_exception_handler
from jobs.api.openai import compat as openai_compat
from jobs.api.openai import stream as openai_stream
from jobs.api.schema import ImagesResponseSerializer, ModelListSerializer, ModelSerializer
from jobs.api.serializers import JobCreateSerializer
from jobs.api.strict import INVALID_TYPE, UNKNOWN_FIELD, StrictCharField, StrictChoiceField, StrictIntegerField, json_kind
from jobs.media.storage import image_url, public_storage
from jobs.models import GeneratedImage, GenerationJob, JobStatus
from jobs.pipeline.submit import submit_job
from jobs.realtime.state import job_hub
from jobs.representation import revised_prompt
from scheduling import catalogue

try:  # admission control (per-user limits, the honest wait limit): the native API answers 429
    from jobs.admission.control import Refused
except ImportError:  # pragma: no cover - older trees without admission control
    Refused = ()  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

CLIENT_LEFT = 499  # nginx's "client closed request": logged, read by nobody

BearerTokenAuthentication = tokens.BearerTokenAuthentication  # the native API's (hashed) tokens as Bearer


# --- errors ------------------------------------------------------------------------------------


class OpenAIError(exceptions.APIException):
    """An error answered as-is in the OpenAI shape."""

    def __init__(self, status_code: int, message: str, type_: str = "invalid_request_error", param=None, code=None, headers=None,
                 extra: dict | None = None):
        super().__init__(message)
        self.extra = extra or {}
        self.status_code = status_code
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(message: str, type_: str, param=None, code=None, extra: dict | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code, **(extra or {})}}


# Field names of the native serializer -> the OpenAI request's parameter names.
_NATIVE_PARAM = {"width": "size", "height": "size", "count": "n"}

_BY_STATUS = {
    400: ("invalid_request_error", "invalid_value"),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    406: ("invalid_request_error", None),
    409: ("invalid_request_error", "conflict"),
    415: ("invalid_request_error", "unsupported_media_type"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    503: ("server_error", "service_unavailable"),
}


def _first_message(data) -> tuple[str | None, str]:
    """(param, message) of the first error in a DRF error body."""
    if isinstance(data, dict):
        if "detail" in data and len(data) == 1:
            return None, str(data["detail"])
        for field, messages in data.items():
            _, message = _first_message(messages)
            param = None if field in ("non_field_errors", "detail") else _NATIVE_PARAM.get(field, field)
            return param, message
    if isinstance(data, list) and data:
        return _first_message(data[0])
    return None, str(data)


# Parameters of OpenAI's Images API that only go with outputs this server does not produce: named
# as unsupported rather than unknown.
UNSUPPORTED = {"frame_count": "GIF output", "frame_duration_ms": "GIF output", "svg": "SVG output"}


def invalid_request(form: serializers.Serializer) -> OpenAIError:
    """A request form's first error as OpenAI answers it: an unknown parameter first (its own
    message, `unknown_parameter`), then a value of the wrong JSON type (`invalid_type`), then
    an invalid value."""
    errors = form.errors
    param, message = _first_message(errors)
    name = next(iter(errors), None)
    first = errors[name][0] if name is not None and isinstance(errors[name], list) and errors[name] else None
    code = getattr(first, "code", None)
    if code == UNKNOWN_FIELD and name in UNSUPPORTED:
        return OpenAIError(400, f"Unsupported parameter: '{name}' is not supported here: this server does not produce "
                                f"{UNSUPPORTED[name]}.", param=name, code="unsupported_parameter")
    if code == UNKNOWN_FIELD:
        return OpenAIError(400, f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
    expected = getattr(form.fields.get(name), "expected", None) if name is not None else None
    if code == INVALID_TYPE and expected:
        given = form.initial_data.get(name) if isinstance(form.initial_data, dict) else None
        return OpenAIError(400, f"Invalid type for '{name}': expected {expected}, but got {json_kind(given)} instead.",
                           param=name, code="invalid_type")
    return OpenAIError(400, message, param=param, code="invalid_value")


def submitted(request, scope: str, data: dict) -> GenerationJob:
    """The native submit of an OpenAI-shaped request (its `Idempotency-Key` under `scope`), its
    refusals in OpenAI's error shape: a key reused with another body, and a 429 with Retry-After."""
    try:
        job, _ = idempotency.submitting(request, scope, lambda: submit_job(request.user, data))
    except idempotency.IdempotencyError as exc:
        raise OpenAIError(exc.status, exc.message, param=idempotency.HEADER, code="idempotency_key") from exc
    except Refused as refused:
        raise OpenAIError(
            429, refused.message, "rate_limit_error", code=getattr(refused, "limit", "") or "rate_limit_exceeded",
            headers={"Retry-After": str(refused.retry_after)},
        ) from refused
    assert isinstance(job, GenerationJob)
    return job


def openai_exception_handler(exc, context):
    """DRF's (and the native API's) exception handling, answered in the OpenAI shape."""
    if isinstance(exc, OpenAIError):
        return Response(error_body(exc.message, exc.type, exc.param, exc.code, exc.extra), status=exc.status_code, headers=exc.headers)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = native_exception_handler(exc, context)
    if response is None:
        log.exception("unhandled error in the OpenAI-compatible API", exc_info=exc)
        return Response(error_body("The server had an error while processing the request.", "server_error", None, "internal_error"), status=500)
    type_, code = _BY_STATUS.get(response.status_code, ("server_error" if response.status_code >= 500 else "invalid_request_error", None))
    param, message = _first_message(response.data)
    if response.status_code == 401:
        param = None
        header = context["request"].META.get("HTTP_AUTHORIZATION", "") if context.get("request") else ""
        if not header:
            message = "You didn't provide an API key. Send it as `Authorization: Bearer <token>`."
        elif not header.lower().startswith("bearer "):
            message = "Send the API key as `Authorization: Bearer <token>`."
        else:
            message = "Incorrect API key provided."
    out = Response(error_body(message, type_, param, code), status=response.status_code)
    for name in ("Retry-After", "WWW-Authenticate", "Allow"):
        if name in response:
            out[name] = response[name]
    return out


class OpenAICompatibleView(APIView):
    openai_compatible = True  # read by jobs.api.schema for the error shape
    authentication_classes = [BearerTokenAuthentication]
    permission_classes = [IsAuthenticated]

    def get_exception_handler(self):
        return openai_exception_handler


# --- models ----------------------------------------------------------------------------------


def model_object(served: catalogue.ServedModel) -> dict:
    index = served.path / ("config.json" if served.is_video else "model_index.json")
    try:
        created = int(index.stat().st_mtime)
    except OSError:
        created = 0
    return {"id": served.version, "object": "model", "created": created, "owned_by": "imagegen"}


class ModelList(OpenAICompatibleView):
    @extend_schema(
        operation_id="openai_models_list",
        summary="List models (OpenAI shape)",
        description="The served models (the default first), as `GET https://api.openai.com/v1/models` lists them.",
        responses={200: ModelListSerializer},
    )
    def get(self, request):
        return Response({"object": "list", "data": [model_object(m) for m in catalogue.served().values()]})


class ModelDetail(OpenAICompatibleView):
    @extend_schema(
        operation_id="openai_models_retrieve",
        summary="Retrieve a model (OpenAI shape)",
        responses={200: ModelSerializer},
    )
    def get(self, request, model_id: str):
        served = catalogue.served().get(model_id)
        if served is None:
            raise OpenAIError(404, f"The model '{model_id}' does not exist.", param="model", code="model_not_found")
        return Response(model_object(served))


# --- generations --------------------------------------------------------------------------


def _size_choices() -> list[str]:
    return [f"{w}x{h}" for w, h in settings.IMAGEGEN_SIZE_MENU]


class ImageGenerationSerializer(openai_compat.OpenAIImageOptions):
    prompt = StrictCharField(max_length=settings.IMAGEGEN_MAX_PROMPT_CHARS, help_text="What to draw.")
    n = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=settings.IMAGEGEN_MAX_COUNT, default=1,
        help_text="How many images (one job, seeds seed+index).",
    )
    size = StrictCharField(
        required=False, allow_null=True, default=None,
        help_text=(
            "`WIDTHxHEIGHT` from the size menu (" + ", ".join(_size_choices()) + "); "
            '`"auto"` or absent: the first menu size.'
        ),
    )
    response_format = StrictChoiceField(
        choices=["url", "b64_json"], required=False, allow_null=True, default="url",
        help_text="`url` (absolute, immutable, no auth needed) or `b64_json` (the PNG inline).",
    )
    model = StrictCharField(
        required=False, allow_null=True, allow_blank=True, default=None,
        help_text="A served model's id (see GET /v1/models); absent: the default (or the quality tier's model).",
    )
    user = StrictCharField(
        required=False, allow_null=True, allow_blank=True,
        help_text="Accepted for compatibility and only logged; the identity is the token's user.",
    )
    safety_identifier = StrictCharField(
        required=False, allow_null=True, allow_blank=True,
        help_text="`user`'s successor: accepted for compatibility and only logged.",
    )
    # Field.style (rendering hints) is an instance attribute; the metaclass takes this class one
    # into the declared fields, so the name is free here.
    style = StrictChoiceField(  # type: ignore[assignment]
        choices=["vivid", "natural"], required=False, allow_null=True,
        help_text="dall-e-3's style: accepted for compatibility; the served model has none.",
    )
    complexity = StrictChoiceField(
        choices=["low", "medium", "high"], required=False, allow_null=True,
        help_text="Accepted for compatibility; `quality` sets the work spent on an image here.",
    )

    def validate_size(self, value):
        menu = _size_choices()
        if value in (None, "", "auto"):
            return menu[0]
        if value not in menu:
            raise serializers.ValidationError(f"{value!r} is not a supported size; use one of: {', '.join(menu)}.")
        return value

    def validate_model(self, value):
        if value in (None, ""):
            return ""
        if catalogue.get(value) is None:
            raise OpenAIError(
                400, f"The model '{value}' does not exist; this server serves {', '.join(map(repr, catalogue.served()))}.",
                param="model", code="model_not_found",
            )
        if catalogue.get(value).is_video:
            raise OpenAIError(400, f"The model '{value}' makes videos: ask POST /v1/videos for it.", param="model",
                              code="invalid_value")
        return value

    def validate(self, attrs):
        attrs["n"] = attrs.get("n") or 1
        attrs["response_format"] = attrs.get("response_format") or "url"
        return attrs


def _native_data(attrs: dict) -> dict:
    """The OpenAI request as the native API's validated job data (same validation as POST /api/v1/jobs)."""
    width, height = (int(v) for v in attrs["size"].split("x"))
    native = JobCreateSerializer(data={"prompt": attrs["prompt"], "width": width, "height": height, "count": attrs["n"],
                                       **openai_compat.native_fields(attrs)})
    if not native.is_valid():
        param, message = _first_message(native.errors)
        raise OpenAIError(400, message, param=param, code="invalid_value")
    return native.validated_data


_STOP_WAITING = (JobStatus.DONE, JobStatus.BLOCKED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.REVIEW)


def _status(job_id) -> str | None:
    return GenerationJob.objects.filter(id=job_id).values_list("status", flat=True).first()


def _row(job_id) -> GenerationJob | None:
    return GenerationJob.objects.filter(id=job_id).first()


async def _wait_for(job: GenerationJob, seconds: float, client_gone: asyncio.Event | None = None) -> GenerationJob | None:
    """Wait on the job's events until it is terminal or held for review, the time is up, or
    the client has gone (client_gone is set then). The row afterwards (None: deleted)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    subscription = await job_hub().subscribe(job.id)
    gone = asyncio.ensure_future(client_gone.wait()) if client_gone is not None else None
    try:
        status = await sync_to_async(_status)(job.id)
        while status is not None and status != "deleted" and status not in _STOP_WAITING:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            event = asyncio.ensure_future(subscription.queue.get())
            waiting = {event} if gone is None else {event, gone}
            done, _ = await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if event in done:
                message = event.result()
                if message.get("type") == "status":
                    status = message.get("status")
            else:
                event.cancel()
            if gone is not None and gone in done:
                break
    finally:
        if gone is not None:
            gone.cancel()
        await subscription.close()
    return await sync_to_async(_row)(job.id)


@dataclass(frozen=True)
class _Pending:
    """What the synchronous part (auth, throttles, validation, submit) hands to the wait."""

    job: GenerationJob
    response_format: str


def _client_left(job: GenerationJob) -> None:
    row = _row(job.id)
    log.info("openai-compatible request for job %s: the client disconnected before it finished", job.id)
    if row is not None and settings.IMAGEGEN_OPENAI_CANCEL_ON_DISCONNECT:
        actions.cancel_job(row, reason="the client disconnected before the job finished (OpenAI-compatible request)")


def _answer(request, pending: _Pending, job: GenerationJob | None) -> JsonResponse:
    try:
        return JsonResponse(_outcome(request, pending, job))
    except OpenAIError as exc:
        return JsonResponse(error_body(exc.message, exc.type, exc.param, exc.code, exc.extra), status=exc.status_code,
                            headers=exc.headers)


def _outcome(request, pending: _Pending, job: GenerationJob | None) -> dict:
    """The images of a done job, or the OpenAIError its outcome maps to."""
    if job is None:
        raise OpenAIError(404, "The job was deleted while waiting.", code="not_found")
    if job.status == JobStatus.DONE:
        created = int(job.created_at.timestamp())
        return {"created": created, "data": _image_items(request, job, pending.response_format),
                **openai_compat.response_fields(job)}
    if job.status == JobStatus.BLOCKED:
        raise OpenAIError(
            400,
            f"Your request was rejected by the safety system ({job.blocked_stage or 'policy'}): {job.reason} "
            f"(job {job.id}; an appeal is possible through the native API).",
            param="prompt" if openai_compat.stopped_at_input(job) else None,
            code="moderation_blocked",
            extra={"moderation_details": openai_compat.moderation_details(job)},
        )
    if job.status == JobStatus.REVIEW:
        raise OpenAIError(
            400,
            f"Your request is held for review by a moderator: {job.reason}. Job {job.id}; follow it with "
            f"{_native_urls(job.id)}.",
            param="prompt" if openai_compat.stopped_at_input(job) else None,
            code="content_policy_review",
        )
    if job.status == JobStatus.FAILED:
        raise OpenAIError(500, f"Image generation failed: {job.reason} (job {job.id}).", "server_error", code="generation_failed")
    if job.status == JobStatus.CANCELLED:
        raise OpenAIError(409, f"Job {job.id} was cancelled: {job.reason}.", code="job_cancelled")
    raise OpenAIError(
        504,
        f"Job {job.id} did not finish within {settings.IMAGEGEN_OPENAI_WAIT_SECONDS:g} s (it is {job.status}); "
        f"it keeps running: follow it with {_native_urls(job.id)}.",
        "server_error",
        code="timeout",
    )


def _image_items(request, job: GenerationJob, response_format: str) -> list[dict]:
    images = GeneratedImage.objects.filter(job=job, tier="public").order_by("index")
    revised = revised_prompt(job)  # what was drawn, when the rewriter ran (OpenAI's field)
    items = []
    for image in images:
        if response_format == "b64_json":
            with public_storage().open(image.storage_key, "rb") as fh:
                items.append({"b64_json": base64.b64encode(fh.read()).decode("ascii"), "revised_prompt": revised})
        else:
            items.append({"url": request.build_absolute_uri(image_url(image.storage_key)), "revised_prompt": revised})
    return items


def _native_urls(job_id) -> str:
    return f"GET /api/v1/jobs/{job_id} (or its /events stream)"


class ImageGenerations(OpenAICompatibleView):
    @extend_schema(
        operation_id="openai_images_generations_create",
        summary="Create images (OpenAI Images API shape)",
        description=(
            "Submits a normal job (same safety gates, batching and cache as `POST /api/v1/jobs`) and waits "
            "for it, at most IMAGEGEN_OPENAI_WAIT_SECONDS (default 120). `quality` picks the steps (low 8, "
            "medium 20, high 40, auto the server default); guidance is the server's default; `output_format` "
            "png/jpeg/webp with `output_compression`; `stream: true` (with `partial_images` 0-3) answers "
            "`text/event-stream` with `image_generation.partial_image` and `image_generation.completed` events "
            "(docs/api.md). `style`, `complexity`, `moderation`, `user` and `safety_identifier` are accepted and "
            "ignored (or only logged); any other parameter is a 400 `unknown_parameter` naming it, a value of the "
            "wrong JSON type a 400 `invalid_type` (no coercion: `\"stream\": \"yes\"` is refused).\n\n"
            "Errors: 400 `moderation_blocked` with `moderation_details` {stage: input|output, categories} "
            "(blocked prompt or image), 400 `content_policy_review` "
            "(held for a moderator; the job id is in the message), 400 `invalid_value` with `param` (e.g. size), "
            "400 `model_not_found`, 401 `invalid_api_key`, 409 `job_cancelled`, 429 `rate_limit_exceeded`, "
            "500 `generation_failed`, 503 `service_unavailable`, 504 `timeout` (the job keeps running; its id "
            "is in the message, poll the native API). OpenAI clients retry 409, 429 and 5xx by default, and "
            "each retry submits a new job: use `max_retries=0` where that matters, or send an `Idempotency-Key` "
            "header (the same key and body answer with the same job)."
        ),
        request=ImageGenerationSerializer,
        parameters=[idempotency.schema_parameter()],
        responses={
            200: ImagesResponseSerializer,
            422: OpenApiResponse(description="The Idempotency-Key was used with a different body (`param`: the header)."),
            409: OpenApiResponse(description="The job was cancelled (through the native API) while waiting."),
            500: OpenApiResponse(description="Generation failed (`generation_failed`)."),
            504: OpenApiResponse(description="Not finished in time (`timeout`); the job keeps running."),
        },
        examples=[
            OpenApiExample(
                "64x64 as a URL",
                request_only=True,
                value={"prompt": "a red circle on a blue background", "n": 1, "size": "64x64", "response_format": "url"},
            )
        ],
    )
    def post(self, request):
        form = ImageGenerationSerializer(data=request.data)
        if not form.is_valid():
            raise invalid_request(form)
        attrs = form.validated_data
        job = submitted(request, "openai", _native_data(attrs))
        log.info(
            "openai-compatible generation: job %s for user %s (client-supplied user %r, safety_identifier %r)",
            job.id, request.user.pk, attrs.get("user"), attrs.get("safety_identifier"),
        )
        if attrs.get("stream"):
            return openai_stream.stream(request, job, attrs)  # the job's gated previews and images as events
        # The wait happens outside DRF's synchronous dispatch (as_view below): no thread polls.
        response = Response(status=202)
        response.pending = _Pending(job, attrs["response_format"])
        return response

    @classmethod
    def as_view(cls, **initkwargs):
        """DRF's view for auth, throttles, validation and the submit (in a thread), then an
        async wait on the job's events that ends when the client leaves."""
        submit_view = super().as_view(**initkwargs)

        async def view(request, *args, **kwargs):
            response = await sync_to_async(submit_view)(request, *args, **kwargs)
            pending = getattr(response, "pending", None)
            if pending is None:
                return response  # an error, answered by DRF in the OpenAI shape
            gone = getattr(request, "scope", {}).get(CLIENT_GONE)
            try:
                job = await _wait_for(pending.job, settings.IMAGEGEN_OPENAI_WAIT_SECONDS, gone)
            except asyncio.CancelledError:  # Django cancels async views whose client left
                await asyncio.shield(sync_to_async(_client_left)(pending.job))
                raise
            if gone is not None and gone.is_set():
                await sync_to_async(_client_left)(pending.job)
                return HttpResponse(status=CLIENT_LEFT)
            return await sync_to_async(_answer)(request, pending, job)

        view.cls = cls  # read by drf-spectacular and DRF's schema tools
        view.initkwargs = initkwargs
        return csrf_exempt(view)
