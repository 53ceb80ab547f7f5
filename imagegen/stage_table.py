"""The stage table: every stage of a job declared once, as data, at the bottom of the layers so
that everything that routes, dispatches, runs, describes or recovers a stage reads it (the Celery
router, the scheduler's wake-up of a GPU lane, the actions that admit a job or fail a stage,
the webhook outbox, the reaper, /metrics and the deploy checks).

    prompt    check_prompt    cpu          -> generate (the scheduler's buckets; a GPU worker takes the batch),
                                              or rewrite first for a job whose prompt goes through the rewriter
    rewrite   rewrite_prompts rewrite      -> prompt again when it changed the prompt (the second gate), else generate
    generate  run_batch       gpu.<lane>   -> classify (the GPU worker's hand-off)
    reveal    reveal_start    gpu.<lane>   a cross-user cache hit's run (its own signed files), in place of generate;
                                           and a joiner's (an identical request that joined a job in flight), once
                                           that job ends: its own copies of its images, or generate after all
    classify  classify_batch  classify     -> publish
    publish   publish_batch   io           -> (the terminal status; its webhooks)
    webhook   deliver_webhook webhooks

How a stage runs (its lease, its retries) is jobs/pipeline/stages.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from celery import current_app
from django.conf import settings

log = logging.getLogger(__name__)


# What a stage's worker can load before its first task, in the order a worker loads them (read by
# jobs/pipeline/tasks.py for the prompt filter, gpu_tasks/worker.py for the rest). "signing_key":
# the content credentials' key and chain, checked before the first task (a worker whose stage signs
# images refuses to start without them; the others never need them: imagegen/signing_credentials.py).
LOADS = ("prompt_filter", "signing_key", "image_gate", "rewriter", "model")


@dataclass(frozen=True)
class Stage:
    name: str
    task: str
    queue_setting: str  # the settings name of its queue (each overridable from the environment)
    next: str | None = None
    by_lane: bool = False  # the queue is the lane's own: the task's first argument is the lane
    leased: bool = False  # a batch stage with a lease in the Batch row
    retry_setting: str | None = None  # how long (seconds, real time) transient storage errors are retried
    describes: str = ""  # how a failure reason names it ("the image safety check was interrupted 3 times")
    reject_on_worker_lost: bool = False  # a worker lost mid-run puts the message back (acks_late always)
    process: str = "cpu"  # the process type whose workers consume its queue (PROCESSES)
    # How long a started run may go silent (its lease, renewed every third of it while it runs)
    # before the reaper takes its worker for lost; None: the stage holds no lease.
    lease_setting: str | None = None
    # How long a job or batch may wait unstarted in the stage before the reaper takes its message
    # for lost and sends it again (not an attempt); None: nothing is re-sent by age.
    resend_setting: str | None = None
    # What a worker consuming its queue loads before its first task (LOADS: the prompt filter, the
    # rewriter, the lane's model, the image gate), so no task waits for a load.
    loads: tuple[str, ...] = ()
    # The human-review holds that can happen at this stage: the checks run here whose verdict can
    # hold a job for a moderator, by the name the verdicts and the job's `blocked_stage` carry (a
    # block at the same check carries the same name). Nothing may hold a job under another name.
    holds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not set(self.loads) <= set(LOADS):
            raise ValueError(f"the {self.name} stage loads {sorted(set(self.loads) - set(LOADS))}: not one of {LOADS}")
        if self.leased and not (self.lease_setting and self.resend_setting):
            raise ValueError(f"the {self.name} stage holds a lease on its batch: its row must say how long a run may go "
                             "silent (lease_setting) and how long it may wait unstarted (resend_setting)")

    @property
    def queue(self) -> str:
        value = getattr(settings, self.queue_setting)
        return value + "{lane}" if self.by_lane else value

    @property
    def retry_for(self) -> float:
        return float(getattr(settings, self.retry_setting)) if self.retry_setting else 0.0

    @property
    def lease_seconds(self) -> float:
        if self.lease_setting is None:
            raise LookupError(f"the {self.name} stage holds no lease")
        return float(getattr(settings, self.lease_setting))

    @property
    def resend_seconds(self) -> float:
        if self.resend_setting is None:
            raise LookupError(f"the {self.name} stage re-sends nothing by age")
        return float(getattr(settings, self.resend_setting))


STAGES: dict[str, Stage] = {
    stage.name: stage
    for stage in (
        Stage("prompt", "jobs.pipeline.tasks.check_prompt", "QUEUE_CPU", next="generate", process="cpu",
              resend_setting="IMAGEGEN_PROMPT_CHECK_RESEND_SECONDS", loads=("prompt_filter",),
              holds=("prompt", "rewrite")),  # the prompt as written, and a rewrite that changed it
        # Per job, batched across users: a worker claims every waiting job (jobs/actions/rewrites.py).
        Stage("rewrite", "gpu_tasks.tasks.rewrite_prompts", "QUEUE_REWRITE", next="generate",
              describes="rewriting the prompt", reject_on_worker_lost=True, process="gpu",
              lease_setting="IMAGEGEN_LEASE_SECONDS", resend_setting="IMAGEGEN_PROMPT_CHECK_RESEND_SECONDS",
              loads=("rewriter",)),
        # Its unstarted jobs wait in the scheduler's buckets, not in a message: the reaper rebuilds
        # a lost entry from the row (jobs/actions/lifecycle.py rebuild_scheduler_state).
        Stage("generate", "gpu_tasks.tasks.run_batch", "QUEUE_GPU_PREFIX", next="classify", by_lane=True,
              describes="generation", reject_on_worker_lost=True, process="gpu", lease_setting="IMAGEGEN_LEASE_SECONDS",
              loads=("signing_key", "image_gate", "model")),  # it signs its images; the gate judges its previews
        # A cross-user cache hit's run, when a fresh job of its shape would be claimed (jobs/actions/
        # lifecycle.py reveal_start): on its lane's GPU worker, which holds the signing key, so the
        # hit's own files are made and signed off the submit's request path (no timing to tell).
        # A joiner waits here too, sent on when the job it joined ends (lifecycle.release_joiners).
        Stage("reveal", "jobs.actions.lifecycle.reveal_start", "QUEUE_GPU_PREFIX", by_lane=True, process="gpu",
              resend_setting="IMAGEGEN_STAGE_RESEND_SECONDS", loads=("signing_key",)),
        Stage("classify", "jobs.pipeline.tasks.classify_batch", "QUEUE_CLASSIFY", next="publish", leased=True,
              retry_setting="IMAGEGEN_CLASSIFY_RETRY_SECONDS", describes="the image safety check",
              reject_on_worker_lost=True, process="classify",
              lease_setting="IMAGEGEN_LEASE_SECONDS", resend_setting="IMAGEGEN_STAGE_RESEND_SECONDS", loads=("image_gate",),
              holds=("image",)),
        # It packages a done clip (MP4, poster, HLS: jobs/pipeline/publish.py) and signs the MP4.
        Stage("publish", "jobs.pipeline.tasks.publish_batch", "QUEUE_IO", leased=True,
              retry_setting="IMAGEGEN_PUBLISH_RETRY_SECONDS", describes="publishing the images",
              reject_on_worker_lost=True, process="io",
              lease_setting="IMAGEGEN_LEASE_SECONDS", resend_setting="IMAGEGEN_STAGE_RESEND_SECONDS",
              loads=("signing_key",)),
        # Its row in the outbox holds the lease (an attempt's timeout plus slack: jobs/webhooks/delivery.py).
        Stage("webhook", "jobs.pipeline.tasks.deliver_webhook", "QUEUE_WEBHOOKS", process="webhooks"),
    )
}

# Tasks that are not a stage of one job: periodic upkeep, and where it runs.
UPKEEP: dict[str, str] = {
    "jobs.pipeline.tasks.reap": "QUEUE_CPU",
    "jobs.api.idempotency.expire": "QUEUE_CPU",
    "imagegen.dashboard.sample_figures": "QUEUE_CPU",
    "jobs.pipeline.retention.run_retention": "QUEUE_IO",
    "jobs.pipeline.retention.run_unpublish": "QUEUE_IO",
    "jobs.actions.lifecycle.reveal_cached": "QUEUE_IO",  # a cross-user cache hit's end: publishes its files
    "jobs.media.cdn.retry_purge": "QUEUE_IO",
}


@dataclass(frozen=True)
class Process:
    """A worker process type: the queues it consumes are those of the stages (and upkeep tasks)
    assigned to it; how it runs them is its pool. The deploy files' worker lines are generated
    from these rows (`manage.py deploy_files`)."""

    name: str
    pool: str  # prefork, solo (one task at a time: a model in memory) or threads (waiting on I/O)
    concurrency: int | None = None
    node: str = ""  # the worker's node name (`-n`); "{name}@%h" when empty
    upkeep_queues: tuple[str, ...] = ()  # queue settings of UPKEEP tasks it also consumes


PROCESSES: dict[str, Process] = {
    process.name: process
    for process in (
        Process("cpu", "prefork", 4, upkeep_queues=("QUEUE_CPU",)),
        Process("classify", "solo"),  # the image gate's model, on a GPU or a cheap CPU fleet
        Process("io", "threads", 8, upkeep_queues=("QUEUE_IO",)),
        Process("webhooks", "threads", 16),  # waits on other people's servers
        Process("gpu", "solo", node="gpu-{device}@%h"),  # one per GPU; also serves the rewriter
    )
}


def queues_of(process: str, lanes: list[str] | tuple[str, ...] = ("{lane}",)) -> list[str]:
    """The queues a process type consumes: each lane's queue first (`lanes` fill a lane's
    queue; the template by default), then the rest."""
    rows = [stage for stage in STAGES.values() if stage.process == process]
    queues = [stage.queue.format(lane=lane) for stage in rows if stage.by_lane for lane in lanes]
    queues += [stage.queue for stage in rows if not stage.by_lane]
    queues += [getattr(settings, s) for s in PROCESSES[process].upkeep_queues]
    return list(dict.fromkeys(queues))


def process_queues(lanes: list[str]) -> dict[str, dict[str, Any]]:
    """Every process type that consumes a queue, with its queues (`lanes` filled) and its pool:
    the process list `make run` starts (scripts/run.py, through `manage.py deploy_files --queues`)."""
    out = {name: {"queues": queues_of(name, lanes), "pool": process.pool} for name, process in PROCESSES.items()}
    return {name: row for name, row in out.items() if row["queues"]}


def queue_of(task: str) -> str | None:
    for stage in STAGES.values():
        if stage.task == task:
            return stage.queue
    setting = UPKEEP.get(task)
    return getattr(settings, setting) if setting else None


def consumed_stages(queues) -> list[Stage]:
    """The rows whose queue is among `queues` (a lane's queue matches its `{lane}` template)."""
    out = []
    for stage in STAGES.values():
        queue = stage.queue
        if stage.by_lane:
            prefix = queue.replace("{lane}", "")
            if any(q.startswith(prefix) and len(q) > len(prefix) for q in queues):
                out.append(stage)
        elif queue in queues:
            out.append(stage)
    return out


def loads_for(queues) -> list[str]:
    """What a worker consuming `queues` loads before its first task, in LOADS' order."""
    wanted = {load for stage in consumed_stages(queues) for load in stage.loads}
    return [load for load in LOADS if load in wanted]


def hold(name: str) -> str:
    """`name` when a row declares that human-review hold (the actions call this where they hold a
    job), else LookupError: a hold no row declares cannot happen."""
    if not any(name in stage.holds for stage in STAGES.values()):
        raise LookupError(f"no stage declares the review hold {name!r} (imagegen/stage_table.py `holds`)")
    return name


def holds_before(stage: str) -> tuple[str, ...]:
    """The holds of the rows before `stage` in the table: for "generate", what can hold (or
    block) a job before any GPU time is spent on it (the prompt checks)."""
    out: list[str] = []
    for row in STAGES.values():
        if row.name == stage:
            return tuple(out)
        out.extend(row.holds)
    raise LookupError(f"no stage {stage!r}")


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


def send(stage: str, *args: Any, countdown: float | None = None, kwargs: dict | None = None) -> bool:
    """Dispatch a stage by its row (the router then picks its queue); never raises: a lost
    dispatch is re-sent by the reaper."""
    try:
        current_app.send_task(STAGES[stage].task, args=list(args), kwargs=kwargs or {}, countdown=countdown)
        return True
    except Exception:
        log.warning("could not dispatch the %s stage (%s); the reaper will", stage, args, exc_info=True,
                    extra={"stage": stage})
        return False


class StorageAway(Exception):
    """A stage met a transient storage error: Celery retries the task (autoretry_for)."""


RETRY_OPTIONS: dict[str, Any] = {
    "autoretry_for": (StorageAway,),
    "retry_backoff": 1,
    "retry_jitter": True,
    "max_retries": None,  # bounded in real time by the stage's retry setting, not by a count
}


def stage_task(stage: str):
    """The decorator of a stage's Celery task: its name and options from its row (acks late;
    put back when its worker is lost, where the row says so; a stage with a retry bound retried
    by Celery on a transient storage error, with backoff and jitter)."""
    from celery import shared_task

    row = STAGES[stage]
    options: dict[str, Any] = {"name": row.task, "acks_late": True}
    if row.reject_on_worker_lost:
        options["reject_on_worker_lost"] = True
    if row.retry_setting:
        options.update(RETRY_OPTIONS, retry_backoff_max=settings.IMAGEGEN_STAGE_RETRY_MAX_BACKOFF)
    return shared_task(**options)
