"""The job lifecycle's Celery tasks. Each takes ids, is routed by the stage table
(jobs/pipeline/stages.py) and, once its work is committed, dispatches the stage the table names
next. GPU-side tasks are sent by name, so nothing here imports the GPU worker."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from jobs.pipeline import stages

log = logging.getLogger(__name__)


@shared_task(name="jobs.pipeline.tasks.check_prompt", acks_late=True)
def check_prompt(job_id: str) -> str:
    """The prompt gate, on the cpu queue, before any GPU time is spent."""
    from jobs.pipeline.prompt_gate import gate_prompt

    return gate_prompt(job_id)


@shared_task(name="jobs.pipeline.tasks.classify_batch", acks_late=True, reject_on_worker_lost=True,
             retry_backoff_max=settings.IMAGEGEN_STAGE_RETRY_MAX_BACKOFF, **stages.RETRY_OPTIONS)
def classify_batch(lane: str, batch_id: str) -> bool:
    """The image gate on a batch; then its publish stage."""
    from jobs.pipeline.classify import classify

    moved_on = bool(classify(batch_id))
    if moved_on:
        stages.send_next("classify", lane, batch_id)
    return moved_on


@shared_task(name="jobs.pipeline.tasks.publish_batch", acks_late=True, reject_on_worker_lost=True,
             retry_backoff_max=settings.IMAGEGEN_STAGE_RETRY_MAX_BACKOFF, **stages.RETRY_OPTIONS)
def publish_batch(lane: str, batch_id: str) -> list[str]:
    """Publish a judged batch: allowed images to public storage, every job's final status."""
    from jobs.pipeline.publish import publish

    return publish(batch_id)


@shared_task(name="jobs.pipeline.tasks.reap")
def reap() -> dict:
    """Periodic: requeue work whose worker died, re-run stages whose worker died and re-send
    those whose message was lost, rebuild lost scheduler state, re-send lost prompt checks,
    cancel queued jobs past their deadline, re-send due webhook deliveries (lost dispatches,
    killed attempts, retries)."""
    from jobs import actions
    from jobs.webhooks import delivery as webhooks

    result = actions.requeue_expired()
    again, result["failed_in_stage"] = actions.requeue_stuck_batches()
    for stage, lane, batch_id in again:
        stages.send(stage, lane, batch_id)
    result["stages_sent_again"] = len(again)
    result["restored"], recheck = actions.rebuild_scheduler_state()
    for job_id in recheck:
        stages.send("prompt", job_id)
    result["rechecked"] = len(recheck)
    result["past_deadline"] = actions.cancel_past_deadline()
    result["webhooks_resent"] = webhooks.resend_due()
    if any(result.values()):
        log.warning("reaper: %s", result)
    return result


@shared_task(name="jobs.pipeline.tasks.deliver_webhook", acks_late=True)
def deliver_webhook(delivery_id: str, first: bool = False) -> str:
    """One attempt of a signed webhook delivery (the webhooks queue; jobs/webhooks/delivery.py)."""
    from jobs.webhooks.delivery import deliver

    return deliver(delivery_id, first=first)
