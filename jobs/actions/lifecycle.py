"""A job's way through the queue: created, admitted, claimed, renewed, requeued, cancelled,
blocked, held, failed.

Every move is a compare-and-set from the stage the mover holds (GenerationJob.stage; a
conditional UPDATE that writes the stage and the status derived from it, jobs.models.at), so a
redelivered, duplicated or stale task can never move a job twice, and no stage takes a job the
stage before it has not released:

    prompt --allow--> rewrite (rewriting on) --changed--> rewrite_check --allow--> waiting_gpu
       |                      `--unchanged--------------------------------------> waiting_gpu
       `--allow (no rewrite)-------------------------------------------------> waiting_gpu
    waiting_gpu --claim--> generate --hand-off--> classify --> publish --> done | blocked | review
    a check's block or hold: blocked | review (blocked_stage names the stage); a moderator's
    approval moves review on as the allow would have; cancel, deadline, failure from any live stage

Status events go out on commit when the status changes, and so do the counts of jobs entering
each status (imagegen_jobs_total).

The daily quota is charged here, when a GPU worker first claims a job (jobs/access/usage.py).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from redis.exceptions import RedisError

from imagegen import metrics, stage_table
from imagegen.redis_client import PREFIX, get_redis
from jobs.access import usage
from jobs.actions.notify import status_on_commit
from jobs.models import (
    ACTIVE_STAGES,
    JOINABLE_STAGES,
    QUEUED_STAGES,
    TERMINAL_STATUSES,
    GeneratedImage,
    GenerationJob,
    JobStage,
    JobStatus,
    UsageCharge,
    at,
    status_of,
)
from scheduling import lanes, scheduler

log = logging.getLogger(__name__)


def shape_of(job: GenerationJob) -> str:
    return scheduler.shape_key(
        job.model_version, job.width, job.height, job.steps, job.guidance_scale, job.scheduler
    )


def images_to_make(job: GenerationJob) -> int:
    return job.count - job.images.count()


def _flow(job: GenerationJob) -> dict:
    """The job's place in the fair-share scheduler: its owner's flow and its tier."""
    return {"owner": str(job.owner_id), "tier": scheduler.tier_of(getattr(job, "priority", "interactive"))}


def _unqueue(job: GenerationJob) -> None:
    scheduler.remove(shape_of(job), str(job.id), images_to_make(job), **_flow(job))


def create_queued(job: GenerationJob, cached: dict) -> None:
    """Insert an accepted job (queued, waiting for its prompt check) with the images the
    request-hash cache already had attached. Inside the submit's transaction it adds no savepoint
    of its own (two statements a submit fewer): a failure here fails that whole transaction."""
    with transaction.atomic(savepoint=False):
        job.save()
        attach_cached(job, cached)
        metrics.count_jobs(JobStatus.QUEUED, job.model_version)


def attach_cached(job: GenerationJob, cached: dict, tier: str = "public") -> None:
    """Rows for the job's own copies of cached images (jobs.media.cache.own_copies)."""
    GeneratedImage.objects.bulk_create(
        [
            GeneratedImage(
                job=job, index=index, seed=job.seed + index, storage_key=src.storage_key, width=src.width,
                height=src.height, byte_size=src.byte_size, sha256=src.sha256, content_type=src.content_type,
                source_key=src.source_key, content_sha256=src.content_sha256, tier=tier,
            )
            for index, src in cached.items()
        ]
    )


def finish_from_cache(job: GenerationJob, cached: dict) -> None:
    """Every image is cached (the owner's own entries, or shared under a global scope): the same
    request under the same policy and model version was already gated and delivered, so the job
    is done at once with its own copies of the stored images. (A hit on another user's entries
    under the k-anonymous scope goes the way of a fresh job instead: `reveal_start`.)"""
    from safety.models import SafetyVerdict

    now = timezone.now()
    job.scheduled_at = now
    job.stage, job.started_at, job.finished_at, job.progress_step = JobStage.DONE, now, now, job.steps
    source = next(iter(cached.values()))
    if job.rewrite:  # the same prompt through the same rewriter (the key says so): the same rewrite
        job.rewritten_at = now
    with transaction.atomic():
        job.save()
        attach_cached(job, cached)
        verdict = SafetyVerdict.objects.create(
            job=job, stage="prompt", decision="allow",
            reason=f"identical to job {source.job_id} (request-hash cache)",
            policy_version=source.job.verdicts.filter(stage="prompt").values_list("policy_version", flat=True).first() or "",
        )
        metrics.count_verdicts([verdict])
        metrics.count_jobs(JobStatus.DONE, job.model_version)
        status_on_commit(job.id)


