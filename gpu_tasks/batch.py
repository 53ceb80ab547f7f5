"""One batch on a GPU worker: take jobs of one shape, fill, claim, denoise, judge, store, deliver."""

from __future__ import annotations

import logging
import os
import socket
import time

from django.conf import settings
from django.db import DatabaseError, transaction
from redis.exceptions import RedisError
from django.utils import timezone

from gpu_tasks import scheduler
from gpu_tasks.pipeline import Row, encode_png, get_model
from gpu_tasks.worker import record_busy
from imagegen import metrics
from jobs import actions, events
from jobs.models import Batch, GeneratedImage, GenerationJob, JobStatus
from jobs.storage import delete_quietly, public_storage, quarantine_storage, store_bytes
from safety import image_gate
from safety.models import SafetyVerdict

log = logging.getLogger(__name__)

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"
GATE_TRIES = 3


def take_and_claim(model_name: str) -> tuple[str, list[GenerationJob]] | None:
    """Take a batch from the scheduler and claim it at once; a partial batch then waits at most
    FILL_WAIT for more of its shape, claiming each arrival as it is taken. (Claiming right after
    taking keeps the window in which a job is neither in Redis nor running to milliseconds, so
    the reaper's rebuild does not re-enqueue work that a worker is about to run.)"""
    taken = scheduler.take(model_name)
    if taken is None:
        return None
    shape = taken.shape
    info = scheduler.parse_shape(shape)
    cap = scheduler.cap_for(info["width"], info["height"])
    batch = Batch.objects.create(
        model_version=info["model_version"],
        width=info["width"],
        height=info["height"],
        steps=info["steps"],
        guidance_scale=info["guidance_scale"],
        scheduler=info["scheduler"],
        size=0,
        cap=cap,
        worker=WORKER_ID,
    )
    counts: dict[str, int] = {}
    jobs: dict[str, GenerationJob] = {}

    def claim(entries) -> None:
        fresh = [e for e in entries if e.job_id not in jobs]
        for job in actions.claim_batch([e.job_id for e in fresh], batch.id):
            jobs[str(job.id)] = job
            counts[str(job.id)] = next(e.count for e in fresh if e.job_id == str(job.id))

    claim(taken.entries)
    deadline = time.monotonic() + settings.IMAGEGEN_FILL_WAIT
    while sum(counts.values()) < cap and time.monotonic() < deadline:
        time.sleep(0.02)
        more = scheduler.take(model_name, only_shape=shape, max_images=cap - sum(counts.values()))
        if more is not None:
            claim(more.entries)
    if not jobs:
        batch.delete()
        return None
    for job in jobs.values():
        if job.queue_wait_seconds is not None:
            metrics.observe("imagegen_queue_wait_seconds", job.queue_wait_seconds)
    metrics.inc("imagegen_attempts_total", len(jobs))
    batch.size = sum(counts.values())
    batch.save(update_fields=["size"])
    return str(batch.id), list(jobs.values())


