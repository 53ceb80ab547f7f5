from __future__ import annotations

import hashlib
import re

from django.conf import settings
from django.db import transaction
from django.http import FileResponse, Http404, HttpResponse
from django.views.decorators.http import require_GET
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.generics import ListAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from imagegen import metrics
from imagegen.precompiled import Precompiled
from jobs import actions
from jobs.access import usage
from jobs.access.throttles import RateLimited
from jobs.admission.control import Refused
from jobs.api import idempotency, prefer
from jobs.api.schema import ConflictSerializer, QueueSerializer, RefusedSerializer
from jobs.api.serializers import AppealSerializer, JobCreateSerializer
from jobs.media.storage import public_storage
from jobs.models import TERMINAL_STATUSES, GeneratedImage, GenerationJob
from jobs.pipeline.submit import submit_job
from jobs.representation import JobSerializer

_json = JSONRenderer()


def limited(refused: Refused) -> RateLimited:
    """An admission limit's refusal as the API's one 429 (a DRF Throttled)."""
    return RateLimited(refused.retry_after, refused.limit, refused.message, eta_seconds=refused.eta_seconds)


# A poll's one read of the job (imagegen/precompiled.py: compiled once, not per request).
_OWN_JOB = Precompiled(
    lambda id, owner: GenerationJob.objects.visible().select_related("batch").filter(id=id, owner_id=owner),
    id=GenerationJob._meta.get_field("id"), owner=GenerationJob._meta.get_field("owner"))


def own_job(request, job_id) -> GenerationJob:
    # Another user's job is a 404, never a 403: existence does not leak.
    job = _OWN_JOB.first(id=job_id, owner=request.user.pk)
    if job is None:
        raise Http404
    return job


class NewestFirst(CursorPagination):
    ordering = "-created_at"
    page_size = 20
    page_size_query_param = "page_size"
    max_page_size = 100


@extend_schema_view(
    get=extend_schema(
        operation_id="jobs_list",
        summary="List your jobs",
        description="The caller's jobs, newest first, cursor-paginated (`next`/`previous` URLs).",
    ),
    post=extend_schema(
        operation_id="jobs_create",
        summary="Submit a job",
        description=(
            "Answers 202 with the job at once; the prompt is checked, then the job waits for a GPU batch. "
            "Sizes come from the size menu; `seed` null or absent picks one. 429 with Retry-After when an "
            "admission limit refuses it. With an `Idempotency-Key` already used with the same body: 200 and "
            "that job; with another body: 422. With `Prefer: wait=N`: 200 and the finished job if it ends "
            "within N seconds (capped by the server), else 202 as without it."
        ),
        request=JobCreateSerializer,
        parameters=[idempotency.schema_parameter(), prefer.schema_parameter()],
        responses={202: JobSerializer, 200: JobSerializer, 429: RefusedSerializer,
                   422: OpenApiResponse(description="The Idempotency-Key was used with a different body.")},
    ),
)
class JobListCreate(ListAPIView):
    serializer_class = JobSerializer
    pagination_class = NewestFirst

    def get_queryset(self):
        return (
            GenerationJob.objects.visible().filter(owner=self.request.user)
            .select_related("batch")
            .prefetch_related("images")
        )

    def post(self, request):
        serializer = JobCreateSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        try:
            job, replayed = idempotency.submitting(request, "jobs", lambda: submit_job(request.user, serializer.validated_data))
        except idempotency.IdempotencyError as exc:
            return Response({"detail": exc.message, idempotency.HEADER: [exc.message]}, status=exc.status)
        except Refused as refused:
            metrics.inc("imagegen_shed_total", limit=refused.limit)
            raise limited(refused) from None
        if replayed:  # the job an earlier request with this Idempotency-Key made
            return Response(JobSerializer(job, context={"estimate": True}).data, status=status.HTTP_200_OK)
        wait = prefer.requested_wait(request)
        if wait is None:
            return Response(JobSerializer(job).data, status=status.HTTP_202_ACCEPTED)
        with prefer.holding(request.user.pk) as may_wait:
            if not may_wait:  # the user's held waits fill their share of this process's threads
                return Response(JobSerializer(job).data, status=status.HTTP_202_ACCEPTED)
            job = prefer.wait_for_end(job, wait, request.META.get(prefer.CLIENT_GONE))
        ended = job.status in TERMINAL_STATUSES
        return Response(JobSerializer(job, context={"estimate": not ended}).data,
                        status=status.HTTP_200_OK if ended else status.HTTP_202_ACCEPTED,
                        headers={"Preference-Applied": f"wait={wait:g}"})


