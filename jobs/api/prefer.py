"""`Prefer: wait=N` (RFC 7240) on a submit: answer with the finished job when it ends within N
seconds (at most IMAGEGEN_PREFER_WAIT_MAX), else with the usual 202 and the job as it is then.
The job goes on either way; a client that leaves while waiting cancels nothing. Meant for
few-step models, whose jobs end in about a second: the wait holds one of the web process's
threads, so the cap is short."""

from __future__ import annotations

import time

from django.conf import settings

from jobs.models import TERMINAL_STATUSES, GenerationJob

HEADER = "Prefer"
HEADER_DOC = (
    "`wait=N` (RFC 7240): answer 200 with the finished job if it ends within N seconds (capped by the "
    "server, IMAGEGEN_PREFER_WAIT_MAX), else 202 as without it; `Preference-Applied` says the wait used."
)


def requested_wait(request) -> float | None:
    """The wait the client asked for, capped; None without a valid `wait` preference."""
    for preference in request.headers.get(HEADER, "").split(","):
        name, _, value = preference.strip().partition("=")
        if name.strip().lower() != "wait":
            continue
        try:
            seconds = float(value.strip().strip('"').split(";")[0])
        except ValueError:
            return None
        if not seconds >= 0:  # NaN too
            return None
        return min(seconds, settings.IMAGEGEN_PREFER_WAIT_MAX)
    return None


def wait_for_end(job: GenerationJob, seconds: float) -> GenerationJob:
    """The job once it reached a terminal status, or as it is when `seconds` ran out."""
    deadline = time.monotonic() + seconds
    pause = 0.02
    while job.status not in TERMINAL_STATUSES and time.monotonic() < deadline:
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 1.5, 0.25)
        job = GenerationJob.objects.select_related("batch").prefetch_related("images").get(id=job.id)
    return job


def schema_parameter():
    from drf_spectacular.utils import OpenApiParameter

    return OpenApiParameter(HEADER, str, OpenApiParameter.HEADER, required=False, description=HEADER_DOC)