# A cross-user cache hit (k-anonymous scope: jobs/media/cache.py) goes the way of a fresh job, so
# that neither its answers, its events nor its charge say that someone else asked: admitted and
# reserved at submit with the estimate of a fresh job, its prompt checked by the gate, then
#   reveal   (queued; shown as waiting for a GPU) until a GPU worker of its lane is free and no job
#            of the lane admitted before it still waits: when a fresh job would be claimed;
#   generate (running; no lease, no batch) from `reveal_start`, on that GPU worker, which holds the
#            signing key: it makes the hit's own files into quarantine and charges it as a claim does;
#   done     one pass of its shape later (`reveal_cached`, io queue, publishes the files).
# Where its images are gone by then, it is generated as the fresh job it looked like.
#
# A joiner (an identical request that found a job in flight: jobs/media/cache.py in_flight) waits in
# `reveal` too, after its own prompt check, until its leader ends (`release_joiners` sends its start;
# the reaper's reveal_due re-sends a lost one). Its leader delivered: it takes its own copies of the
# leader's images, on that lane's GPU worker (the signing key), and is done at once (its owner's own
# repeat, or any join under a global scope), or goes on as a cross-user hit does (k-anonymous: a join
# of another user's request must look like a fresh job). Its leader cancelled, failed, held or
# blocked: nothing is inherited, it is generated as a fresh job. The one exception is a block by the
# image gate of its own pixels (the same seed, the same gate: both in the key), which generating them
# again would only repeat: the owner's joiner is blocked with that reason. (A cross-user joiner is
# generated instead, so that its end looks like a fresh job's.)


def _send_start(job: GenerationJob, countdown: float = 0.0) -> None:
    """Send the hit's start to its lane's GPU queue, noting when a run of it is due (the reaper
    sends another only once that has passed by the row's re-send bound)."""
    bound = stage_table.STAGES["reveal"].resend_seconds
    try:
        get_redis().set(f"{PREFIX}reveal-sent:{job.id}", "1", ex=max(1, round(countdown + bound)))
    except RedisError:
        log.warning("cross-user hit %s: Redis away, the reaper may send its start twice", job.id)
    stage_table.send("reveal", lanes.lane_of(job.model_version), str(job.id), countdown=countdown)


def _enter_reveal(job_id, stage: str, **fields) -> bool:
    """`stage` -> reveal, in place of the GPU queue; its start sent to the lane's GPU worker."""
    if not move(job_id, stage, JobStage.REVEAL, scheduled_at=timezone.now(), **fields):
        return False
    job = GenerationJob.objects.get(id=job_id)
    transaction.on_commit(lambda: _send_start(job))
    return True