def run_batch(model_name: str) -> str | None:
    claimed = take_and_claim(model_name)
    if claimed is None:
        return None
    batch_id, jobs = claimed
    batch = Batch.objects.get(id=batch_id)
    have = set(GeneratedImage.objects.filter(job__in=jobs).values_list("job_id", "index"))  # cache hits
    rows = [
        Row(str(job.id), index, job.prompt, job.negative_prompt, job.seed + index)
        for job in jobs
        for index in range(job.count)
        if (job.id, index) not in have
    ]
    model = get_model()
    job_ids = [str(job.id) for job in jobs]
    cancelled: set[str] = set()
    last_renew = time.monotonic()
    last_preview = 0.0
    previewed: set[str] = set()
    first_row: dict[str, int] = {}  # each job's preview shows its first image
    for i, row in enumerate(rows):
        first_row.setdefault(row.job_id, i)
    created = {str(job.id): job.created_at.timestamp() for job in jobs}

    def on_step(step: int, total: int, latents) -> bool:
        nonlocal last_renew, last_preview
        try:
            cancelled.update(scheduler.cancelled_among([j for j in job_ids if j not in cancelled]))
        except RedisError:
            pass  # Redis is away: keep denoising; cancels are seen when it is back (or at delivery)
        live = [j for j in job_ids if j not in cancelled]
        if not live:
            return True
        for job_id in live:
            events.publish(job_id, {"type": "progress", "step": step, "total": total})
        now = time.monotonic()
        if now - last_renew > min(2.0, settings.IMAGEGEN_LEASE_SECONDS / 3):
            actions.renew_leases(live)
            GenerationJob.objects.filter(id__in=live, status=JobStatus.RUNNING).update(progress_step=step)
            last_renew = now
        if (
            step % max(1, settings.IMAGEGEN_PREVIEW_EVERY) == 0
            and step < total
            and now - last_preview >= settings.IMAGEGEN_PREVIEW_MIN_INTERVAL
        ):
            last_preview = now
            for job_id in live:
                image = model.preview(latents, first_row[job_id], batch.width, batch.height)
                events.publish(job_id, {"type": "preview", "step": step, "image": image})
                if job_id not in previewed:
                    previewed.add(job_id)
                    metrics.observe("imagegen_time_to_first_preview_seconds", time.time() - created[job_id])
        return False

    started = time.monotonic()
    wall_started = time.time()
    try:
        images = model.generate(rows, batch.width, batch.height, batch.steps, batch.guidance_scale, on_step)
    except (RedisError, DatabaseError) as exc:
        # Infrastructure, not the job: hand the jobs back to the reaper (lease ends now), so they
        # are requeued and generated again instead of failing for something they did not do.
        log.warning("batch %s interrupted by %s; returning its jobs to the queue", batch_id, type(exc).__name__,
                    extra={"batch_id": batch_id, "stage": "generate"})
        GenerationJob.objects.filter(id__in=job_ids, status=JobStatus.RUNNING).update(lease_expires_at=timezone.now())
        return batch_id
    except Exception as exc:
        log.exception("batch %s failed", batch_id, extra={"batch_id": batch_id, "stage": "generate"})
        for job in jobs:
            actions.fail_running(job, f"generation failed: {type(exc).__name__}: {exc}")
        _close_batch(batch, 0, time.monotonic() - started)
        return batch_id
    seconds = time.monotonic() - started
    _close_batch(batch, len(rows) if images is not None else 0, seconds)
    record_busy(wall_started, wall_started + seconds)
    metrics.inc("imagegen_batches_total", model=batch.model_version)
    metrics.inc("imagegen_gpu_seconds_total", seconds, worker=WORKER_ID)
    metrics.observe("imagegen_batch_size", len(rows))
    metrics.observe("imagegen_batch_fill", len(rows) / batch.cap if batch.cap else 0)
    if images is not None:
        metrics.inc("imagegen_images_generated_total", len(images), model=batch.model_version)
    if images is None:  # every job in the batch was cancelled: the loop stopped early
        return batch_id

    live_jobs = [job for job in jobs if str(job.id) not in cancelled]
    live_pairs = [(row, image) for row, image in zip(rows, images) if row.job_id not in cancelled]
    judgements, gate_error = _judge([image for _, image in live_pairs])
    by_job: dict[str, list] = {}
    for i, (row, image) in enumerate(live_pairs):
        by_job.setdefault(row.job_id, []).append((row, image, judgements[i] if judgements else None))
    delivered = deliver_all([(job, by_job.get(str(job.id), [])) for job in live_jobs], gate_error)
    _record_overhead(delivered, wall_started, seconds, partial=len(rows) < batch.cap)
    return batch_id


def _record_overhead(jobs: list[GenerationJob], pass_started: float, pass_seconds: float, partial: bool) -> None:
    """Feed the estimate the time each first-attempt job spent outside the queue and the pass:
    the claim (less the fill wait the estimate adds itself), the image gate and delivery."""
    from jobs.admission import record_overhead

    samples = []
    for job in jobs:
        if job.attempts != 1 or job.started_at is None or job.finished_at is None:
            continue
        claim = pass_started - job.started_at.timestamp() - (settings.IMAGEGEN_FILL_WAIT if partial else 0.0)
        deliver = job.finished_at.timestamp() - (pass_started + pass_seconds)
        samples.append(max(0.0, claim) + deliver)
    try:
        record_overhead(samples)
    except RedisError:
        pass  # the estimate keeps its last figure


def _close_batch(batch: Batch, images: int, seconds: float) -> None:
    from jobs.admission import record_batch_cost

    Batch.objects.filter(id=batch.id).update(gpu_seconds=seconds, finished_at=timezone.now())
    record_batch_cost(
        scheduler.shape_key(batch.model_version, batch.width, batch.height, batch.steps, batch.guidance_scale, batch.scheduler),
        images,
        seconds,
    )


