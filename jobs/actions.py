"""State changes of a job, as named actions. Views, consumers and tasks call these.

Every transition is a compare-and-set on the current status (a conditional UPDATE), so a
redelivered or duplicated task can never move a job twice or deliver it twice.
"""

from __future__ import annotations

import logging
import secrets
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from gpu_tasks import scheduler
from gpu_tasks.redis_conn import PREFIX, get_redis
from imagegen import metrics
from jobs.models import TERMINAL_STATUSES, GenerationJob, JobStatus

log = logging.getLogger(__name__)


def shape_of(job: GenerationJob) -> str:
    return scheduler.shape_key(
        job.model_version, job.width, job.height, job.steps, job.guidance_scale, job.scheduler
    )


def lane_of(model_version: str) -> str:
    """The scheduling lane (and GPU queue suffix) of a model version: the model's name for the
    version this deployment serves, name@version for any other (a canary, or a version being
    drained)."""
    if model_version == settings.IMAGEGEN_MODEL_VERSION:
        return settings.IMAGEGEN_MODEL_NAME
    return f"{settings.IMAGEGEN_MODEL_NAME}@{model_version}"


def pick_version(job_id) -> str:
    """The canary takes IMAGEGEN_CANARY_SHARE of new jobs, chosen by the job id (stable)."""
    share = settings.IMAGEGEN_CANARY_SHARE
    if settings.IMAGEGEN_CANARY_VERSION and share > 0 and (job_id.int % 10_000) / 10_000 < share:
        return settings.IMAGEGEN_CANARY_VERSION
    return settings.IMAGEGEN_MODEL_VERSION


def gpu_queue(model_name: str) -> str:
    return settings.QUEUE_GPU_PREFIX + model_name


def send_batch_token(model_name: str) -> None:
    """Tell a free GPU worker of the model that there is work; a token that finds none is a no-op."""
    from gpu_tasks.tasks import run_batch

    run_batch.apply_async(args=[model_name], queue=gpu_queue(model_name))


def submit_job(owner, data: dict) -> GenerationJob:
    """Admit a validated request: served from the request-hash cache when every image is
    there (done at once, no queue, no GPU), else queued with only the missing images to make.
    Raises admission.Refused (429) past the user's limits or the honest wait limit. The job's
    estimate is left on job.estimate."""
    from jobs import admission, cache
    from safety.tasks import check_prompt

    seed = data.get("seed")
    if seed is None:
        seed = settings.IMAGEGEN_FIXED_SEED if settings.IMAGEGEN_SEED_POLICY == "fixed" else secrets.randbelow(2**32)
    admission.check_user_limits(owner, data["count"])
    job = GenerationJob(
        owner=owner,
        prompt=data["prompt"],
        negative_prompt=data.get("negative_prompt", ""),
        width=data["width"],
        height=data["height"],
        steps=data["steps"],
        guidance_scale=data["guidance_scale"],
        seed=seed,
        count=data["count"],
        progress_total=data["steps"],
    )
    job.model_version = pick_version(job.id)
    cached = cache.lookup(job)
    job.estimate = None
    if len(cached) < job.count:
        def shape_for(steps: int) -> str:
            return scheduler.shape_key(job.model_version, job.width, job.height, steps, job.guidance_scale, job.scheduler)

        steps, job.estimate = admission.admit_or_degrade(
            shape_for, job.count - len(cached), job.steps, data.get("allow_degrade", False)
        )
        if steps != job.steps:
            metrics.inc("imagegen_degraded_total")
            job.degraded, job.requested_steps, job.steps, job.progress_total = True, job.steps, steps, steps
            cached = cache.lookup(job)
    with transaction.atomic():
        if len(cached) == job.count:
            _finish_from_cache(job, cached)
        else:
            job.save()
            _attach_cached(job, cached)
            # Robust: a broker outage must not turn an accepted (committed) job into an error
            # answer that invites a duplicate; the reaper re-sends lost prompt checks.
            transaction.on_commit(lambda: check_prompt.delay(str(job.id)), robust=True)
    return job


def _attach_cached(job: GenerationJob, cached: dict) -> None:
    from jobs.models import GeneratedImage

    GeneratedImage.objects.bulk_create(
        [
            GeneratedImage(
                job=job, index=index, seed=job.seed + index, storage_key=src.storage_key, width=src.width,
                height=src.height, byte_size=src.byte_size, sha256=src.sha256, content_type=src.content_type,
                tier="public",
            )
            for index, src in cached.items()
        ]
    )