def reveal_start(lane: str, job_id) -> bool:
    """A cross-user hit's turn, run by a free GPU worker of its lane (its queue's; it holds the
    signing key). While a job of the lane admitted before it still waits for a GPU, it waits too
    (sent again in a pass). Else its own copies of the cached images go into quarantine, and it
    moves reveal -> generate (running), charged as a GPU claim is, with its copies' rows; its end
    is sent for one pass of its shape later. A cancelled or moved job is left (copies deleted)."""
    from jobs.media import cache

    job = GenerationJob.objects.filter(id=job_id, stage=JobStage.REVEAL).first()
    if job is None or (job.cache_reveal_at is None and job.joins_id is None):
        return False
    run = cache.reveal_delay(job)
    joined: dict | None = None
    if job.joins_id is not None:
        with transaction.atomic():
            # Under the row lock the leader's end holds until it commits: a start that comes between
            # that end's look for waiting joiners and its commit reads the leader ended, not live.
            leader = GenerationJob.objects.select_for_update().filter(id=job.joins_id).first()
        if leader is not None and leader.stage in JOINABLE_STAGES:
            return False  # its end sends this again (release_joiners; a lost message: the reaper's reveal_due)
        joined = cache.joined_sources(job, leader) if leader is not None and leader.status == JobStatus.DONE else {}
        if len(joined) < job.count:
            reason = cache.blocked_pixels(job, leader) if leader is not None and job.cache_reveal_at is None else ""
            if reason:
                return block_job(job.id, stage_table.hold("image"), f"{reason} (the same image as job {leader.id}'s)",  # type: ignore[union-attr]
                                 from_stages=(JobStage.REVEAL,))
            return _generate_instead(job)
        if job.cache_reveal_at is None:
            return _deliver_joined(job, joined)
    ahead = GenerationJob.objects.filter(stage=JobStage.WAITING_GPU, model_version=job.model_version,
                                         scheduled_at__lt=job.scheduled_at)
    if ahead.exists():
        _send_start(job, countdown=max(0.1, min(run, float(settings.IMAGEGEN_FILL_WAIT) * 2)))
        return False
    found = joined if joined is not None else cache.sources(job)
    if len(found) < job.count:
        return _generate_instead(job)
    copies = cache.own_copies(job, found)
    now = timezone.now()
    with transaction.atomic():
        fields: dict = {name: getattr(job, name) for name in cache.REWRITE_FIELDS if hasattr(job, name)}
        fields = {**fields, "rewritten_at": now} if job.rewrite else {}
        if not GenerationJob.objects.filter(id=job.id, stage=JobStage.REVEAL).exclude(deadline_at__lte=now).update(
            **at(JobStage.GENERATE), attempts=F("attempts") + 1, started_at=now, progress_step=0,
            steering=job.steering, cache_reveal_at=now + timedelta(seconds=run), **fields,
        ):
            transaction.on_commit(lambda: cache.discard(copies))
            return False
        attach_cached(job, copies, tier="quarantine")
        charge_claimed([job], now)
        status_on_commit(job.id)
        metrics.count_jobs(JobStatus.RUNNING, job.model_version)
        transaction.on_commit(lambda: _send_reveal(str(job.id), run), robust=True)
    return True


def _generate_instead(job: GenerationJob) -> bool:
    """The cached images went (deleted, taken down, lost) before the hit ran, or the job it joined
    did not deliver: it is generated, as the fresh job it looked like (rewritten first where it
    asked for the rewriter), charged as one, and joinable itself from then on."""
    from jobs.media import cache

    fields: dict = {"cache_reveal_at": None, "joins": None, "billable_images": job.count}
    if job.rewrite and job.rewritten_at is None:
        if not move(job.id, JobStage.REVEAL, JobStage.REWRITE, **fields):
            return False
        transaction.on_commit(lambda: wake_rewriter(str(job.id)))
    elif not schedule(job.id, JobStage.REVEAL, **fields):
        return False
    job.billable_images, job.joins_id = job.count, None
    transaction.on_commit(lambda: cache.register_in_flight(job))
    return True


def _deliver_joined(job: GenerationJob, found: dict) -> bool:
    """The owner's joiner (or any under a global scope): its own copies of the leader's images,
    published, and reveal -> done at once, as the owner's own cache hit is (a cancelled joiner
    stays cancelled, its copies deleted)."""
    from jobs.media import cache

    copies = cache.own_copies(job, found)  # adopts the leader's rewrite and steering
    cache.publish(copies)  # before the commit that makes the rows public
    now = timezone.now()
    fields: dict = {name: getattr(job, name) for name in cache.REWRITE_FIELDS if hasattr(job, name)}
    fields = {**fields, "rewritten_at": now} if job.rewrite else {}
    with transaction.atomic():
        if not GenerationJob.objects.filter(id=job.id, stage=JobStage.REVEAL).update(
            **at(JobStage.DONE), started_at=now, finished_at=now, progress_step=job.steps, steering=job.steering,
            **fields,
        ):
            transaction.on_commit(lambda: cache.discard(copies))
            return False
        attach_cached(job, copies)
        metrics.count_jobs(JobStatus.DONE, job.model_version)
        status_on_commit(job.id)
    metrics.observe("imagegen_submit_to_done_seconds", (now - job.created_at).total_seconds())
    return True