def etag_of(body: bytes) -> str:
    return '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'


def if_none_match(request, etag: str) -> bool:
    """RFC 9110: If-None-Match lists entity tags (weak comparison) or is "*"."""
    header = request.headers.get("If-None-Match", "")
    if not header:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in header.split(",")}
    return "*" in tags or etag in tags


@extend_schema_view(get=extend_schema(
    operation_id="jobs_retrieve", summary="Get a job",
    description=(
        "Carries an `ETag`; send it back as `If-None-Match` and an unchanged job answers 304 with no body. "
        "A queued job's `eta_seconds` counts down, so its tag changes between polls; a finished job's does not."
    ),
    responses={200: JobSerializer, 304: OpenApiResponse(description="Not modified since the ETag sent in If-None-Match.")},
))
class JobDetail(APIView):
    def get(self, request, job_id):
        body = _json.render(JobSerializer(own_job(request, job_id), context={"estimate": True}).data)
        etag = etag_of(body)
        headers = {"ETag": etag, "Cache-Control": "private, no-cache"}
        if if_none_match(request, etag):
            return HttpResponse(status=status.HTTP_304_NOT_MODIFIED, headers=headers)
        return HttpResponse(body, content_type="application/json", headers=headers)


@extend_schema_view(
    post=extend_schema(
        operation_id="jobs_appeal",
        summary="Appeal a blocked job",
        description="The owner of a blocked job asks once for a moderator's decision; the case joins the review queue.",
        request=AppealSerializer,
        responses={
            202: JobSerializer,
            400: OpenApiResponse(description="The note is invalid, or the job is not blocked (`{detail, status}`)."),
            409: OpenApiResponse(ConflictSerializer, description="Already appealed."),
        },
    )
)
class JobAppeal(APIView):
    """The owner of a blocked job asks once for a moderator's decision."""

    def post(self, request, job_id):
        from jobs.actions import ReviewError, appeal

        job = own_job(request, job_id)
        given = AppealSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        note = given.validated_data["note"]
        try:
            with transaction.atomic():  # the bound and the appeal in one step, under the user's lock
                usage.lock_user(request.user.pk)
                held = usage.review_cases(request.user.pk)
                if held >= settings.IMAGEGEN_USER_MAX_IN_REVIEW:
                    raise limited(Refused(
                        f"You have {held} jobs waiting for a moderator; the limit is "
                        f"{settings.IMAGEGEN_USER_MAX_IN_REVIEW}. Wait for a decision.", retry_after=60,
                        limit="held_for_review"))
                appeal(job, note.strip())
        except ReviewError as exc:
            code = status.HTTP_409_CONFLICT if job.status == "blocked" else status.HTTP_400_BAD_REQUEST
            return Response({"detail": str(exc), "status": job.status}, status=code)
        job.refresh_from_db()
        return Response(JobSerializer(job).data, status=status.HTTP_202_ACCEPTED)


@extend_schema_view(
    get=extend_schema(operation_id="queue_retrieve", summary="Queue depth and estimated wait", responses={200: QueueSerializer})
)
class QueueView(APIView):
    """Per served model (one lane each) and shape: images queued, the estimated wait for a new
    job, live workers."""

    def get(self, request):
        from scheduling import catalogue

        return Response({"models": [_queue_of(served) for served in catalogue.served().values()]})


