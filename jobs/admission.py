"""Honest wait estimates and admission control.

Cost model: GPU workers record, after every batch, an exponential moving average of GPU-seconds
per image for its shape, and of GPU-seconds per image-megapixel-step across shapes (for shapes
not measured yet). Heartbeats give the number of live GPU workers per model.

Estimate for a job = (GPU-seconds of work queued ahead of it) / (live GPU workers)
                     + its own GPU-seconds + the fill wait.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from gpu_tasks import scheduler
from gpu_tasks.redis_conn import PREFIX, get_redis

COST_KEY = f"{PREFIX}cost"
GLOBAL_FIELD = "_per_mpx_step"
EWMA_ALPHA = 0.3


def record_batch_cost(shape: str, images: int, seconds: float) -> None:
    """Called by the GPU worker after each batch."""
    if images <= 0 or seconds <= 0:
        return
    info = scheduler.parse_shape(shape)
    per_image = seconds / images
    per_unit = per_image / (info["width"] * info["height"] / 1e6 * info["steps"])
    r = get_redis()
    old_image, old_unit = r.hmget(COST_KEY, [shape, GLOBAL_FIELD])
    new_image = per_image if old_image is None else EWMA_ALPHA * per_image + (1 - EWMA_ALPHA) * float(old_image)
    new_unit = per_unit if old_unit is None else EWMA_ALPHA * per_unit + (1 - EWMA_ALPHA) * float(old_unit)
    r.hset(COST_KEY, mapping={shape: new_image, GLOBAL_FIELD: new_unit})


def seconds_per_image(shape: str, costs: dict | None = None) -> float:
    costs = costs if costs is not None else get_redis().hgetall(COST_KEY)
    if shape in costs:
        return float(costs[shape])
    info = scheduler.parse_shape(shape)
    unit = float(costs.get(GLOBAL_FIELD, settings.IMAGEGEN_PRIOR_SECONDS_PER_MPX_STEP))
    return unit * info["width"] * info["height"] / 1e6 * info["steps"]


def active_gpus(model_name: str | None = None) -> int:
    from gpu_tasks.worker import live_workers

    return len(live_workers(model_name or settings.IMAGEGEN_MODEL_NAME))


@dataclass(frozen=True)
class Estimate:
    eta_seconds: float | None  # None: no live GPU worker, so no honest number
    position: int  # jobs queued ahead
    work_ahead_seconds: float
    queued_images: int
    active_gpus: int


def estimate(shape: str, images: int, enqueued_at: float | None = None, model_name: str | None = None) -> Estimate:
    """For a new job (enqueued_at None) or one already queued since enqueued_at."""
    model_name = model_name or settings.IMAGEGEN_MODEL_NAME
    costs = get_redis().hgetall(COST_KEY)
    ahead_seconds = 0.0
    position = 0
    queued_images = 0
    for other_shape, entries in scheduler.queued_entries(model_name).items():
        per_image = seconds_per_image(other_shape, costs)
        for job_id, count, score in entries:
            queued_images += count
            if enqueued_at is None or score < enqueued_at:
                ahead_seconds += per_image * count
                position += 1
    # Work already on the GPUs: on average half a batch remains.
    from jobs.models import GenerationJob

    running = GenerationJob.objects.filter(status="running").only("width", "height", "steps", "count", "model_version", "guidance_scale", "scheduler")
    for job in running[:1000]:
        ahead_seconds += 0.5 * job.count * seconds_per_image(
            scheduler.shape_key(job.model_version, job.width, job.height, job.steps, job.guidance_scale, job.scheduler), costs
        )
    gpus = active_gpus(model_name)
    if gpus == 0:
        return Estimate(None, position, ahead_seconds, queued_images, 0)
    own = seconds_per_image(shape, costs) * images
    eta = ahead_seconds / gpus + own + settings.IMAGEGEN_FILL_WAIT
    return Estimate(eta, position, ahead_seconds, queued_images, gpus)


class Refused(Exception):
    """Admission refused: answer 429 with Retry-After."""

    def __init__(self, message: str, retry_after: int, eta_seconds: float | None = None, limit: str = ""):
        super().__init__(message)
        self.message = message
        self.retry_after = max(1, int(math.ceil(retry_after)))
        self.eta_seconds = eta_seconds
        self.limit = limit


def check_user_limits(user, images: int) -> None:
    from jobs.models import GenerationJob

    in_flight = GenerationJob.objects.filter(owner=user, status__in=["queued", "running"]).count()
    if in_flight >= settings.IMAGEGEN_USER_MAX_IN_FLIGHT:
        raise Refused(
            f"You have {in_flight} jobs in flight; the limit is {settings.IMAGEGEN_USER_MAX_IN_FLIGHT}. "
            "Wait for one to finish.",
            retry_after=5,
            limit="jobs_in_flight",
        )
    since = timezone.now() - timezone.timedelta(days=1)
    used = sum(
        GenerationJob.objects.filter(owner=user, created_at__gte=since)
        .exclude(status__in=["blocked", "failed", "cancelled"])
        .values_list("count", flat=True)
    )
    if used + images > settings.IMAGEGEN_USER_MAX_IMAGES_PER_DAY:
        raise Refused(
            f"This would take you to {used + images} images in 24 hours; the limit is "
            f"{settings.IMAGEGEN_USER_MAX_IMAGES_PER_DAY} images per day.",
            retry_after=3600,
            limit="images_per_day",
        )


def admit_or_degrade(shape_for_steps, images: int, steps: int, allow_degrade: bool) -> tuple[int, Estimate]:
    """The steps to run with (lowered when degrading) and the estimate, or Refused."""
    shape = shape_for_steps(steps)
    est = estimate(shape, images)
    if est.queued_images + images > settings.IMAGEGEN_MAX_QUEUED_IMAGES:
        raise Refused(
            f"The queue is full ({est.queued_images} images waiting). Try again later.",
            retry_after=(est.eta_seconds or 30),
            eta_seconds=est.eta_seconds,
            limit="queue_full",
        )
    if est.eta_seconds is None or est.eta_seconds <= settings.IMAGEGEN_MAX_QUEUE_WAIT:
        return steps, est
    if allow_degrade and steps > settings.IMAGEGEN_DEGRADE_STEPS:
        degraded_steps = settings.IMAGEGEN_DEGRADE_STEPS
        degraded = estimate(shape_for_steps(degraded_steps), images)
        if degraded.eta_seconds is not None and degraded.eta_seconds <= settings.IMAGEGEN_MAX_QUEUE_WAIT * 1.5:
            return degraded_steps, degraded
    raise Refused(
        f"The estimated wait is {est.eta_seconds:.0f}s, over the {settings.IMAGEGEN_MAX_QUEUE_WAIT:.0f}s limit. "
        "Try again later, or send allow_degrade=true to accept fewer steps.",
        retry_after=est.eta_seconds - settings.IMAGEGEN_MAX_QUEUE_WAIT,
        eta_seconds=est.eta_seconds,
        limit="max_queue_wait",
    )