def release_joiners(job_ids) -> None:
    """These jobs ended (or are held for review): the joiners waiting for them are sent on after
    the commit (reveal_start decides each one's way), and their in-flight notes go. Call inside
    the transaction that ended them."""
    from jobs.media import cache

    ids = [str(job_id) for job_id in job_ids]
    if not ids:
        return
    waiting = list(GenerationJob.objects.filter(joins_id__in=ids, stage=JobStage.REVEAL))
    ended = list(GenerationJob.objects.filter(id__in=ids, joins=None, cache_reveal_at=None).only(*NOTE_FIELDS))

    def after() -> None:
        for joiner in waiting:
            _send_start(joiner)
        for leader in ended:
            cache.forget_in_flight(leader)

    transaction.on_commit(after, robust=True)


# What a job's request keys are made of (jobs/media/cache.py request_key).
NOTE_FIELDS = ("id", "owner_id", "model_version", "prompt", "negative_prompt", "width", "height", "steps",
               "guidance_scale", "scheduler", "seed", "count", "rewrite", "rewriter_version")


reveal_start_task = stage_table.stage_task("reveal")(reveal_start)


def _send_reveal(job_id: str, delay: float) -> None:
    from celery import current_app

    current_app.send_task(REVEAL_TASK, args=[job_id], countdown=max(0.0, delay))


REVEAL_TASK = "jobs.actions.lifecycle.reveal_cached"


def _revealing():
    """The cross-user hits in their imitation of a GPU pass: running, no batch, a reveal time."""
    return GenerationJob.objects.filter(stage=JobStage.GENERATE, batch=None, cache_reveal_at__isnull=False)


def reveal_cached(job_id) -> bool:
    """A cross-user hit whose time has come: its files published (quarantine -> public, as the
    publish stage does), then generate -> done (compare-and-set; a cancelled one stays cancelled
    and its files go). The reaper re-sends it (`reveal_due`) when the message is lost."""
    from jobs.media.storage import delete_quietly, publish_object, quarantine_storage

    now = timezone.now()
    job = GenerationJob.objects.filter(id=job_id).first()
    if job is None or job.cache_reveal_at is None or job.cache_reveal_at > now + timedelta(seconds=0.5):
        return False
    keys = list(job.images.filter(tier="quarantine").values_list("storage_key", flat=True))
    if job.stage != JobStage.GENERATE or job.batch_id is not None:
        if job.is_terminal and job.stage != JobStage.DONE and keys:
            # cancelled (or failed) while it ran: its files are never delivered
            GeneratedImage.objects.filter(job_id=job_id, tier="quarantine").update(tier="deleted")
            for key in keys:
                delete_quietly(key, quarantine_storage())
        return False
    for key in keys:
        publish_object(key)  # before the commit that makes the rows public
    with transaction.atomic():
        if not _revealing().filter(id=job_id).update(**at(JobStage.DONE), finished_at=now, progress_step=job.steps):
            transaction.on_commit(lambda: _unpublish(keys))
            return False
        GeneratedImage.objects.filter(job_id=job_id, tier="quarantine").update(tier="public")
        metrics.count_jobs(JobStatus.DONE, job.model_version)
        status_on_commit(job.id)
    metrics.observe("imagegen_submit_to_done_seconds", (now - job.created_at).total_seconds())
    return True


def _unpublish(keys: list[str]) -> None:
    from jobs.media.storage import unpublish_object

    for key in keys:
        unpublish_object(key, keep_private_copy=False)


reveal_cached_task = shared_task(name=REVEAL_TASK, ignore_result=True)(reveal_cached)


def reveal_due(now=None, limit: int = 500) -> int:
    """The reaper's part: cross-user hits whose start was sent longer ago than the reveal row's
    re-send bound, or whose end is overdue by it (the message lost with the broker, or its worker
    lost), are sent again, each at most once per that bound (a duplicate moves nothing)."""
    now = now or timezone.now()
    bound = stage_table.STAGES["reveal"].resend_seconds
    stale = now - timedelta(seconds=bound)
    sent = 0
    for job in GenerationJob.objects.filter(stage=JobStage.REVEAL, scheduled_at__lte=stale)[:limit]:
        if get_redis().set(f"{PREFIX}reveal-sent:{job.id}", "1", nx=True, ex=max(1, round(bound))):
            _send_start(job)
            sent += 1
    for job_id in _revealing().filter(cache_reveal_at__lte=stale).values_list("id", flat=True)[:limit]:
        if get_redis().set(f"{PREFIX}reveal-sent:{job_id}", "1", nx=True, ex=max(1, round(bound))):
            try:
                _send_reveal(str(job_id), 0.0)
                sent += 1
            except Exception:
                log.warning("could not re-send the end of cross-user hit %s", job_id, exc_info=True)
    return sent