def _finish_from_cache(job: GenerationJob, cached: dict) -> None:
    """Every image is cached: the same request under the same policy and model version was
    already gated and delivered, so the job is done with the stored images."""
    from safety.models import SafetyVerdict

    now = timezone.now()
    job.status, job.started_at, job.finished_at, job.progress_step = JobStatus.DONE, now, now, job.steps
    job.scheduled_at = now
    job.save()
    _attach_cached(job, cached)
    source = next(iter(cached.values()))
    SafetyVerdict.objects.create(
        job=job, stage="prompt", decision="allow", reason=f"identical to job {source.job_id} (request-hash cache)",
        policy_version=source.job.verdicts.filter(stage="prompt").values_list("policy_version", flat=True).first() or "",
    )


def _publish_status(job: GenerationJob) -> None:
    from jobs import events
    from jobs.serializers import status_event

    events.publish(job.id, status_event(job))


def _transition(job_id, from_statuses, to_status: str, **fields) -> bool:
    updated = GenerationJob.objects.filter(id=job_id, status__in=list(from_statuses)).update(
        status=to_status, **fields
    )
    if updated:
        _publish_status(GenerationJob.objects.get(id=job_id))
    return bool(updated)


def cancel_job(job: GenerationJob) -> bool:
    """Cancel a job that has not finished. A running batch sees the flag within one step."""
    was = job.status
    if was in TERMINAL_STATUSES:
        return False
    changed = _transition(
        job.id,
        [JobStatus.QUEUED, JobStatus.REVIEW, JobStatus.RUNNING],
        JobStatus.CANCELLED,
        finished_at=timezone.now(),
        reason="cancelled by the owner",
    )
    if changed:
        scheduler.set_cancel_flag(str(job.id))
        if job.scheduled_at is not None:
            scheduler.remove(shape_of(job), str(job.id), images_to_make(job))
    job.refresh_from_db()
    return changed


def block_job(job_id, stage: str, reason: str) -> bool:
    return _transition(
        job_id,
        [JobStatus.QUEUED, JobStatus.REVIEW, JobStatus.RUNNING],
        JobStatus.BLOCKED,
        blocked_stage=stage,
        reason=reason,
        finished_at=timezone.now(),
    )


def fail_unstarted(job_id, reason: str) -> bool:
    return _transition(job_id, [JobStatus.QUEUED, JobStatus.REVIEW], JobStatus.FAILED, reason=reason, finished_at=timezone.now())


def hold_for_review(job_id, stage: str, reason: str, from_status: str = JobStatus.QUEUED) -> bool:
    return _transition(job_id, [from_status], JobStatus.REVIEW, blocked_stage=stage, reason=reason)


def admit(job_id) -> bool:
    """The prompt passed: put the job in its shape's bucket and wake a GPU worker."""
    now = timezone.now()
    claimed = GenerationJob.objects.filter(id=job_id, status=JobStatus.QUEUED, scheduled_at=None).update(
        scheduled_at=now
    )
    if not claimed:
        return False
    job = GenerationJob.objects.get(id=job_id)
    _enqueue(job, now.timestamp())
    return True


def images_to_make(job: GenerationJob) -> int:
    return job.count - job.images.count()


def _enqueue(job: GenerationJob, enqueued_at: float) -> None:
    lane = lane_of(job.model_version)
    scheduler.enqueue(lane, shape_of(job), str(job.id), images_to_make(job), enqueued_at)
    send_batch_token(lane)


def claim_batch(job_ids: list[str], batch_id) -> list[GenerationJob]:
    """queued -> running for the taken jobs, in one UPDATE; cancelled or already-taken jobs
    (a stale or duplicated scheduler entry) are simply not claimed."""
    now = timezone.now()
    GenerationJob.objects.filter(id__in=job_ids, status=JobStatus.QUEUED, scheduled_at__isnull=False).update(
        status=JobStatus.RUNNING,
        attempts=F("attempts") + 1,
        started_at=now,
        batch_id=batch_id,
        progress_step=0,
        lease_expires_at=now + timedelta(seconds=settings.IMAGEGEN_LEASE_SECONDS),
    )
    jobs = list(GenerationJob.objects.filter(id__in=job_ids, status=JobStatus.RUNNING, batch_id=batch_id))
    order = {str(j): i for i, j in enumerate(job_ids)}
    jobs.sort(key=lambda job: order[str(job.id)])
    for job in jobs:
        _publish_status(job)
    return jobs


