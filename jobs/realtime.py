"""Shared by the websocket consumer and the SSE view: who is asking, and the current state."""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser

from jobs.events import last_state
from jobs.models import GenerationJob, JobStatus
from jobs.serializers import status_event


def _token_user(header: str):
    from rest_framework.authtoken.models import Token

    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != "token":
        return None
    token = Token.objects.select_related("user").filter(key=parts[1]).first()
    if token is None or not token.user.is_active:
        return None
    return token.user


@database_sync_to_async
def authenticate_header_or_session(header: str, request=None):
    if header:
        return _token_user(header)
    if request is not None:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return user
    return None


@database_sync_to_async
def token_user(header: str):
    return _token_user(header) or AnonymousUser()


@database_sync_to_async
def owned_job(user, job_id) -> GenerationJob | None:
    if user is None or not user.is_authenticated:
        return None
    return GenerationJob.objects.filter(id=job_id, owner=user).first()


@database_sync_to_async
def current_events(job_id, status_only: bool = False) -> list[dict]:
    """The status from the database row, then the latest progress while it runs."""
    job = GenerationJob.objects.prefetch_related("images").get(id=job_id)
    events = [status_event(job)]
    if not status_only and job.status == JobStatus.RUNNING:
        last = last_state(job_id)
        if last and last.get("type") == "progress":
            events.append(last)
    return events
