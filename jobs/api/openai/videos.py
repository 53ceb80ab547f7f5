"""The OpenAI Videos API shape: POST/GET /v1/videos, GET/DELETE /v1/videos/{video_id},
GET /v1/videos/{video_id}/content, as the official `openai` package's `client.videos` calls them.

A create becomes a native video job (jobs.pipeline.submit.submit_job, the same gates, admission
and idempotency as POST /api/v1/jobs) on a served video model (scheduling/catalogue.py
`ServedModel.is_video`), answered at once as `queued`: the client polls `retrieve` as it does
OpenAI's. The video's id is "video_" + the job's uuid in hex, parsed back on every call; a job
that is not the caller's, not a video, deleted, or an id not of that form is a 404.

| job status                     | video status | error                                          |
| ------------------------------ | ------------ | ---------------------------------------------- |
| queued (prompt check, waiting) | queued       | null                                           |
| running, review (held)         | in_progress  | null                                           |
| done                           | completed    | null                                           |
| blocked                        | failed       | {code: moderation_blocked, message: reason}    |
| failed                         | failed       | {code: failed, message: reason}                |
| cancelled                      | failed       | {code: cancelled, message: reason}             |

`progress` is the job's denoising step over its steps (0-99 until completed, then 100).
`seconds` and `size` are the model's: `seconds` must be its clip length (frames / fps) and
`size` one of its sizes, else a 400 naming them. The content route never carries media bytes:
it answers 302 to the clip's immutable public URL (the MP4, the poster or the sprite sheet),
which the official client follows (its httpx client is made with follow_redirects=True).
"""

from __future__ import annotations

import logging
import re
import uuid

from django.conf import settings
from django.db.models import Q
from django.http import HttpResponseRedirect
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.response import Response

from jobs import actions
from jobs.api import idempotency
from jobs.api.openai.views import OpenAICompatibleView, OpenAIError, _first_message, invalid_request, submitted
from jobs.api.serializers import JobCreateSerializer
from jobs.api.strict import StrictCharField, StrictSerializer
from jobs.media.storage import image_url
from jobs.models import GeneratedImage, GenerationJob, JobStatus
from scheduling import catalogue

log = logging.getLogger(__name__)

ID_PREFIX = "video_"
_ID = re.compile(r"video_([0-9a-f]{32})")
IDEMPOTENCY_SCOPE = "openai-videos"

STATUS: dict[str, str] = {
    JobStatus.QUEUED: "queued",
    JobStatus.RUNNING: "in_progress",
    JobStatus.REVIEW: "in_progress",
    JobStatus.DONE: "completed",
    JobStatus.BLOCKED: "failed",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELLED: "failed",
}
ERROR_CODE: dict[str, str] = {JobStatus.BLOCKED: "moderation_blocked", JobStatus.FAILED: "failed", JobStatus.CANCELLED: "cancelled"}

# variant -> the clip's file (a key of the row's `media`, or its MP4)
VARIANTS = ("video", "thumbnail", "spritesheet")
_VARIANT_FILE = {"thumbnail": "poster", "spritesheet": "sprites"}

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


# --- ids and the Video object ----------------------------------------------------------------


def video_id_of(job) -> str:
    return ID_PREFIX + uuid.UUID(str(job.id)).hex


def job_id_of(value: str) -> uuid.UUID | None:
    """The job id a video id names; None for anything not of the form video_<32 hex digits>."""
    match = _ID.fullmatch(value or "")
    return uuid.UUID(hex=match[1]) if match else None


def seconds_text(frames: int, fps: int) -> str:
    """A clip's length as the API's `seconds` string ("2" for 16 frames at 8 fps)."""
    return f"{frames / fps:g}" if fps else "0"


