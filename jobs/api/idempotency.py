"""Idempotency-Key on submits (POST /api/v1/jobs, POST /v1/images/generations).

The same key and the same body (the parsed JSON, keys sorted) from the same user within
IMAGEGEN_IDEMPOTENCY_HOURS answer with the job the first request made (200 on the native
route, not a second job); the same key with a different body answers 422 naming the header.
Keys are per user and per route. The key is reserved (a row with no job yet) before the
submit, so two identical requests sent at once make one job: the second waits for the first
(at most WAIT_SECONDS, then 409). A refused or failed submit releases the key. A reservation
still without a job after IMAGEGEN_IDEMPOTENCY_TAKEOVER_SECONDS was left by a web process that
died mid-submit (a submit takes well under a second): the next request with the key takes it
over (a conditional update, so only one does) instead of answering 409 until the key expires.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

HEADER = "Idempotency-Key"
HEADER_DOC = (
    "Optional, 1-255 printable ASCII characters. The same key and JSON body within 24 h answer with the "
    "job the first request made (no second job); the same key with another body answers 422 naming this header."
)


def schema_parameter():
    """The header as an OpenAPI parameter (drf-spectacular) for the submit routes."""
    from drf_spectacular.utils import OpenApiParameter

    return OpenApiParameter(HEADER, str, OpenApiParameter.HEADER, required=False, description=HEADER_DOC)
MAX_KEY = 255
WAIT_SECONDS = 10.0


class IdempotencyError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Claim:
    """A reserved key: `job` set when the key was already used (replay); else remember() the
    new job, or release() on failure."""
    row_id: int
    reserved_at: datetime  # the row's created_at as this claim wrote (or found) it
    job: object | None = None


def body_digest(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def key_of(request) -> str | None:
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not key or len(key) > MAX_KEY or not key.isprintable() or not key.isascii():
        raise IdempotencyError(400, f"{HEADER} must be 1 to {MAX_KEY} printable ASCII characters")
    return key


def claim(user, scope: str, key: str, digest: str) -> Claim:
    from jobs.models import IdempotencyKey

    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        cutoff = timezone.now() - timedelta(hours=settings.IMAGEGEN_IDEMPOTENCY_HOURS)
        IdempotencyKey.objects.filter(user=user, scope=scope, key=key, created_at__lt=cutoff).delete()
        try:
            with transaction.atomic():
                made = IdempotencyKey.objects.create(user=user, scope=scope, key=key, body_sha256=digest)
            return Claim(made.id, made.created_at)
        except IntegrityError:
            pass
        row = IdempotencyKey.objects.filter(user=user, scope=scope, key=key).select_related("job").first()
        if row is None:
            continue  # released or expired meanwhile
        if row.body_sha256 != digest:
            raise IdempotencyError(422, f"this {HEADER} was already used with a different request body; "
                                   "use a new key for a new request")
        if row.job is not None:
            return Claim(row.id, row.created_at, row.job)
        abandoned = timezone.now() - timedelta(seconds=settings.IMAGEGEN_IDEMPOTENCY_TAKEOVER_SECONDS)
        if row.created_at < abandoned:
            now = timezone.now()
            if IdempotencyKey.objects.filter(id=row.id, job=None, created_at=row.created_at).update(created_at=now):
                return Claim(row.id, now)
            continue  # another request took it over, or the job arrived: look again
        if time.monotonic() > deadline:
            raise IdempotencyError(409, f"a request with this {HEADER} is still being processed; retry shortly")
        time.sleep(0.05)


def remember(claimed: Claim, job) -> None:
    from jobs.models import IdempotencyKey

    # Only while the reservation is still this claim's (not taken over as abandoned).
    IdempotencyKey.objects.filter(id=claimed.row_id, job=None, created_at=claimed.reserved_at).update(job=job)


def release(claimed: Claim) -> None:
    from jobs.models import IdempotencyKey

    IdempotencyKey.objects.filter(id=claimed.row_id, job=None, created_at=claimed.reserved_at).delete()


@shared_task(name="jobs.api.idempotency.expire")
def expire() -> int:
    """Periodic (beat): forget keys past the window."""
    from jobs.models import IdempotencyKey

    cutoff = timezone.now() - timedelta(hours=settings.IMAGEGEN_IDEMPOTENCY_HOURS)
    return IdempotencyKey.objects.filter(created_at__lt=cutoff).delete()[0]


def submitting(request, scope: str, submit) -> tuple[object, bool]:
    """(the job, whether it is a replay of an earlier request with this key). Without the
    header: submit() as is. IdempotencyError for a bad, reused or busy key."""
    key = key_of(request)
    if key is None:
        return submit(), False
    claimed = claim(request.user, scope, key, body_digest(request.data))
    if claimed.job is not None:
        return claimed.job, True
    try:
        job = submit()
    except BaseException:
        release(claimed)
        raise
    remember(claimed, job)
    return job, False
