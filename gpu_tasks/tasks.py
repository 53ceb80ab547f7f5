"""The GPU-side stage tasks: generate (gpu.<lane>) and classify (the classify queue). Each
takes the lane first (the router picks a lane's queue from it) and dispatches the next stage."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task

log = logging.getLogger(__name__)

CLASSIFY_RETRY_SECONDS = 3600.0


@shared_task(name="gpu_tasks.tasks.run_batch", acks_late=True, reject_on_worker_lost=True)
def run_batch(lane: str) -> list[str]:
    """A batch token: when this worker is free, run the lane's next batches, if any.

    Tokens carry no job: the work lives in the scheduler's buckets and the database, so a lost,
    duplicated or redelivered token is harmless. Each denoised batch is handed on to classify
    by the worker's hand-off thread once its images are in quarantine.
    """
    from gpu_tasks.generate import runner_for

    return runner_for(lane).run()


@shared_task(name="gpu_tasks.tasks.classify_batch", bind=True, acks_late=True, reject_on_worker_lost=True,
             max_retries=None)
def classify_batch(self, lane: str, batch_id: str) -> bool:
    """The image gate on a batch; then its publish stage."""
    from jobs.media.storage import is_transient
    from jobs.pipeline.classify import classify
    from jobs.pipeline.tasks import send_stage

    try:
        moved_on = classify(batch_id)
    except Exception as exc:
        if not is_transient(exc) or self.request.retries * 5 > CLASSIFY_RETRY_SECONDS:
            raise
        from django.conf import settings
        from django.utils import timezone

        from jobs.models import Batch

        # Quarantine storage is away: keep the stage's lease and try again, backing off.
        Batch.objects.filter(id=batch_id, stage="classify").update(
            lease_expires_at=timezone.now() + timedelta(seconds=settings.IMAGEGEN_LEASE_SECONDS + 60)
        )
        log.warning("reading batch %s from quarantine failed (%s); retrying", batch_id, exc,
                    extra={"batch_id": batch_id, "stage": "classify"})
        raise self.retry(exc=exc, countdown=min(60, 2 ** min(self.request.retries, 6))) from exc
    if moved_on:
        send_stage("publish", lane, batch_id)
    return moved_on
