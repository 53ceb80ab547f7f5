"""What a status change tells the rest of the system, without the actions knowing who listens:

- `status_changed` is sent inside the transaction that changed the status (its receivers write
  rows that must commit with it: the webhook outbox, jobs/webhooks/delivery.py);
- `status_committed` is sent after that transaction commits (never before: a watcher must never
  see a state that a rollback undoes); its receiver publishes the status events
  (jobs/realtime/events.py).

Both receivers are connected in JobsConfig.ready(). Every status change in jobs.actions calls
status_on_commit inside its transaction.

Before either signal, a block that follows an overturned appeal opens the appeal again
(`reopen_appeals_blocked_again`, here: every status change calls it; jobs.actions.review
`blocked_again` is its ORM definition): the user's status event, the webhook body and
the moderators' queue all see the appeal pending, never an "overturned" job that is blocked."""

from __future__ import annotations

from django.db import connections, router, transaction
from django.dispatch import Signal

from jobs.models import GenerationJob, JobStage

status_changed = Signal()  # job_ids: list[str]
status_committed = Signal()  # job_ids: list[str]


def status_on_commit(*job_ids) -> None:
    ids = [str(job_id) for job_id in job_ids]
    if ids:
        reopen_appeals_blocked_again(ids)
        status_changed.send(sender=None, job_ids=ids)
        transaction.on_commit(lambda: status_committed.send(sender=None, job_ids=ids))


BLOCKED_AGAIN = (" (This came after a moderator overturned the earlier block on your appeal: your appeal stays "
                 "open and a moderator looks at this too.)")


def reopen_appeals_blocked_again(job_ids) -> int:
    """Called by every status change, inside its transaction, before anyone hears of it
    (jobs.actions.notify): the jobs of `blocked_again` have their appeal open again, the reason
    saying why. Every status change pays for it, so it is one hand-written UPDATE (about 30 us on
    SQLite, where the ORM's spent some 300 us building and compiling its statement each call);
    tests/test_review_api.py checks it changes the rows `blocked_again` names."""
    ids = list(job_ids)
    if not ids:
        return 0
    connection = connections[router.db_for_write(GenerationJob)]
    quote, pk = connection.ops.quote_name, GenerationJob._meta.pk
    assert pk is not None
    sql = (f"UPDATE {quote(GenerationJob._meta.db_table)} SET {quote('appeal_outcome')} = %s, "
           f"{quote('reason')} = {quote('reason')} || %s WHERE {quote('id')} IN ({', '.join(['%s'] * len(ids))}) "
           f"AND {quote('stage')} = %s AND {quote('appeal_outcome')} = %s AND {quote('blocked_stage')} <> %s")
    params = ["", BLOCKED_AGAIN, *(pk.get_db_prep_value(job_id, connection) for job_id in ids), JobStage.BLOCKED.value,
              "overturned", "human"]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
