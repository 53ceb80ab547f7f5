"""`Prefer: wait=N` (RFC 7240) on a submit: answer with the finished job when it ends within N
seconds (at most IMAGEGEN_PREFER_WAIT_MAX), else with the usual 202 and the job as it is then.
The job goes on either way; a client that leaves while waiting cancels nothing, and its thread
is released at once (imagegen/threaded_http.py sets CLIENT_GONE). Meant for few-step models,
whose jobs end in about a second: the wait holds one of the web process's threads, so the cap is
short, and one user may hold at most IMAGEGEN_PREFER_WAIT_PER_USER of them per process (past it,
the usual 202 at once, with no Preference-Applied)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

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


CLIENT_GONE = "imagegen.client_gone"  # the WSGI environ's threading.Event: the client disconnected

_lock = threading.Lock()
_held: dict[object, int] = {}


def held(user_pk) -> int:
    """The user's waits held now in this process."""
    with _lock:
        return _held.get(user_pk, 0)


@contextmanager
def holding(user_pk) -> Iterator[bool]:
    """Whether the user may hold one more wait now (False past IMAGEGEN_PREFER_WAIT_PER_USER);
    the wait is counted while the block runs."""
    with _lock:
        allowed = _held.get(user_pk, 0) < settings.IMAGEGEN_PREFER_WAIT_PER_USER
        if allowed:
            _held[user_pk] = _held.get(user_pk, 0) + 1
    try:
        yield allowed
    finally:
        if allowed:
            with _lock:
                _held[user_pk] -= 1
                if not _held[user_pk]:
                    del _held[user_pk]


def wait_for_end(job: GenerationJob, seconds: float, gone: threading.Event | None = None) -> GenerationJob:
    """The job once it reached a terminal status, or as it is when `seconds` ran out or the
    client went away (`gone`)."""
    deadline = time.monotonic() + seconds
    pause = 0.02
    while job.status not in TERMINAL_STATUSES and time.monotonic() < deadline and not (gone and gone.is_set()):
        if gone is not None:
            gone.wait(min(pause, max(0.0, deadline - time.monotonic())))
        else:
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 1.5, 0.25)
        job = GenerationJob.objects.select_related("batch").prefetch_related("images").get(id=job.id)
    return job


def schema_parameter():
    from drf_spectacular.utils import OpenApiParameter

    return OpenApiParameter(HEADER, str, OpenApiParameter.HEADER, required=False, description=HEADER_DOC)
