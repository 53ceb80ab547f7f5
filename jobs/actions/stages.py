"""A batch stage's lease (classify, publish): taken when a worker starts the stage, renewed while
it runs, ended when the stage moves on. A batch waiting in its stage's queue holds no lease.

    start_stage       queued -> held by one run (a compare-and-set: a duplicate finds it held)
    pass_on           the run's work is done: the batch enters its row's next stage
    renew_stage       the run is alive
    release_stage     storage away: back to the queue, to be retried (not an interruption)
    end_stage_lease   the run failed: its lease ends now, the reaper re-runs it (an attempt)
    give_up_stage     storage away past the stage's retry bound: its jobs fail with the reason
    requeue_stuck_batches  the reaper: re-run stages whose worker was lost, re-send lost messages
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from redis.exceptions import RedisError

from imagegen import metrics
from imagegen.redis_client import PREFIX, get_redis
from imagegen.stage_table import STAGES
from jobs.actions.notify import status_on_commit
from jobs.models import RUNNING_STAGES, Batch, BatchStage, GenerationJob, JobStage, JobStatus, at

log = logging.getLogger(__name__)

STAGE_SECONDS_KEY = f"{PREFIX}stage-seconds"  # hash: stage -> measured seconds a run takes (EWMA)


def _batch_stages() -> tuple[str, ...]:
    """The table's batch stages with a lease (read when asked: a row added is recovered too)."""
    return tuple(name for name, stage in STAGES.items() if stage.leased)


def _lease(stage: str, now: datetime | None = None) -> datetime:
    return (now or timezone.now()) + timedelta(seconds=STAGES[stage].lease_seconds)


def enter_stage(stage: str, now: datetime) -> dict:
    """The fields of a batch that has just entered `stage` and waits in its queue."""
    return {"stage": stage, "stage_attempts": 0, "stage_since": now, "stage_sent_at": now, "stage_started_at": None,
            "stage_run": "", "stage_error": "", "lease_expires_at": None}


def pass_on(batch_id, stage: str, run: str) -> bool:
    """The run holding `stage` has done its work: the batch enters the next stage its row
    declares, waiting in that stage's queue (a compare-and-set from (stage, run): a duplicate or
    stale run moves nothing). A batch stage added as a row ends with this, so its move is the
    table's, not a function of its own."""
    following = STAGES[stage].next
    if following is None:
        raise LookupError(f"the {stage} stage declares no next stage")
    return bool(Batch.objects.filter(id=batch_id, stage=stage, stage_run=run).update(**enter_stage(following, timezone.now())))


def start_stage(batch_id, stage: str) -> str | None:
    """A worker starts the stage: the run's token, or None when the batch is not in that stage
    or another run holds it."""
    run = uuid.uuid4().hex
    now = timezone.now()
    taken = Batch.objects.filter(id=batch_id, stage=stage, lease_expires_at=None).update(
        stage_started_at=now, stage_run=run, lease_expires_at=_lease(stage, now)
    )
    return run if taken else None


def renew_stage(batch_id, stage: str, run: str) -> bool:
    return bool(Batch.objects.filter(id=batch_id, stage=stage, stage_run=run).update(lease_expires_at=_lease(stage)))


def release_stage(batch_id, stage: str, run: str, retry_within: float) -> bool:
    """Storage is away: the stage goes back to waiting for its (retried) message. Its message is
    due within `retry_within` seconds, so the reaper's lost-message bound starts then."""
    due = timezone.now() + timedelta(seconds=retry_within)
    return bool(Batch.objects.filter(id=batch_id, stage=stage, stage_run=run).update(
        stage_started_at=None, stage_run="", lease_expires_at=None, stage_sent_at=due
    ))


def end_stage_lease(batch_id, stage: str, run: str, error: str) -> None:
    """The run failed: the reaper finds the lease run out and re-runs the stage, counting it."""
    Batch.objects.filter(id=batch_id, stage=stage, stage_run=run).update(
        lease_expires_at=timezone.now(), stage_error=error[:2000]
    )


def stage_waited(batch_id) -> float:
    """Seconds since the batch entered its current stage (real time)."""
    since = Batch.objects.filter(id=batch_id).values_list("stage_since", flat=True).first()
    return (timezone.now() - since).total_seconds() if since else 0.0


def give_up_stage(batch_id, stage: str, run: str, reason: str) -> int:
    with transaction.atomic():
        if not Batch.objects.filter(id=batch_id, stage=stage, stage_run=run).update(
            stage=BatchStage.DONE, lease_expires_at=None, stage_error=reason[:2000]
        ):
            return 0
        return _fail_jobs(batch_id, reason)


def _fail_jobs(batch_id, reason: str) -> int:
    now = timezone.now()
    ids = list(GenerationJob.objects.filter(batch_id=batch_id, stage__in=RUNNING_STAGES).values_list("id", flat=True))
    GenerationJob.objects.filter(id__in=ids, stage__in=RUNNING_STAGES, batch_id=batch_id).update(
        **at(JobStage.FAILED), finished_at=now, lease_expires_at=None, reason=reason[:2000]
    )
    status_on_commit(*ids)
    version = Batch.objects.filter(id=batch_id).values_list("model_version", flat=True).first() or ""
    metrics.count_jobs(JobStatus.FAILED, version, len(ids))
    return len(ids)