def move(job_id, from_stages, to_stage: str, when: dict | None = None, **fields) -> bool:
    """One job from one of `from_stages` (and `when`: the run's own hold, a lease or an attempt)
    to `to_stage`, writing `fields` with it: a compare-and-set, so a duplicate or a stale run,
    which no longer holds the stage, moves nothing. A move that changes the status sends its
    events and its webhook outbox row, which commit with it."""
    from_stages = [from_stages] if isinstance(from_stages, str) else list(from_stages)
    to_status = status_of(to_stage)
    with transaction.atomic():
        updated = GenerationJob.objects.filter(id=job_id, stage__in=from_stages, **(when or {})).update(
            **at(to_stage), **fields)
        if updated and any(status_of(stage) != to_status for stage in from_stages):
            status_on_commit(job_id)
            version = GenerationJob.objects.filter(id=job_id).values_list("model_version", flat=True).first()
            metrics.count_jobs(to_status, version or "")
        if updated and (to_status in TERMINAL_STATUSES or to_status == JobStatus.REVIEW):
            release_joiners([job_id])
    return bool(updated)


def cancel_job(job: GenerationJob, reason: str = "cancelled by the owner") -> bool:
    """Cancel a job that has not finished. A running batch sees the flag within one step; a
    batch past generation drops the job at its hand-off or publish (the compare-and-set on
    running fails). The row is the truth: once the cancel is committed it stands, and the
    Redis side (the flag, the bucket entry) is best effort. Without the flag the worker
    denoises to the end of the pass and drops the job at the hand-off; a stale bucket entry is
    skipped at claim (the job is no longer queued)."""
    if job.status in TERMINAL_STATUSES:
        return False
    changed = move(
        job.id,
        ACTIVE_STAGES,
        JobStage.CANCELLED,
        finished_at=timezone.now(),
        reason=reason,
        lease_expires_at=None,
    )
    if changed:
        try:
            scheduler.set_cancel_flag(str(job.id))
            if job.scheduled_at is not None:
                _unqueue(job)
        except RedisError:
            log.warning("job %s cancelled, but Redis is unavailable: the worker sees it at the hand-off", job.id,
                        exc_info=True, extra={"job_id": str(job.id)})
    job.refresh_from_db()
    return changed


DEADLINE_REASON = "deadline passed"


def cancel_past_deadline(now=None, limit: int = 500) -> int:
    """Jobs not claimed by their deadline (cancel_after) end cancelled, reason "deadline passed":
    queued ones, and prompts held for a moderator (no GPU time spent yet; cancelled, the case
    leaves the moderators' queue, its verdicts stay). A job a worker claimed first runs (and was
    charged), and so does one whose images wait for review; one never claimed is never charged
    (jobs/access/usage.py charges at claim), and its reservation ends with it."""
    now = now or timezone.now()
    cancelled = 0
    unclaimed = Q(stage__in=QUEUED_STAGES) | Q(stage=JobStage.REVIEW, blocked_stage__in=stage_table.holds_before("generate"))
    for job in GenerationJob.objects.filter(unclaimed, deadline_at__lt=now)[:limit]:
        if move(job.id, job.stage, JobStage.CANCELLED, finished_at=now, reason=DEADLINE_REASON):
            cancelled += 1
            if job.scheduled_at is not None:
                try:
                    _unqueue(job)
                except RedisError:
                    log.warning("job %s past its deadline: cancelled, its bucket entry is skipped at claim", job.id)
    return cancelled


