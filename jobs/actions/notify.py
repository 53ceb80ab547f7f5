"""What a status change tells the rest of the system, without the actions knowing who listens:

- `status_changed` is sent inside the transaction that changed the status (its receivers write
  rows that must commit with it: the webhook outbox, jobs/webhooks/delivery.py);
- `status_committed` is sent after that transaction commits (never before: a watcher must never
  see a state that a rollback undoes); its receiver publishes the status events
  (jobs/realtime/events.py).

Both receivers are connected in JobsConfig.ready(). Every status change in jobs.actions calls
status_on_commit inside its transaction.

Before either signal, a block that follows an overturned appeal opens the appeal again
(jobs.actions.review.reopen_appeals_blocked_again): the user's status event, the webhook body and
the moderators' queue all see the appeal pending, never an "overturned" job that is blocked."""

from __future__ import annotations

from django.db import transaction
from django.dispatch import Signal

status_changed = Signal()  # job_ids: list[str]
status_committed = Signal()  # job_ids: list[str]


def status_on_commit(*job_ids) -> None:
    ids = [str(job_id) for job_id in job_ids]
    if ids:
        from jobs.actions.review import reopen_appeals_blocked_again

        reopen_appeals_blocked_again(ids)
        status_changed.send(sender=None, job_ids=ids)
        transaction.on_commit(lambda: status_committed.send(sender=None, job_ids=ids))
