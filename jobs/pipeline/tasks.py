"""The job lifecycle's Celery tasks and the dispatch of stages by name.

Stages of one job (queues in settings.IMAGEGEN_TASK_QUEUES): check_prompt (cpu) -> run_batch
(gpu.<lane>) -> classify_batch (classify.<lane>) -> publish_batch (io). Each task takes ids and
dispatches the next stage after its transaction commits; the reaper dispatches a stuck stage
again. GPU-side tasks are sent by name, so nothing here imports the GPU worker.
"""

from __future__ import annotations

import logging

from celery import current_app, shared_task

log = logging.getLogger(__name__)

STAGE_TASKS = {
    "classify": "gpu_tasks.tasks.classify_batch",
    "publish": "jobs.pipeline.tasks.publish_batch",
}
PUBLISH_RETRY_SECONDS = 3600.0  # a storage outage shorter than this delays delivery, never fails it


def send_stage(stage: str, lane: str, batch_id: str) -> None:
    """Dispatch a batch's stage; never raises (a lost dispatch is re-sent by the reaper when the
    stage's lease runs out)."""
    try:
        current_app.send_task(STAGE_TASKS[stage], args=[lane, batch_id])
    except Exception:
        log.warning("could not dispatch the %s stage of batch %s; the reaper will", stage, batch_id,
                    exc_info=True, extra={"batch_id": batch_id, "stage": stage})


@shared_task(name="jobs.pipeline.tasks.check_prompt", acks_late=True)
def check_prompt(job_id: str) -> str:
    """The prompt gate, on the cpu queue, before any GPU time is spent."""
    from jobs.pipeline.prompt_gate import gate_prompt

    return gate_prompt(job_id)


@shared_task(name="jobs.pipeline.tasks.publish_batch", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def publish_batch(self, lane: str, batch_id: str) -> list[str]:
    """Publish a judged batch: allowed images to public storage, every job's final status."""
    from jobs.media.storage import is_transient
    from jobs.models import Batch
    from jobs.pipeline.publish import publish

    try:
        return publish(batch_id)
    except Exception as exc:
        waited = sum(_publish_backoff(i) for i in range(self.request.retries))
        if not is_transient(exc) or waited > PUBLISH_RETRY_SECONDS:
            raise
        from datetime import timedelta

        from django.conf import settings
        from django.utils import timezone

        # Storage is away: keep the stage's lease (the reaper must not count this as a lost
        # worker) and try again, backing off up to IMAGEGEN_PUBLISH_RETRY_MAX_BACKOFF.
        Batch.objects.filter(id=batch_id, stage="publish").update(
            lease_expires_at=timezone.now() + timedelta(seconds=settings.IMAGEGEN_LEASE_SECONDS + settings.IMAGEGEN_PUBLISH_RETRY_MAX_BACKOFF)
        )
        log.warning("publishing batch %s failed (%s); retrying", batch_id, exc, extra={"batch_id": batch_id, "stage": "publish"})
        raise self.retry(exc=exc, countdown=_publish_backoff(self.request.retries)) from exc


def _publish_backoff(retry: int) -> float:
    """Seconds before publish retry `retry` + 1: doubling from 1 s, at most IMAGEGEN_PUBLISH_RETRY_MAX_BACKOFF."""
    from django.conf import settings

    return min(settings.IMAGEGEN_PUBLISH_RETRY_MAX_BACKOFF, 2.0 ** min(retry, 16))


@shared_task(name="jobs.pipeline.tasks.reap")
def reap() -> dict:
    """Periodic: requeue work whose worker died, re-run stuck stages, rebuild lost scheduler
    state, re-send lost prompt checks, cancel queued jobs past their deadline, re-send due
    webhook deliveries (lost dispatches, killed attempts, retries), forget old idempotency keys."""
    from jobs import actions

    result = actions.requeue_expired()
    again, result["failed_in_stage"] = actions.requeue_stuck_batches()
    for stage, lane, batch_id in again:
        send_stage(stage, lane, batch_id)
    result["stages_rerun"] = len(again)
    result["restored"], recheck = actions.rebuild_scheduler_state()
    for job_id in recheck:
        check_prompt.delay(job_id)
    result["rechecked"] = len(recheck)
    result["past_deadline"] = actions.cancel_past_deadline()
    from jobs.api import idempotency
    from jobs.webhooks import delivery as webhooks

    result["webhooks_resent"] = webhooks.resend_due()
    result["idempotency_keys_expired"] = idempotency.expire()
    if any(v for k, v in result.items() if k != "idempotency_keys_expired"):
        log.warning("reaper: %s", result)
    return result


@shared_task(name="jobs.pipeline.tasks.deliver_webhook", acks_late=True)
def deliver_webhook(delivery_id: str, first: bool = False) -> str:
    """One attempt of a signed webhook delivery (io queue; jobs/webhooks/delivery.py)."""
    from jobs.webhooks.delivery import deliver

    return deliver(delivery_id, first=first)