def renew_leases(job_ids: list[str]) -> None:
    GenerationJob.objects.filter(id__in=job_ids, status=JobStatus.RUNNING).update(
        lease_expires_at=timezone.now() + timedelta(seconds=settings.IMAGEGEN_LEASE_SECONDS)
    )


def fail_running(job: GenerationJob, reason: str) -> bool:
    """running -> failed, only for the attempt that this worker holds."""
    updated = GenerationJob.objects.filter(id=job.id, status=JobStatus.RUNNING, attempts=job.attempts).update(
        status=JobStatus.FAILED, reason=reason[:2000], finished_at=timezone.now(), lease_expires_at=None
    )
    if updated:
        _publish_status(GenerationJob.objects.get(id=job.id))
    return bool(updated)


def requeue_expired(now=None) -> dict:
    """Running jobs whose lease expired (their worker died) go back to the queue, or fail
    after IMAGEGEN_MAX_ATTEMPTS attempts."""
    now = now or timezone.now()
    requeued = failed = 0
    for job in GenerationJob.objects.filter(status=JobStatus.RUNNING, lease_expires_at__lt=now):
        if job.attempts >= settings.IMAGEGEN_MAX_ATTEMPTS:
            reason = (
                f"generation was interrupted {job.attempts} times (the worker was lost); "
                "giving up so it cannot take more workers down"
            )
            if fail_running(job, reason):
                failed += 1
            continue
        updated = GenerationJob.objects.filter(
            id=job.id, status=JobStatus.RUNNING, attempts=job.attempts, lease_expires_at__lt=now
        ).update(status=JobStatus.QUEUED, lease_expires_at=None, progress_step=0, batch=None, started_at=None)
        if updated:
            job.refresh_from_db()
            log.warning("requeued job %s after attempt %s: lease expired", job.id, job.attempts,
                        extra={"job_id": str(job.id), "stage": "reaper"})
            metrics.inc("imagegen_requeues_total")
            _publish_status(job)
            _enqueue(job, job.scheduled_at.timestamp() if job.scheduled_at else time.time())
            requeued += 1
    return {"requeued": requeued, "failed": failed}


def move_queued(from_version: str, to_version: str) -> int:
    """Promote or roll back: queued jobs of one version go to another, keeping their place in
    the queue (their admission time). Running jobs finish where they are."""
    moved = 0
    for job in GenerationJob.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.REVIEW], model_version=from_version):
        with transaction.atomic():
            updated = GenerationJob.objects.filter(
                id=job.id, status=job.status, model_version=from_version
            ).update(model_version=to_version)
        if not updated:
            continue
        moved += 1
        if job.status == JobStatus.QUEUED and job.scheduled_at is not None:
            scheduler.remove(shape_of(job), str(job.id), images_to_make(job))
            job.model_version = to_version
            _enqueue(job, job.scheduled_at.timestamp())
    return moved


def rebuild_scheduler_state(min_age_seconds: float = 5.0) -> dict:
    """Re-enqueue admitted, queued jobs that are missing from Redis (state lost or a worker died
    between taking and claiming), and re-send prompt checks that were lost with the broker."""
    from safety.tasks import check_prompt

    cutoff = timezone.now() - timedelta(seconds=min_age_seconds)
    restored = rechecked = 0
    for job in GenerationJob.objects.filter(status=JobStatus.QUEUED, scheduled_at__lt=cutoff):
        if not scheduler.is_enqueued(shape_of(job), str(job.id), images_to_make(job)):
            _enqueue(job, job.scheduled_at.timestamp())
            restored += 1
    stale_check = timezone.now() - timedelta(seconds=max(60.0, min_age_seconds))
    for job_id in GenerationJob.objects.filter(
        status=JobStatus.QUEUED, scheduled_at=None, created_at__lt=stale_check
    ).values_list("id", flat=True):
        # At most one re-sent check a minute per job, so a slow cpu queue is not flooded.
        if get_redis().set(f"{PREFIX}recheck:{job_id}", "1", nx=True, ex=60):
            check_prompt.delay(str(job_id))
            rechecked += 1
    return {"restored": restored, "rechecked": rechecked}
