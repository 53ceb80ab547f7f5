"""The GPU-side stage task: generate (gpu.<lane>). It takes the lane first (the stage table
routes it to the lane's queue); the worker's hand-off dispatches the next stage."""

from __future__ import annotations

import logging

from celery import shared_task

log = logging.getLogger(__name__)

@shared_task(name="gpu_tasks.tasks.run_batch", acks_late=True, reject_on_worker_lost=True)
def run_batch(lane: str) -> list[str]:
    """A batch token: when this worker is free, run the lane's next batches, if any.

    Tokens carry no job: the work lives in the scheduler's buckets and the database, so a lost,
    duplicated or redelivered token is harmless. Each denoised batch is handed on to classify
    by the worker's hand-off thread once its images are in quarantine.
    """
    from gpu_tasks.generate import runner_for

    return runner_for(lane).run()