def block_job(job_id, stage: str, reason: str, from_stages=ACTIVE_STAGES) -> bool:
    """A safety refusal at `stage` (the check's stage, or "human"), from the stage the caller holds."""
    return move(
        job_id,
        from_stages,
        JobStage.BLOCKED,
        blocked_stage=stage,
        reason=reason,
        finished_at=timezone.now(),
        lease_expires_at=None,
    )


def fail_unstarted(job_id, reason: str, from_stages=(*QUEUED_STAGES, JobStage.REVIEW)) -> bool:
    return move(job_id, from_stages, JobStage.FAILED, reason=reason, finished_at=timezone.now())


def hold_for_review(job_id, stage: str, reason: str, from_stages=(JobStage.PROMPT, JobStage.REWRITE_CHECK)) -> bool:
    """Hold the job for a moderator; a prompt whose owner already has
    IMAGEGEN_USER_MAX_IN_REVIEW cases in the queue is blocked instead (one user must not fill
    the moderators' queue). `stage`: the hold, as the stage table declares it. Returns whether
    it was held."""
    stage = stage_table.hold(stage)
    with transaction.atomic():
        owner_id = GenerationJob.objects.filter(id=job_id).values_list("owner_id", flat=True).first()
        if owner_id is None:
            return False
        usage.lock_user(owner_id)
        held = usage.review_cases(owner_id)
        limit = settings.IMAGEGEN_USER_MAX_IN_REVIEW
        if held >= limit:
            block_job(job_id, stage, (
                f"{reason} (it would be held for review, but {held} of your jobs already wait for a moderator; "
                f"the limit is {limit})"
            ), from_stages=from_stages)
            return False
        return move(job_id, from_stages, JobStage.REVIEW, blocked_stage=stage, reason=reason)


def admit(job_id, from_stages=(JobStage.PROMPT, JobStage.REWRITE_CHECK), **fields) -> str | None:
    """The prompt passed (the gate's allow, or a moderator's approval from `review`): the job
    moves on from the stage the caller holds. A job whose prompt goes through the rewriter and has
    not yet moves to the rewrite stage (and wakes a rewriter: jobs/actions/rewrites.py), whose
    changed prompt is checked again; any other goes to its shape's bucket (after commit) and
    wakes a GPU worker. Returns the stage it moved to, None when it was not in `from_stages`."""
    from_stages = [from_stages] if isinstance(from_stages, str) else list(from_stages)
    row = GenerationJob.objects.filter(id=job_id, stage__in=from_stages).values_list(
        "stage", "rewrite", "rewritten_at", "cache_reveal_at", "joins_id").first()
    if row is None:
        return None
    stage, rewrite, rewritten_at, reveal_at, joins = row
    if reveal_at is not None or joins is not None:
        # a cross-user cache hit, or a joiner: its rewrite is its source's (taken at its start)
        return JobStage.REVEAL if _enter_reveal(job_id, stage, **fields) else None
    if rewrite and rewritten_at is None:
        if not move(job_id, stage, JobStage.REWRITE, **fields):
            return None
        transaction.on_commit(lambda: wake_rewriter(str(job_id)))
        return JobStage.REWRITE
    return JobStage.WAITING_GPU if schedule(job_id, stage, **fields) else None


def schedule(job_id, from_stage: str, when: dict | None = None, **fields) -> bool:
    """`from_stage` -> waiting_gpu: admitted to the scheduler, its bucket entry added on commit."""
    now = timezone.now()
    if not move(job_id, from_stage, JobStage.WAITING_GPU, when, scheduled_at=now, **fields):
        return False
    job = GenerationJob.objects.get(id=job_id)
    transaction.on_commit(lambda: enqueue(job, now.timestamp()))
    return True


def wake_rewriter(job_id: str | None = None) -> None:
    """Send a rewrite token (the job first, if it is still waiting, then any others waiting).
    Never raises: a lost token is re-sent with the prompt check (the reaper)."""
    stage_table.send("rewrite", *([str(job_id)] if job_id else []))


def fail_rewrite(job_id, reason: str) -> bool:
    return move(job_id, JobStage.REWRITE, JobStage.FAILED, reason=reason, finished_at=timezone.now(),
                rewrite_lease_expires_at=None)