def _queue_of(served) -> dict:
    from jobs.admission.summary import new_job_estimate, queue_counts
    from scheduling import scheduler
    from scheduling.lanes import lane_of

    # From the per-shape summary (jobs/admission/summary.py), not a replay per shape per request.
    lane = lane_of(served.version)
    shapes = []
    for shape, counts in sorted(queue_counts(lane).items()):
        info = scheduler.parse_shape(shape)
        est = new_job_estimate(shape, 1, model_name=lane)
        shapes.append({
            **info,
            "jobs": counts["jobs"],
            "images": counts["images"],
            "estimated_wait_seconds": None if est.eta_seconds is None else round(est.eta_seconds, 2),
        })
    est = new_job_estimate(scheduler.shape_key(served.version, *settings.IMAGEGEN_SIZE_MENU[0], served.default_steps,
                                               served.guidance_scale, ""), 1, model_name=lane)
    return {
        "model": lane,
        "version": served.version,
        "display_name": served.label,
        "default": served.default,
        "default_steps": served.default_steps,
        "min_steps": served.min_steps,
        "max_steps": served.max_steps,
        "guidance_scale": served.guidance_scale,
        "active_workers": est.active_gpus,
        "queued_images": est.queued_images,
        "queued_gpu_seconds": round(est.work_ahead_seconds, 3),
        "estimated_wait_seconds": None if est.eta_seconds is None else round(est.eta_seconds, 2),
        "shapes": shapes,
    }


@extend_schema_view(
    post=extend_schema(
        operation_id="jobs_cancel",
        summary="Cancel a job",
        description="A running batch sees the cancel within one step. 409 if the job has already finished.",
        request=None,
        responses={202: JobSerializer, 409: OpenApiResponse(ConflictSerializer, description="Already finished.")},
    )
)
class JobCancel(APIView):
    def post(self, request, job_id):
        job = own_job(request, job_id)
        if not actions.cancel_job(job):
            return Response(
                {"detail": f"The job has already finished ({job.status}); it cannot be cancelled.", "status": job.status},
                status=status.HTTP_409_CONFLICT,
            )
        return Response(JobSerializer(job).data, status=status.HTTP_202_ACCEPTED)


@require_GET
def serve_image(request, key: str):
    """Public images from local storage (the embedded default; production serves them from a
    bucket behind a CDN). Only delivered images have a row in the public tier."""
    storage_key = f"i/{key}"
    if not GeneratedImage.objects.filter(storage_key=storage_key, tier="public").exists():
        raise Http404("no such image")
    storage = public_storage()
    if not storage.exists(storage_key):
        raise Http404("no such image")
    from jobs.pipeline.retention import count_view

    count_view(storage_key)
    from jobs.media.encoding import FORMATS, format_of_key

    response = FileResponse(storage.open(storage_key, "rb"), content_type=FORMATS.get(format_of_key(key), ("application/octet-stream",))[0])
    from django.conf import settings

    response["Cache-Control"] = settings.IMAGE_CACHE_CONTROL
    return response



_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


@require_GET
def serve_clip_file(request, clip: str, name: str):
    """A delivered clip's files from local storage (the MP4, its poster and sprites, the HLS
    playlists and segments: jobs/pipeline/publish.py publish_clip), with their content types and
    single byte ranges (a browser seeking in the MP4). Only a public clip's own files are served."""
    from jobs.media.video import CONTENT_TYPES

    prefix = f"v/{clip}/"
    media = (GeneratedImage.objects.filter(storage_key=prefix + "video.mp4", tier="public")
             .values_list("media", flat=True).first())
    key = prefix + name
    if not media or key not in media.get("files", []):
        raise Http404("no such file")
    storage = public_storage()
    try:
        with storage.open(key, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise Http404("no such file") from None
    content_type = CONTENT_TYPES.get("." + name.rsplit(".", 1)[-1], "application/octet-stream")
    wanted = _RANGE.fullmatch(request.headers.get("Range", "").strip())
    if wanted and (wanted[1] or wanted[2]):
        size = len(data)
        first, last = (int(wanted[1]), int(wanted[2]) if wanted[2] else size - 1) if wanted[1] else (size - int(wanted[2]), size - 1)
        if first >= size or first > last:
            response = HttpResponse(status=416)
            response["Content-Range"] = f"bytes */{size}"
            return response
        last = min(last, size - 1)
        response = HttpResponse(data[first:last + 1], status=206, content_type=content_type)
        response["Content-Range"] = f"bytes {first}-{last}/{size}"
    else:
        response = HttpResponse(data, content_type=content_type)
    response["Accept-Ranges"] = "bytes"
    response["Cache-Control"] = settings.IMAGE_CACHE_CONTROL
    return response
