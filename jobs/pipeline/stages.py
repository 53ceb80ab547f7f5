"""The stage table: every stage of a job declared once, and everything that routes, dispatches,
runs or recovers a stage reads it.

    prompt    check_prompt   cpu          -> generate (the scheduler's buckets; a GPU worker takes the batch),
                                             or rewrite first for a job whose prompt goes through the rewriter
    rewrite   rewrite_prompts rewrite     -> prompt again when it changed the prompt (the second gate), else generate
    generate  run_batch      gpu.<lane>   -> classify (the GPU worker's hand-off)
    classify  classify_batch classify     -> publish
    publish   publish_batch  io           -> (the terminal status; its webhooks)
    webhook   deliver_webhook webhooks

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
from dataclasses import dataclass
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import connection

from jobs.stage_names import DESCRIBES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    name: str
    task: str
    queue_setting: str  # the settings name of its queue (each overridable from the environment)
    next: str | None = None
    by_lane: bool = False  # the queue is the lane's own: the task's first argument is the lane
    leased: bool = False  # a batch stage with a lease in the Batch row
    retry_setting: str | None = None  # how long (seconds, real time) transient storage errors are retried

    @property
    def queue(self) -> str:
        value = getattr(settings, self.queue_setting)
        return value + "{lane}" if self.by_lane else value

    @property
    def describes(self) -> str:
        """How a failure reason names it (jobs/stage_names.py)."""
        return DESCRIBES.get(self.name, "")

    @property
    def retry_for(self) -> float:
        return float(getattr(settings, self.retry_setting)) if self.retry_setting else 0.0


STAGES: dict[str, Stage] = {
    stage.name: stage
    for stage in (
        Stage("prompt", "jobs.pipeline.tasks.check_prompt", "QUEUE_CPU", next="generate"),
        # Per job, batched across users: a worker claims every waiting job (jobs/actions/rewrites.py).
        Stage("rewrite", "gpu_tasks.tasks.rewrite_prompts", "QUEUE_REWRITE", next="generate"),
        Stage("generate", "gpu_tasks.tasks.run_batch", "QUEUE_GPU_PREFIX", next="classify", by_lane=True),
        Stage("classify", "jobs.pipeline.tasks.classify_batch", "QUEUE_CLASSIFY", next="publish", leased=True,
              retry_setting="IMAGEGEN_CLASSIFY_RETRY_SECONDS"),
        Stage("publish", "jobs.pipeline.tasks.publish_batch", "QUEUE_IO", leased=True,
              retry_setting="IMAGEGEN_PUBLISH_RETRY_SECONDS"),
        Stage("webhook", "jobs.pipeline.tasks.deliver_webhook", "QUEUE_WEBHOOKS"),
    )
}

# Tasks that are not a stage of one job: periodic upkeep, and where it runs.
UPKEEP: dict[str, str] = {
    "jobs.pipeline.tasks.reap": "QUEUE_CPU",
    "jobs.api.idempotency.expire": "QUEUE_CPU",
    "imagegen.dashboard.sample_figures": "QUEUE_CPU",
    "jobs.pipeline.retention.run_retention": "QUEUE_IO",
    "jobs.pipeline.retention.run_unpublish": "QUEUE_IO",
    "jobs.actions.lifecycle.reveal_cached": "QUEUE_CPU",  # a delayed cross-user cache hit (jobs/media/cache.py)
    "jobs.media.cdn.retry_purge": "QUEUE_IO",
}


def queue_of(task: str) -> str | None:
    for stage in STAGES.values():
        if stage.task == task:
            return stage.queue
    setting = UPKEEP.get(task)
    return getattr(settings, setting) if setting else None


def routed_queues() -> set[str]:
    """Every queue a task can be routed to (a lane's queue as its `{lane}` template)."""
    return {stage.queue for stage in STAGES.values()} | {getattr(settings, s) for s in UPKEEP.values()}


def route(name: str, args, kwargs, options, task=None, **kw) -> dict | None:
    """The Celery router (CELERY_TASK_ROUTES): every task's queue from this table; call sites
    never name a queue."""
    queue = queue_of(name)
    if queue is None:
        return None  # CELERY_TASK_DEFAULT_QUEUE
    if "{lane}" in queue:
        lane = (args[0] if args else None) or (kwargs or {}).get("lane")
        if not lane:
            raise ValueError(f"task {name} is routed by lane: its first argument must be the lane")
        queue = queue.format(lane=lane)
    return {"queue": queue}


def send(stage: str, *args: Any, countdown: float | None = None) -> bool:
    """Dispatch a stage; never raises (a lost dispatch is re-sent by the reaper)."""
    try:
        current_app.send_task(STAGES[stage].task, args=list(args), countdown=countdown)
        return True
    except Exception:
        log.warning("could not dispatch the %s stage (%s); the reaper will", stage, args, exc_info=True,
                    extra={"stage": stage})
        return False


def send_next(stage: str, lane: str, batch_id: str) -> None:
    following = STAGES[stage].next
    if following is not None:
        send(following, lane, batch_id)


class StorageAway(Exception):
    """A stage met a transient storage error: Celery retries the task (autoretry_for)."""


RETRY_OPTIONS: dict[str, Any] = {
    "autoretry_for": (StorageAway,),
    "retry_backoff": 1,
    "retry_jitter": True,
    "max_retries": None,  # bounded in real time by the stage's retry setting, not by a count
}


@contextmanager
def running(stage: str, batch_id: str) -> Iterator[str | None]:
    """Hold the stage of the batch while the block runs: yields the run's token, or None when
    the batch is not in that stage or another run holds it (a duplicate: do nothing). The lease
    is renewed every third of IMAGEGEN_LEASE_SECONDS until the block ends."""
    from jobs import actions

    run = actions.start_stage(batch_id, stage)
    if run is None:
        yield None
        return
    stop = threading.Event()

    def renew() -> None:
        try:
            while not stop.wait(settings.IMAGEGEN_LEASE_SECONDS / 3):
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