def _judge(images) -> tuple[list | None, str]:
    last = ""
    for attempt in range(GATE_TRIES):
        try:
            return image_gate.judge(images), ""
        except image_gate.ImageGateError as exc:
            last = str(exc)
            log.warning("image gate attempt %s failed: %s", attempt + 1, exc)
    return None, last


def _outcome(made: list, gate_error: str) -> tuple[str, str, str]:
    """The job's status, blocked stage and reason: the worst image decides."""
    if gate_error:
        return JobStatus.FAILED, "", f"the image safety check failed, nothing was delivered: {gate_error}"
    for decision, status in (("block", JobStatus.BLOCKED), ("review", JobStatus.REVIEW)):
        worst = next((j for _, _, j in made if j.decision == decision), None)
        if worst is not None:
            return status, "image", worst.reason
    return JobStatus.DONE, "", ""


def deliver_all(work: list[tuple[GenerationJob, list]], gate_error: str) -> list[GenerationJob]:
    """Store each job's images and finish it exactly once for this attempt, all in one
    transaction (a savepoint per job, so one lost claim does not undo the others). Returns the
    jobs this attempt finished, as stored."""
    stored_by_job = {}
    for job, made in work:
        status, stage, reason = _outcome(made, gate_error)
        # Only a delivered job's bytes are public; held, blocked and unjudged ones stay private.
        storage = public_storage() if status == JobStatus.DONE else quarantine_storage()
        stored = []
        try:
            for row, image, _ in made:
                stored.append((row, image, store_bytes(encode_png(image), storage)))
        except Exception as exc:
            for _, _, obj in stored:
                delete_quietly(obj.key, storage)
            log.exception("storing images of job %s failed", job.id)
            actions.fail_running(job, f"storing the images failed: {type(exc).__name__}")
            continue
        stored_by_job[job.id] = (status, stage, reason, storage, stored)
    finished = []
    with transaction.atomic():
        for job, made in work:
            if job.id not in stored_by_job:
                continue
            status, stage, reason, storage, stored = stored_by_job[job.id]
            try:
                with transaction.atomic():
                    _record(job, made, stored, status, stage, reason, storage, gate_error)
                finished.append(job.id)
            except _LostClaim:
                # Cancelled meanwhile, or the lease expired and another attempt owns the job.
                transaction.on_commit(lambda objs=stored, st=storage: [delete_quietly(o.key, st) for _, _, o in objs])
    from jobs import cache
    from jobs.serializers import status_event

    delivered = list(GenerationJob.objects.filter(id__in=finished).prefetch_related("images"))
    for job in delivered:
        cache.remember(job)
        if job.status == JobStatus.DONE:
            metrics.observe("imagegen_submit_to_done_seconds", (job.finished_at - job.created_at).total_seconds())
        events.publish(job.id, status_event(job))
    return delivered


def _record(job, made, stored, status, stage, reason, storage, gate_error) -> None:
    updated = GenerationJob.objects.filter(id=job.id, status=JobStatus.RUNNING, attempts=job.attempts).update(
        status=status,
        blocked_stage=stage,
        reason=reason,
        finished_at=timezone.now(),
        progress_step=job.steps,
        lease_expires_at=None,
    )
    if not updated:
        raise _LostClaim
    tier = "public" if status == JobStatus.DONE else "quarantine"
    image_rows = GeneratedImage.objects.bulk_create(
        [
            GeneratedImage(
                job_id=job.id,
                index=row.index,
                seed=row.seed,
                storage_key=obj.key,
                width=image.width,
                height=image.height,
                byte_size=obj.byte_size,
                sha256=obj.sha256,
                tier=tier,
            )
            for row, image, obj in stored
        ]
    )
    if gate_error:
        return
    SafetyVerdict.objects.bulk_create(
        [
            SafetyVerdict(
                job_id=job.id,
                image=image_row,
                image_index=row.index,
                stage="image",
                decision=judgement.decision,
                category=judgement.category,
                score=judgement.score,
                reason=judgement.reason,
                policy_version=judgement.version,
            )
            for image_row, (row, _, judgement) in zip(image_rows, made)
        ]
    )


class _LostClaim(Exception):
    pass