def enqueue(job: GenerationJob, enqueued_at: float) -> None:
    lane = lanes.lane_of(job.model_version)
    weight = settings.IMAGEGEN_USER_WEIGHTS.get(job.owner.get_username(), 1.0) if settings.IMAGEGEN_USER_WEIGHTS else 1.0
    scheduler.enqueue(lane, shape_of(job), str(job.id), images_to_make(job), enqueued_at, weight=weight, **_flow(job))
    lanes.wake(lane)


def claim_batch(job_ids: list[str], batch_id) -> list[GenerationJob]:
    """waiting_gpu -> generate for the taken jobs, in one UPDATE; cancelled or already-taken jobs
    (a stale or duplicated scheduler entry) are simply not claimed."""
    now = timezone.now()
    with transaction.atomic():
        GenerationJob.objects.filter(id__in=job_ids, stage=JobStage.WAITING_GPU).exclude(
            deadline_at__lte=now  # past its deadline: the reaper cancels it, uncharged
        ).update(
            **at(JobStage.GENERATE),
            attempts=F("attempts") + 1,
            started_at=now,
            batch_id=batch_id,
            progress_step=0,
            lease_expires_at=now + timedelta(seconds=stage_table.STAGES["generate"].lease_seconds),
        )
        jobs = list(GenerationJob.objects.filter(id__in=job_ids, stage=JobStage.GENERATE, batch_id=batch_id))
        # The GPU work is spent from here on: charged now, whatever becomes of the job.
        charge_claimed(jobs, now)
        order = {str(j): i for i, j in enumerate(job_ids)}
        jobs.sort(key=lambda job: order[str(job.id)])
        status_on_commit(*[job.id for job in jobs])
        for version in {job.model_version for job in jobs}:
            metrics.count_jobs(JobStatus.RUNNING, version, sum(1 for job in jobs if job.model_version == version))
    return jobs


def renew_leases(job_ids: list[str], progress_step: int | None = None) -> None:
    """The worker holding these running jobs is alive (and, with progress_step, at that step)."""
    fields: dict = {"lease_expires_at": timezone.now() + timedelta(seconds=stage_table.STAGES["generate"].lease_seconds)}
    if progress_step is not None:
        fields["progress_step"] = progress_step
    GenerationJob.objects.filter(id__in=job_ids, stage=JobStage.GENERATE, lease_expires_at__isnull=False).update(**fields)


def return_to_queue_now(job_ids: list[str]) -> None:
    """Infrastructure (Redis or the database) interrupted the pass: end the leases now, so the
    reaper requeues the jobs at once instead of failing them for something they did not do."""
    GenerationJob.objects.filter(id__in=job_ids, stage=JobStage.GENERATE, lease_expires_at__isnull=False).update(
        lease_expires_at=timezone.now()
    )


def fail_running(job: GenerationJob, reason: str) -> bool:
    """generate -> failed, only for the attempt that this worker holds."""
    with transaction.atomic():
        updated = GenerationJob.objects.filter(id=job.id, stage=JobStage.GENERATE, attempts=job.attempts).update(
            **at(JobStage.FAILED), reason=reason[:2000], finished_at=timezone.now(), lease_expires_at=None
        )
        if updated:
            status_on_commit(job.id)
            metrics.count_jobs(JobStatus.FAILED, job.model_version)
            release_joiners([job.id])
    return bool(updated)


def requeue_expired(now=None) -> dict:
    """Running jobs whose lease expired (their worker died while generating) go back to the
    queue, or fail after IMAGEGEN_MAX_ATTEMPTS attempts."""
    now = now or timezone.now()
    requeued = failed = 0
    for job in GenerationJob.objects.filter(stage=JobStage.GENERATE, lease_expires_at__lt=now):
        if job.attempts >= settings.IMAGEGEN_MAX_ATTEMPTS:
            reason = (
                f"generation was interrupted {job.attempts} times (the worker was lost); "
                "giving up so it cannot take more workers down"
            )
            if fail_running(job, reason):
                failed += 1
            continue
        updated = GenerationJob.objects.filter(
            id=job.id, stage=JobStage.GENERATE, attempts=job.attempts, lease_expires_at__lt=now
        ).update(**at(JobStage.WAITING_GPU), lease_expires_at=None, progress_step=0, batch=None, started_at=None)
        if updated:
            job.refresh_from_db()
            log.warning("requeued job %s after attempt %s: lease expired", job.id, job.attempts,
                        extra={"job_id": str(job.id), "stage": "reaper"})
            metrics.inc("imagegen_requeues_total")
            metrics.count_jobs(JobStatus.QUEUED, job.model_version)
            status_on_commit(job.id)
            enqueue(job, job.scheduled_at.timestamp() if job.scheduled_at else time.time())
            requeued += 1
    return {"requeued": requeued, "failed": failed}