def observe_stage_seconds(stage: str, seconds: float) -> None:
    """What a run of the stage takes (an exponentially weighted mean): the reaper's lost-message
    bound grows with it. Best effort: without Redis the bound falls back to the lease."""
    try:
        redis = get_redis()
        previous = redis.hget(STAGE_SECONDS_KEY, stage)
        value = seconds if previous is None else 0.8 * float(previous) + 0.2 * seconds
        redis.hset(STAGE_SECONDS_KEY, stage, f"{value:.3f}")
    except (RedisError, ValueError):
        pass


def stage_seconds() -> dict[str, float]:
    try:
        return {k: float(v) for k, v in get_redis().hgetall(STAGE_SECONDS_KEY).items()}
    except (RedisError, ValueError):
        return {}


def resend_bound(stage: str, ahead: int, measured: dict[str, float]) -> float:
    """Seconds a batch may wait unstarted in `stage` behind `ahead` others before its message is
    taken for lost: its row's bound, plus twice the stage's run time per batch ahead of it (its
    lease when not measured yet)."""
    row = STAGES[stage]
    per_run = measured.get(stage, row.lease_seconds)
    return row.resend_seconds + 2.0 * ahead * per_run


def queue_ages(now: datetime | None = None) -> dict[str, float]:
    """Per batch stage: how long its oldest unstarted batch has waited in the queue (seconds)."""
    now = now or timezone.now()
    ages = {}
    for stage in _batch_stages():
        oldest = (Batch.objects.filter(stage=stage, stage_started_at=None).order_by("stage_sent_at")
                  .values_list("stage_sent_at", flat=True).first())
        ages[str(stage)] = max(0.0, (now - oldest).total_seconds()) if oldest else 0.0
    return ages


def requeue_stuck_batches(now=None) -> tuple[list[tuple[str, str, str]], int]:
    """The reaper's part for batch stages. A started stage whose lease ran out lost its worker:
    it is run again (an attempt; after IMAGEGEN_MAX_ATTEMPTS its jobs fail with the reason). An
    unstarted stage past its lost-message bound is sent again (no attempt). A stage that waits in
    its queue within the bound is left alone. Returns ([(stage, lane, batch id) to send], jobs failed)."""
    now = now or timezone.now()
    again: list[tuple[str, str, str]] = []
    failed = 0
    lost = Batch.objects.filter(stage__in=_batch_stages(), stage_started_at__isnull=False, lease_expires_at__lt=now)
    for batch in lost:
        attempts = batch.stage_attempts + 1
        if attempts >= settings.IMAGEGEN_MAX_ATTEMPTS:
            what = STAGES[batch.stage].describes
            last = f" (last error: {batch.stage_error})" if batch.stage_error else ""
            with transaction.atomic():
                if Batch.objects.filter(id=batch.id, stage=batch.stage, stage_run=batch.stage_run,
                                        lease_expires_at__lt=now).update(stage=BatchStage.DONE, lease_expires_at=None):
                    failed += _fail_jobs(batch.id, f"{what} was interrupted {attempts} times{last}; nothing was delivered")
            continue
        if Batch.objects.filter(id=batch.id, stage=batch.stage, stage_run=batch.stage_run, lease_expires_at__lt=now).update(
            stage_attempts=attempts, stage_started_at=None, stage_run="", lease_expires_at=None, stage_sent_at=now
        ):
            log.warning("batch %s lost its %s worker: running that stage again", batch.id, batch.stage,
                        extra={"batch_id": str(batch.id), "stage": "reaper"})
            metrics.inc("imagegen_stage_reruns_total", stage=batch.stage)
            again.append((batch.stage, batch.lane, str(batch.id)))
    measured = stage_seconds()
    for stage in _batch_stages():
        waiting = Batch.objects.filter(stage=stage, stage_started_at=None).filter(
            Q(stage_sent_at__lt=now) | Q(stage_sent_at=None)).order_by("stage_sent_at")
        for ahead, batch in enumerate(waiting.only("id", "lane", "stage", "stage_sent_at")):
            sent = batch.stage_sent_at
            if sent is not None and (now - sent).total_seconds() < resend_bound(stage, ahead, measured):
                continue
            if Batch.objects.filter(id=batch.id, stage=stage, stage_started_at=None, stage_sent_at=sent).update(stage_sent_at=now):
                log.warning("batch %s waited unstarted in %s past its bound: its message is taken for lost and sent again",
                            batch.id, stage, extra={"batch_id": str(batch.id), "stage": "reaper"})
                metrics.inc("imagegen_stage_resends_total", stage=stage)
                again.append((stage, batch.lane, str(batch.id)))
    return again, failed
