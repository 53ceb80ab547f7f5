"""Status events, sent after the transaction that changed the status commits (never before: a
watcher must never see a state that a rollback undoes); and the webhook outbox rows of jobs
that reached a terminal status, written inside that transaction (jobs/webhooks/delivery.py). Every
status change in jobs.actions calls status_on_commit inside its transaction."""

from __future__ import annotations

from django.db import transaction


def status_on_commit(*job_ids) -> None:
    ids = [str(job_id) for job_id in job_ids]
    if ids:
        from jobs.webhooks import delivery as webhooks

        webhooks.record_terminal(ids)
        transaction.on_commit(lambda: send_status(ids))


def send_status(job_ids: list[str]) -> None:
    from jobs.api.serializers import status_event
    from jobs.models import GenerationJob
    from jobs.realtime import events

    for job in GenerationJob.objects.filter(id__in=job_ids).prefetch_related("images"):
        events.publish(job.id, status_event(job))