def _progress(job: GenerationJob) -> int:
    if job.status == JobStatus.DONE:
        return 100
    if not job.progress_total:
        return 0
    return max(0, min(99, 100 * job.progress_step // job.progress_total))


def _error(job: GenerationJob) -> dict | None:
    code = ERROR_CODE.get(job.status)
    if code is None:
        return None
    message = job.reason or {"moderation_blocked": "The request was blocked by the safety system.",
                             "failed": "The video generation failed.", "cancelled": "The video job was cancelled."}[code]
    return {"code": code, "message": message}


def _unix(value) -> int | None:
    return int(value.timestamp()) if value is not None else None


def video_object(job: GenerationJob) -> dict:
    """The OpenAI `Video` object of a video job."""
    status = STATUS.get(job.status, "queued")
    return {
        "id": video_id_of(job),
        "object": "video",
        "model": job.model_version,
        "status": status,
        "progress": _progress(job),
        "created_at": _unix(job.created_at),
        "completed_at": _unix(job.finished_at) if status in ("completed", "failed") else None,
        "expires_at": None,  # the clip's public objects are immutable and do not expire
        "size": f"{job.width}x{job.height}",
        "seconds": seconds_text(job.frames, job.fps),
        "prompt": job.prompt,
        "error": _error(job),
        "remixed_from_video_id": None,
    }


def _not_found(value: str) -> OpenAIError:
    return OpenAIError(404, f"Video with id '{value}' not found.", code="video_not_found")


def own_video(request, value: str) -> GenerationJob:
    """The caller's video job a video id names (not deleted), else the 404 OpenAI answers."""
    job_id = job_id_of(value)
    job = (GenerationJob.objects.visible().filter(id=job_id, owner=request.user, frames__gt=1).first()
           if job_id is not None else None)
    if job is None:
        raise _not_found(value)
    return job


# --- schema shapes ---------------------------------------------------------------------------


class VideoErrorSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="moderation_blocked, failed or cancelled.")
    message = serializers.CharField(help_text="Why: the job's reason.")


class VideoSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="`video_` + the native job's id in hex.")
    object = serializers.ChoiceField(choices=["video"])
    model = serializers.CharField(help_text="The served video model that draws it.")
    status = serializers.ChoiceField(choices=["queued", "in_progress", "completed", "failed"])
    progress = serializers.IntegerField(min_value=0, max_value=100, help_text="Denoising steps done, in percent.")
    created_at = serializers.IntegerField(help_text="Unix seconds.")
    completed_at = serializers.IntegerField(allow_null=True, help_text="Unix seconds; null until it finished.")
    expires_at = serializers.IntegerField(allow_null=True, help_text="Always null: the clip's objects do not expire.")
    size = serializers.CharField(help_text="WIDTHxHEIGHT.")
    seconds = serializers.CharField(help_text="The clip's length (frames / fps), as a string.")
    prompt = serializers.CharField(allow_null=True)
    error = VideoErrorSerializer(allow_null=True, help_text="Why it failed; null unless `status` is failed.")
    remixed_from_video_id = serializers.CharField(allow_null=True, help_text="Always null: no remixes here.")


class VideoListSerializer(serializers.Serializer):
    object = serializers.ChoiceField(choices=["list"])
    # The page's items (OpenAI's name; the metaclass takes this class attribute into the fields).
    data = VideoSerializer(many=True)  # type: ignore[assignment]
    first_id = serializers.CharField(allow_null=True)
    last_id = serializers.CharField(allow_null=True, help_text="The next page's `after`.")
    has_more = serializers.BooleanField()


class VideoDeletedSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=["video.deleted"])
    deleted = serializers.BooleanField()


# --- create ----------------------------------------------------------------------------------


