from __future__ import annotations

import logging

from celery import shared_task

log = logging.getLogger(__name__)


@shared_task(name="gpu_tasks.tasks.run_batch", acks_late=True, reject_on_worker_lost=True)
def run_batch(model_name: str) -> str | None:
    """A batch token: when this worker is free, run the next batch of the model, if any.

    Tokens carry no job: the work lives in the scheduler's buckets and the database, so a lost,
    duplicated or redelivered token is harmless.
    """
    from gpu_tasks.batch import run_batch as run

    return run(model_name)
