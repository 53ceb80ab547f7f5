"""How a stage runs: its lease, its hand-back on a storage error, the next stage's dispatch. The
stage table itself (each stage's task, queue, next stage, lease kind, retry bound and failure
wording) is imagegen/stage_table.py, re-exported here.

A batch stage's lease means a worker holds it: `running()` takes the lease when a worker
starts the stage (a compare-and-set, so a duplicate message finds it held and does nothing)
and renews it while the work runs. A stage waiting in its queue holds no lease and is never
stuck; the reaper re-runs a started stage whose lease ran out (its worker died: that counts
toward IMAGEGEN_MAX_ATTEMPTS) and re-sends one that no worker started within a bound that grows
with the queue ahead of it (its message was lost: that counts toward nothing). A transient
storage error hands the stage back to its queue and Celery retries it with backoff, until the
stage has waited IMAGEGEN_<STAGE>_RETRY_SECONDS of real time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import connection

# The table's dispatch is re-exported: the pipeline sends its stages as `stages.send`, and the
# tests hold a stage back by replacing that one name.
from imagegen.stage_table import STAGES, StorageAway, send  # noqa: F401

log = logging.getLogger(__name__)


def send_next(stage: str, lane: str, batch_id: str) -> None:
    following = STAGES[stage].next
    if following is not None:
        send(following, lane, batch_id)


@contextmanager
def running(stage: str, batch_id: str) -> Iterator[str | None]:
    """Hold the stage of the batch while the block runs: yields the run's token, or None when
    the batch is not in that stage or another run holds it (a duplicate: do nothing). The lease
    is renewed every third of the stage's lease (its row's) until the block ends."""
    from jobs import actions

    run = actions.start_stage(batch_id, stage)
    if run is None:
        yield None
        return
    stop = threading.Event()

    def renew() -> None:
        try:
            while not stop.wait(STAGES[stage].lease_seconds / 3):
                try:
                    if not actions.renew_stage(batch_id, stage, run):
                        return  # taken over: the run's own compare-and-set will fail too
                except Exception:
                    log.warning("could not renew the %s lease of batch %s", stage, batch_id, exc_info=True)
        finally:
            connection.close()

    renewer = threading.Thread(target=renew, name=f"lease-{stage}-{batch_id}", daemon=True)
    renewer.start()
    started = time.monotonic()
    try:
        yield run
    finally:
        stop.set()
        renewer.join(timeout=10)
        actions.observe_stage_seconds(stage, time.monotonic() - started)


def run(stage: str, batch_id: str, work: Callable[[str], Any]) -> Any:
    """Run `work(run)` holding the batch's stage. Returns its result, or None for a duplicate.
    A transient storage error hands the stage back to its queue (not an interruption) and raises
    StorageAway for Celery to retry; past the stage's retry bound its jobs fail with the reason.
    Any other error ends the lease now, so the reaper re-runs the stage (counting an attempt)."""
    from jobs import actions
    from jobs.media.storage import is_transient

    spec = STAGES[stage]
    with running(stage, batch_id) as held:
        if held is None:
            return None
        try:
            return work(held)
        except Exception as exc:
            if not is_transient(exc):
                actions.end_stage_lease(batch_id, stage, held, f"{type(exc).__name__}: {exc}")
                raise
            waited = actions.stage_waited(batch_id)
            if waited > spec.retry_for:
                actions.give_up_stage(batch_id, stage, held, (
                    f"{spec.describes} could not reach storage for {waited:.0f}s ({exc}); nothing was delivered"
                ))
                return None
            actions.release_stage(batch_id, stage, held, settings.IMAGEGEN_STAGE_RETRY_MAX_BACKOFF)
            log.warning("the %s stage of batch %s met a storage error (%s); retrying", stage, batch_id, exc,
                        extra={"batch_id": batch_id, "stage": stage})
            raise StorageAway(str(exc)) from exc