class VideoCreateSerializer(StrictSerializer):
    prompt = StrictCharField(max_length=settings.IMAGEGEN_MAX_PROMPT_CHARS, help_text="What the clip shows.")
    model = StrictCharField(
        required=False, allow_null=True, allow_blank=True, default="", max_length=100,
        help_text="A served video model (GET /api/v1/models, `kind` video); absent: the served video model.",
    )
    seconds = StrictCharField(
        required=False, allow_null=True, allow_blank=True, default="", max_length=20,
        help_text="The clip's length: must be the model's (frames / fps: \"2\" for 16 frames at 8 fps); absent: that.",
    )
    size = StrictCharField(
        required=False, allow_null=True, allow_blank=True, default="", max_length=20,
        help_text="WIDTHxHEIGHT, one of the model's sizes (\"64x64\"); absent: its first.",
    )
    input_reference = serializers.FileField(
        required=False, help_text="Not supported here: a request with it is a 400 naming it.",
    )


def video_models() -> list[catalogue.ServedModel]:
    return [m for m in catalogue.served().values() if m.is_video]


def _model(name: str) -> catalogue.ServedModel:
    videos = video_models()
    offered = ", ".join(repr(m.version) for m in videos) or "none"
    if not name:
        if not videos:
            raise OpenAIError(400, "No video model is served here.", param="model", code="model_not_found")
        return videos[0]
    served = catalogue.served().get(name)
    if served is None:
        raise OpenAIError(400, f"The model '{name}' does not exist; this server's video models: {offered}.",
                          param="model", code="model_not_found")
    if not served.is_video:
        raise OpenAIError(400, f"The model '{name}' draws images, not videos; this server's video models: {offered}.",
                          param="model", code="invalid_value")
    return served


def _seconds(value: str, served: catalogue.ServedModel) -> None:
    clip = served.frames / served.fps
    try:
        given = float(value)
    except ValueError:
        given = None
    if given != clip:
        raise OpenAIError(
            400,
            f"Invalid value for 'seconds': {value!r}. {served.version} draws clips of {seconds_text(served.frames, served.fps)} "
            f"seconds ({served.frames} frames at {served.fps} fps): use '{seconds_text(served.frames, served.fps)}'.",
            param="seconds", code="invalid_value",
        )


def _sizes(served: catalogue.ServedModel) -> list[tuple[int, int]]:
    return list(served.sizes or settings.IMAGEGEN_SIZE_MENU)


def _size(value: str, served: catalogue.ServedModel) -> tuple[int, int]:
    sizes = _sizes(served)
    menu = [f"{w}x{h}" for w, h in sizes]
    if not value:
        return sizes[0]
    if value not in menu:
        raise OpenAIError(400, f"Invalid value for 'size': {value!r}. {served.version} draws {', '.join(menu)}.",
                          param="size", code="invalid_value")
    return sizes[menu.index(value)]


# A native field's error, named as the Videos API's parameter.
_PARAM = {"width": "size", "height": "size", "frames": "seconds"}


def native_data(request, attrs: dict) -> dict:
    """The request as the native API's validated video job (the same validation as POST /api/v1/jobs).
    The rewriter is left to the native default, as the Images route leaves it."""
    served = _model(attrs.get("model") or "")
    if attrs.get("seconds"):
        _seconds(attrs["seconds"], served)
    width, height = _size(attrs.get("size") or "", served)
    native = JobCreateSerializer(
        data={"prompt": attrs["prompt"], "model": served.version, "frames": served.frames, "width": width,
              "height": height, "count": 1},
        context={"request": request},
    )
    if not native.is_valid():
        param, message = _first_message(native.errors)
        field = next(iter(native.errors), None)
        raise OpenAIError(400, message, param=_PARAM.get(field or "", param), code="invalid_value")
    return native.validated_data


def _has_input_reference(request) -> bool:
    names = [*request.data.keys(), *request.FILES.keys()] if hasattr(request.data, "keys") else list(request.FILES)
    return any(name == "input_reference" or str(name).startswith("input_reference[") for name in names)


_LIST_PARAMETERS = [
    OpenApiParameter("after", str, description="A video id: the page after it (the last page's `last_id`)."),
    OpenApiParameter("limit", int, description=f"Videos per page, 1-{MAX_LIMIT} (default {DEFAULT_LIMIT})."),
    OpenApiParameter("order", str, enum=["asc", "desc"], description="By creation time; default desc (newest first)."),
]


