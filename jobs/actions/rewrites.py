"""The rewrite stage's writes (a job's prompt through the rewriter, between the prompt check and
generation). The stage is per job, batched across users: a worker takes every waiting job (up
to IMAGEGEN_REWRITE_BATCH) in one claim, rewrites their prompts in one forward pass and saves
each with a compare-and-set on its lease.

    waiting   in the stage `rewrite`, lease free or run out. Only the prompt gate's allow (or a
              moderator's approval) moves a job there (jobs.actions.admit), so a run woken for
              one job never takes another still waiting for its check, nor one whose block or
              hold a batch drain recorded but has not yet applied
    claimed   its lease set for the rewrite row's lease, rewrite_attempts + 1 (a started run)
    saved     revised_prompt, its notes, the rewriter's identity, rewritten_at, and the move on (a
              compare-and-set from `rewrite` under a lease): to `rewrite_check`, the second
              prompt gate, when it changed the prompt; to `waiting_gpu` (the scheduler) when not

A claim message that finds nothing waiting does nothing (a duplicate or a redelivery). A run
whose worker died leaves its lease to run out: the reaper re-sends a rewrite token for a job
waiting in the stage with no live lease, which wakes a worker again, whose claim counts the attempt; past
IMAGEGEN_MAX_ATTEMPTS started runs the job fails, naming the stage.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from imagegen.stage_table import STAGES
from jobs.actions.lifecycle import fail_rewrite, move, schedule
from jobs.models import GenerationJob, JobStage


def _waiting(now):
    return GenerationJob.objects.filter(stage=JobStage.REWRITE).filter(
        Q(rewrite_lease_expires_at=None) | Q(rewrite_lease_expires_at__lt=now))


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
                rewrite_lease_expires_at=now + timedelta(seconds=STAGES["rewrite"].lease_seconds),
                rewrite_attempts=F("rewrite_attempts") + 1,
            )
    return jobs


def save_rewrite(job_id, revised: str, identity: str, changed: bool, notes: list[str] | tuple[str, ...] = ()) -> bool:
    """Record what the rewriter wrote (and its notes: what it substituted, in words for the user)
    and move the job on (`rewrite_check` when the prompt changed, else `waiting_gpu`), if it still
    waits in the stage under this run's lease (cancelled, failed or saved meanwhile: False, and
    nothing changes)."""
    held = {"rewrite_lease_expires_at__isnull": False}
    saved = {"revised_prompt": revised, "rewriter_version": identity, "rewritten_at": timezone.now(),
             "rewrite_notes": list(notes), "rewrite_lease_expires_at": None}
    if changed:
        return move(job_id, JobStage.REWRITE, JobStage.REWRITE_CHECK, held, **saved)
    return schedule(job_id, JobStage.REWRITE, held, **saved)


def release_rewrites(job_ids: list) -> None:
    """A run that failed before saving gives its jobs back at once (their attempt stays counted)."""
    GenerationJob.objects.filter(id__in=job_ids, stage=JobStage.REWRITE).update(rewrite_lease_expires_at=None)
