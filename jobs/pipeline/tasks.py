"""The job lifecycle's Celery tasks. Each takes ids, is named, configured and routed by the stage
table (imagegen/stage_table.py: `stage_task`) and, once its work is committed, dispatches the
stage the table names next. GPU-side tasks are sent by the table's names, so nothing here
imports the GPU worker."""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_init
from django.conf import settings

from imagegen.stage_table import loads_for, stage_task
from jobs.pipeline import stages

log = logging.getLogger(__name__)


@worker_init.connect
def load_the_prompt_filter_before_the_pool_forks(sender=None, **kwargs) -> None:
    """A worker that consumes the prompt-check queue loads the prompt filter (MiniLM, the head,
    the policy's embeddings) once, in its main process, before its pool forks: every pool process
    starts with it (shared copy-on-write) instead of loading it on its first check, one load per
    process on the same cores (11-17 s each here, so the first prompts of a fresh `make run` waited
    that long). Nothing is run on the model here beyond what loading runs, with the one thread the
    embedder sets, so no thread pool is forked. A solo-pool worker (the tests') has no fork: it
    loads the filter before it reports ready rather than on its first check.
    IMAGEGEN_PRELOAD_PROMPT_FILTER=false turns it off."""
    if not settings.IMAGEGEN_PRELOAD_PROMPT_FILTER or sender is None:
        return
    consumed = set(getattr(sender.app.amqp.queues, "consume_from", None) or {})
    if "prompt_filter" not in loads_for(consumed):  # the rows that declare it (imagegen/stage_table.py)
        return
    from safety.prompt_filter import get_prompt_filter

    try:
        get_prompt_filter()
    except Exception:   # the first check loads it again and fails the way checks report failures
        log.exception("the prompt filter could not be loaded before the pool forked")


@stage_task("prompt")
def check_prompt(job_id: str) -> str:
    """The prompt gate, on the cpu queue, before any GPU time is spent."""
    from jobs.pipeline.prompt_gate import gate_prompt

    if not settings.IMAGEGEN_SERVER_TIMING:
        return gate_prompt(job_id)
    from imagegen import timing

    with timing.tallied() as tally:  # bench/api_load.py --breakdown reads these records
        decision = gate_prompt(job_id)
    timing.record("prompt_check", {**tally, "decision": decision})
    return decision


@stage_task("classify")
def classify_batch(lane: str, batch_id: str) -> bool:
    """The image gate on a batch; then its publish stage."""
    from jobs.pipeline.classify import classify

    moved_on = bool(classify(batch_id))
    if moved_on:
        stages.send_next("classify", lane, batch_id)
    return moved_on


@stage_task("publish")
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
    result["restored"], recheck, rewake = actions.rebuild_scheduler_state()
    for job_id in recheck:
        stages.send("prompt", job_id)
    for job_id in rewake:
        stages.send("rewrite", job_id)
    result["rechecked"] = len(recheck) + len(rewake)
    result["past_deadline"] = actions.cancel_past_deadline()
    result["webhooks_resent"] = webhooks.resend_due()
    if any(result.values()):
        log.warning("reaper: %s", result)
    return result


@stage_task("webhook")
def deliver_webhook(delivery_id: str, first: bool = False) -> str:
    """One attempt of a signed webhook delivery (the webhooks queue; jobs/webhooks/delivery.py)."""
    from jobs.webhooks.delivery import deliver

    return deliver(delivery_id, first=first)