class VideoListCreate(OpenAICompatibleView):
    parser_classes = [MultiPartParser, FormParser, JSONParser]

    @extend_schema(
        operation_id="openai_videos_create",
        summary="Create a video (OpenAI Videos API shape)",
        description=(
            "Submits a native video job (`POST /api/v1/jobs` with the model's `frames`: the same safety gates, "
            "admission and quota) and answers its Video object at once (`status` queued); poll "
            "`GET /v1/videos/{video_id}`. multipart/form-data as the official client sends it, or JSON. `model`: "
            "a served video model (absent: the served one); `seconds` must be the model's clip length (frames / "
            "fps) and `size` one of its sizes, else a 400 naming them; `input_reference` is not supported (400 "
            "`unsupported_parameter`); any other parameter is a 400 `unknown_parameter`. A refused prompt or "
            "frame shows later as `status` failed with `error.code` moderation_blocked. An `Idempotency-Key` "
            "header answers a repeated request with the same video."
        ),
        request={"multipart/form-data": VideoCreateSerializer, "application/json": VideoCreateSerializer},
        parameters=[idempotency.schema_parameter()],
        responses={
            200: VideoSerializer,
            422: OpenApiResponse(description="The Idempotency-Key was used with a different body (`param`: the header)."),
        },
        examples=[OpenApiExample("a 2-second clip", request_only=True,
                                 value={"prompt": "a red circle moving left to right on a blue background",
                                        "seconds": "2", "size": "64x64"})],
    )
    def post(self, request):
        if _has_input_reference(request):
            raise OpenAIError(400, "Unsupported parameter: 'input_reference' is not supported here: clips are drawn "
                                   "from the prompt alone.", param="input_reference", code="unsupported_parameter")
        form = VideoCreateSerializer(data=request.data)
        if not form.is_valid():
            raise invalid_request(form)
        job = submitted(request, IDEMPOTENCY_SCOPE, native_data(request, form.validated_data))
        log.info("openai-compatible video: job %s for user %s", job.id, request.user.pk)
        return Response(video_object(job))

    @extend_schema(
        operation_id="openai_videos_list",
        summary="List your videos (OpenAI Videos API shape)",
        description=(
            "The caller's video jobs (not image jobs, not deleted ones), newest first unless `order=asc`, as "
            "OpenAI's cursor page: `has_more`, and `last_id` as the next page's `after`. An `after` that is not "
            "one of the caller's videos is a 400 naming it."
        ),
        parameters=_LIST_PARAMETERS,
        responses={200: VideoListSerializer, 400: OpenApiResponse(description="A bad `after`, `limit` or `order`.")},
    )
    def get(self, request):
        query = request.query_params
        order = query.get("order") or "desc"
        if order not in ("asc", "desc"):
            raise OpenAIError(400, f"Invalid value for 'order': {order!r}; use 'asc' or 'desc'.", param="order",
                              code="invalid_value")
        try:
            limit = int(query.get("limit") or DEFAULT_LIMIT)
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_LIMIT:
            raise OpenAIError(400, f"Invalid value for 'limit': {query.get('limit')!r}; use 1 to {MAX_LIMIT}.",
                              param="limit", code="invalid_value")
        videos = GenerationJob.objects.visible().filter(owner=request.user, frames__gt=1)
        after = query.get("after")
        if after:
            # A deleted video still marks its place (its row stays until retention purges it).
            job_id = job_id_of(after)
            mark = (GenerationJob.objects.filter(id=job_id, owner=request.user, frames__gt=1)
                    .values_list("created_at", "id").first() if job_id is not None else None)
            if mark is None:
                raise OpenAIError(400, f"Invalid value for 'after': no video '{after}'.", param="after",
                                  code="invalid_value")
            at, pk = mark
            videos = videos.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=pk) if order == "desc"
                                   else Q(created_at__gt=at) | Q(created_at=at, id__gt=pk))
        videos = videos.order_by(*(("-created_at", "-id") if order == "desc" else ("created_at", "id")))
        rows = list(videos[:limit + 1])
        data = [video_object(job) for job in rows[:limit]]
        return Response({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None, "has_more": len(rows) > limit})