def move_queued(from_version: str, to_version: str) -> int:
    """Promote or roll back: queued jobs of one version go to another, keeping their place in
    the queue (their admission time). Running jobs finish where they are."""
    moved = 0
    for job in GenerationJob.objects.filter(stage__in=(*QUEUED_STAGES, JobStage.REVIEW), model_version=from_version):
        updated = GenerationJob.objects.filter(id=job.id, stage=job.stage, model_version=from_version).update(
            model_version=to_version
        )
        if not updated:
            continue
        moved += 1
        if job.stage == JobStage.WAITING_GPU:
            _unqueue(job)
            job.model_version = to_version
            enqueue(job, job.scheduled_at.timestamp())
    return moved


def rebuild_scheduler_state(min_age_seconds: float = 5.0) -> tuple[int, list[str], list[str]]:
    """Re-enqueue admitted jobs (waiting_gpu) that are missing from Redis (state lost, or a worker
    died between taking and claiming). Returns (how many were restored, the jobs whose prompt
    check was lost with the broker and is due again, the jobs waiting for a rewriter whose wake
    was lost or whose rewriter died: each at most once per its stage row's re-send bound)."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=min_age_seconds)
    restored = 0
    reveal_due()  # delayed cross-user cache hits whose message was lost
    for job in GenerationJob.objects.filter(stage=JobStage.WAITING_GPU, scheduled_at__lt=cutoff):
        if not scheduler.is_enqueued(shape_of(job), str(job.id), images_to_make(job), **_flow(job)):
            enqueue(job, job.scheduled_at.timestamp())
            restored += 1
    # Each per-job stage waits unstarted at most its row's bound (a rewrite's check is the prompt
    # row's: the same task), then its message is taken for lost.
    resend_after: dict[str, float] = {JobStage.PROMPT: stage_table.STAGES["prompt"].resend_seconds,
                    JobStage.REWRITE_CHECK: stage_table.STAGES["prompt"].resend_seconds,
                    JobStage.REWRITE: stage_table.STAGES["rewrite"].resend_seconds}

    def stale(stage: str) -> datetime:
        return now - timedelta(seconds=max(resend_after[stage], min_age_seconds))

    due = GenerationJob.objects.filter(
        Q(stage=JobStage.PROMPT, created_at__lt=stale(JobStage.PROMPT))
        | Q(stage=JobStage.REWRITE_CHECK, created_at__lt=stale(JobStage.REWRITE_CHECK))
        | Q(Q(rewrite_lease_expires_at=None) | Q(rewrite_lease_expires_at__lt=now), stage=JobStage.REWRITE,
            created_at__lt=stale(JobStage.REWRITE))
    ).values_list("id", "stage")
    recheck: list[str] = []
    rewake: list[str] = []
    for job_id, stage in due:
        if get_redis().set(f"{PREFIX}recheck:{job_id}", "1", nx=True, ex=max(1, round(resend_after[stage]))):
            (rewake if stage == JobStage.REWRITE else recheck).append(str(job_id))
    return restored, recheck, rewake


def charge_claimed(jobs: list[GenerationJob], now: datetime) -> None:
    """Charge the jobs a GPU worker has just claimed, once per job (a requeued job is not
    charged again). Call inside the claim's transaction."""
    fresh = [job for job in jobs if job.charged_at is None]
    if not fresh:
        return
    GenerationJob.objects.filter(id__in=[job.id for job in fresh], charged_at=None).update(charged_at=now)
    UsageCharge.objects.bulk_create([
        UsageCharge(user_id=job.owner_id, job_id=job.id, images=job.billable_images,
                    image_steps=job.billable_images * job.steps, charged_at=now, priority=job.priority)
        for job in fresh
    ])
    for job in fresh:
        job.charged_at = now
