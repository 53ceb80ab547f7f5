"""The rewrite stage's writes (a job's prompt through the rewriter, between the prompt check and
generation). The stage is per job, batched across users: a worker takes every waiting job (up
to IMAGEGEN_REWRITE_BATCH) in one claim, rewrites their prompts in one forward pass and saves
each with a compare-and-set on its lease.

    waiting   queued, not scheduled, rewrite on, not rewritten, lease free or run out, and its own
              prompt (as the user wrote it) allowed by the gate or approved by a moderator: a
              run woken for one job never takes another still waiting for its check, nor one
              whose block or hold a batch drain recorded but has not yet applied
    claimed   its lease set for IMAGEGEN_LEASE_SECONDS, rewrite_attempts + 1 (a started run)
    saved     revised_prompt, the rewriter's identity, rewritten_at; then the second prompt
              gate (a changed prompt) or straight to the scheduler (unchanged)

A claim message that finds nothing waiting does nothing (a duplicate or a redelivery). A run
whose worker died leaves its lease to run out: the prompt stage's re-send (the reaper re-sends
checks of queued, unscheduled jobs) wakes a worker again, whose claim counts the attempt; past
IMAGEGEN_MAX_ATTEMPTS started runs the job fails, naming the stage.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from imagegen.stage_table import STAGES
from jobs.actions.lifecycle import fail_rewrite
from jobs.models import GenerationJob, JobStatus
from safety.models import SafetyVerdict


def needs_rewrite(job: GenerationJob) -> bool:
    return bool(job.rewrite) and job.rewritten_at is None


def prompt_allowed() -> Exists:
    """The job's own prompt was allowed: the gate's verdict at stage `prompt`, or a moderator's
    approval of the prompt (a human verdict on no image; before a rewrite there is no other)."""
    verdicts = SafetyVerdict.objects.filter(job=OuterRef("pk"), decision="allow")
    return Exists(verdicts.filter(Q(stage="prompt") | Q(stage="human", image__isnull=True)))


def _waiting(now):
    return GenerationJob.objects.filter(
        prompt_allowed(), status=JobStatus.QUEUED, scheduled_at=None, rewrite=True, rewritten_at=None,
    ).filter(Q(rewrite_lease_expires_at=None) | Q(rewrite_lease_expires_at__lt=now))


def claim_rewrites(first: str | None, limit: int) -> list[GenerationJob]:
    """Lease up to `limit` waiting jobs (`first` among them when it waits), oldest first. A job
    whose started runs already reached IMAGEGEN_MAX_ATTEMPTS fails instead, naming the stage."""
    now = timezone.now()
    with transaction.atomic():
        waiting = _waiting(now).select_for_update(skip_locked=True).order_by("created_at")
        picked = list(waiting.filter(id=first)[:1]) if first else []
        picked += list(waiting.exclude(id__in=[j.id for j in picked])[: max(0, limit - len(picked))])
        worn = [j for j in picked if j.rewrite_attempts >= settings.IMAGEGEN_MAX_ATTEMPTS]
        for job in worn:
            fail_rewrite(job.id, (
                f"{STAGES['rewrite'].describes} was interrupted {job.rewrite_attempts} times; nothing was generated"
            ))
        jobs = [j for j in picked if j not in worn]
        if jobs:
            GenerationJob.objects.filter(id__in=[j.id for j in jobs]).update(
                rewrite_lease_expires_at=now + timedelta(seconds=settings.IMAGEGEN_LEASE_SECONDS),
                rewrite_attempts=F("rewrite_attempts") + 1,
            )
    return jobs


def save_rewrite(job_id, revised: str, identity: str) -> bool:
    """Record what the rewriter wrote, if the job still waits for it under this run's lease
    (cancelled, failed or saved meanwhile: False, and nothing changes)."""
    return bool(GenerationJob.objects.filter(
        id=job_id, status=JobStatus.QUEUED, scheduled_at=None, rewrite=True, rewritten_at=None,
        rewrite_lease_expires_at__isnull=False,
    ).update(revised_prompt=revised, rewriter_version=identity, rewritten_at=timezone.now(),
             rewrite_lease_expires_at=None))


def release_rewrites(job_ids: list) -> None:
    """A run that failed before saving gives its jobs back at once (their attempt stays counted)."""
    GenerationJob.objects.filter(id__in=job_ids, rewritten_at=None).update(rewrite_lease_expires_at=None)