class VideoDetail(OpenAICompatibleView):
    @extend_schema(
        operation_id="openai_videos_retrieve",
        summary="Retrieve a video (OpenAI Videos API shape)",
        description="The video's status, progress and, once failed, its error. Another user's video is a 404.",
        responses={200: VideoSerializer},
    )
    def get(self, request, video_id: str):
        return Response(video_object(own_video(request, video_id)))

    @extend_schema(
        operation_id="openai_videos_delete",
        summary="Delete a video (OpenAI Videos API shape)",
        description=(
            "The native delete (`DELETE /api/v1/jobs/{id}`): cancelled first if it has not finished, its public "
            "objects deleted and purged from the CDN, gone from the owner's view."
        ),
        responses={200: VideoDeletedSerializer},
    )
    def delete(self, request, video_id: str):
        job = own_video(request, video_id)
        actions.delete_job(job)
        return Response({"id": video_id_of(job), "object": "video.deleted", "deleted": True})


class AnyAccept(DefaultContentNegotiation):
    """The official client asks for the content with `Accept: application/binary`: the answer is a
    redirect to the file (or an error in JSON, as OpenAI's) whatever the request accepts."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class VideoContent(OpenAICompatibleView):
    content_negotiation_class = AnyAccept

    @extend_schema(
        operation_id="openai_videos_content",
        summary="Download a video's content (OpenAI Videos API shape)",
        description=(
            "A 302 to the immutable public URL of the clip's MP4 (`variant=video`, the default), its poster "
            "(`thumbnail`, PNG) or its sprite sheet (`spritesheet`, PNG): the API never carries media bytes, and "
            "the official client follows the redirect. A video that is not completed is a 404 (`video_not_ready` "
            "while queued or in progress, as OpenAI answers; `video_failed` once failed)."
        ),
        parameters=[
            OpenApiParameter("variant", str, enum=list(VARIANTS), description="Which file (default video)."),
            OpenApiParameter("Location", str, OpenApiParameter.HEADER, response=[302],
                             description="The file's absolute, immutable public URL (no auth needed)."),
        ],
        responses={
            302: OpenApiResponse(description="Redirect to the file's public URL."),
            400: OpenApiResponse(description="An unknown `variant`."),
        },
    )
    def get(self, request, video_id: str):
        variant = request.query_params.get("variant") or "video"
        if variant not in VARIANTS:
            raise OpenAIError(400, f"Invalid value for 'variant': {variant!r}; use one of: {', '.join(VARIANTS)}.",
                              param="variant", code="invalid_value")
        job = own_video(request, video_id)
        status = STATUS.get(job.status, "queued")
        error = _error(job)
        if error is not None:
            raise OpenAIError(404, f"Video {video_id} failed ({error['code']}): it has no content.", code="video_failed")
        if status != "completed":
            raise OpenAIError(404, f"Video is not ready yet: it is {status} ({_progress(job)}%). Download it once its "
                                   "status is completed.", code="video_not_ready")
        clip = (GeneratedImage.objects.filter(job=job, tier="public", bytes_dropped=False).exclude(media={})
                .order_by("index").first())
        if clip is None:
            raise OpenAIError(404, f"Video {video_id} has no content to download.", code="video_not_found")
        key = clip.storage_key if variant == "video" else clip.media[_VARIANT_FILE[variant]]
        response = HttpResponseRedirect(request.build_absolute_uri(image_url(key)))
        response["Cache-Control"] = "private, no-store"  # the answer depends on the caller; the file does not
        return response
