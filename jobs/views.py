from __future__ import annotations

from django.http import FileResponse, Http404, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET
from rest_framework import status
from rest_framework.generics import ListAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import actions
from jobs.models import GeneratedImage, GenerationJob
from jobs.serializers import JobCreateSerializer, JobSerializer
from jobs.storage import public_storage


def own_job(request, job_id) -> GenerationJob:
    # Another user's job is a 404, never a 403: existence does not leak.
    return get_object_or_404(GenerationJob.objects.select_related("batch"), id=job_id, owner=request.user)


class NewestFirst(CursorPagination):
    ordering = "-created_at"
    page_size = 20
    page_size_query_param = "page_size"
    max_page_size = 100


class JobListCreate(ListAPIView):
    serializer_class = JobSerializer
    pagination_class = NewestFirst

    def get_queryset(self):
        return (
            GenerationJob.objects.filter(owner=self.request.user)
            .select_related("batch")
            .prefetch_related("images")
        )

    def post(self, request):
        serializer = JobCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        job = actions.submit_job(request.user, serializer.validated_data)
        return Response(JobSerializer(job).data, status=status.HTTP_202_ACCEPTED)


class JobDetail(APIView):
    def get(self, request, job_id):
        return Response(JobSerializer(own_job(request, job_id)).data)


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
    response = FileResponse(storage.open(storage_key, "rb"), content_type="image/png")
    from django.conf import settings

    response["Cache-Control"] = settings.IMAGE_CACHE_CONTROL
    return response


def healthz(request):
    return JsonResponse({"status": "ok"})
