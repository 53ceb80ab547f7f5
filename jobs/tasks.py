from __future__ import annotations

import logging

from celery import shared_task

log = logging.getLogger(__name__)


@shared_task(name="jobs.tasks.reap")
def reap() -> dict:
    """Periodic: requeue work whose worker died, rebuild lost scheduler state."""
    from jobs.actions import rebuild_scheduler_state, requeue_expired

    result = {**requeue_expired(), **rebuild_scheduler_state()}
    if any(result.values()):
        log.warning("reaper: %s", result)
    return result


@shared_task(name="jobs.tasks.sample_figures")
def sample_figures() -> dict:
    """Periodic: one sample a minute for the dashboard's last-hour plot."""
    from imagegen.dashboard import record_sample

    return record_sample()
