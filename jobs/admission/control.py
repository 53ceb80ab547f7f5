"""Admission control: the user's limits, and admit or degrade a new job on the honest wait
estimate, answered from the summary (jobs/admission/summary.py), which the replay
(jobs/admission/replay.py) computes once per interval."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from django.conf import settings
from django.db.models import Sum

from imagegen.precompiled import Precompiled
from jobs.admission import degrade
from jobs.admission import summary as queue_summary
from jobs.admission.degrade import Rung
from jobs.admission.replay import Estimate, cap_of, estimate
from jobs.models import GenerationJob
from scheduling import costs as cost_model
from scheduling import policy, scheduler
from scheduling.costs import pass_seconds


class Refused(Exception):
    """Admission refused: answer 429 with Retry-After."""

    def __init__(self, message: str, retry_after: int, eta_seconds: float | None = None, limit: str = ""):
        super().__init__(message)
        self.message = message
        self.retry_after = max(1, int(math.ceil(retry_after)))
        self.eta_seconds = eta_seconds
        self.limit = limit


def _limits(priority: str) -> tuple[int, int]:
    """(jobs in flight, images per day) allowed per user in the tier."""
    if priority == "batch":
        return settings.IMAGEGEN_USER_MAX_BATCH_IN_FLIGHT, settings.IMAGEGEN_USER_MAX_BATCH_IMAGES_PER_DAY
    return settings.IMAGEGEN_USER_MAX_IN_FLIGHT, settings.IMAGEGEN_USER_MAX_IMAGES_PER_DAY


def check_user_limits(user, images: int | None, priority: str = "interactive", locked: bool = False) -> None:
    """Refused past the user's in-flight jobs or daily images (charged GPU work plus what their
    unfinished jobs reserve, jobs/access/usage.py), counted per priority tier (batch work has its own
    limits). Atomic with the insert only when called inside the
    submit's transaction after usage.lock_user (jobs/pipeline/submit.py); `images` None: the early,
    unlocked check of the in-flight limit alone, so a user at it costs no estimate. (Cases held
    for review are bounded where they are made: the prompt gate and appeals.) `locked`: take the
    user's lock, then every count in one statement (usage.lock_and_count), inside the caller's
    transaction."""
    from jobs.access import usage

    max_in_flight, limit = _limits(priority)
    tier = " batch" if priority == "batch" else ""
    charged: int | None = None
    if images is None:
        in_flight, reserved = usage.jobs_in_flight(user.pk, priority), 0
    elif locked:
        in_flight, reserved, charged = usage.lock_and_count(user.pk, priority)
    else:
        in_flight, reserved = usage.unfinished(user.pk, priority)
    if in_flight >= max_in_flight:
        raise Refused(
            f"You have {in_flight}{tier} jobs in flight; the limit is {max_in_flight}. "
            "Wait for one to finish.",
            retry_after=5,
            limit="jobs_in_flight",
        )
    if images is None:
        return
    if charged is None:
        charged = usage.images_charged(user.pk, priority=priority)
    used = charged + reserved
    if used + images > limit:
        # Over on charges alone: when enough of them age out of the 24 h. Otherwise the images of
        # waiting jobs are in the way, and one of those may end (or be cancelled) any time.
        over = charged + images - limit
        retry = usage.seconds_until_charges_free(user.pk, over, priority=priority) if over > 0 else 60
        raise Refused(
            f"This would take you to {used + images}{tier} images in 24 hours (images generated or waiting to be); "
            f"the limit is {limit}{tier} images per day.",
            retry_after=int(retry),
            limit="images_per_day",
        )


def current_estimate(shape: str, images: int, owner=None, tier: int = policy.INTERACTIVE) -> Estimate:
    """estimate(shape, images) for a new job, answered from the per-shape summary that
    jobs/admission/summary.py computes with estimate() once per interval (not a replay per request).
    The summary answers for an owner with nothing queued (a new fair-share flow). A job goes
    after its owner's own queued jobs of the shape, so for an owner with some the answer is at
    least the time to run those and it in full passes on the live GPUs. A batch job gets its
    own replay (it waits behind all interactive work; batch submits are rare and bounded by
    IMAGEGEN_USER_MAX_BATCH_IN_FLIGHT)."""
    if tier != policy.INTERACTIVE:
        return estimate(shape, images, owner=str(owner.pk) if owner is not None else "", tier=tier)
    e = queue_summary.new_job_entry(shape, images)
    est = queue_summary.estimate_of(e)
    own = _own_queued_images(owner, shape) if owner is not None else 0
    if own and est.eta_seconds is not None and est.active_gpus:
        full_pass, overhead = e.get("full_pass"), e.get("overhead")
        if full_pass is None or overhead is None:  # an entry made before they were kept in it
            costs = cost_model.costs()
            full_pass, overhead = pass_seconds(shape, cap_of(shape), costs), cost_model.overhead(costs)
        passes = math.ceil((own + images) / cap_of(shape))
        own_drain = passes * full_pass / est.active_gpus + overhead
        if own_drain > est.eta_seconds:
            return Estimate(own_drain, est.position, est.work_ahead_seconds, est.queued_images, est.active_gpus)
    return est


def read_ahead(shape: str, images: int, tier: int = policy.INTERACTIVE) -> None:
    """Queue current_estimate's Redis reads to ride in the request's next pipeline."""
    if tier == policy.INTERACTIVE:
        queue_summary.read_ahead_new(shape, images)


def _own_queued_query(owner, model_version: str, width: int, height: int, steps: int):
    return GenerationJob.objects.filter(
        owner_id=owner, status="queued", priority="interactive", model_version=model_version,
        width=width, height=height, steps=steps,
    ).order_by().values("owner_id").annotate(n=Sum("billable_images")).values_list("n")


# Every submit runs it: compiled once (imagegen/precompiled.py).
_OWN_QUEUED = Precompiled(_own_queued_query, **{name: GenerationJob._meta.get_field(name) for name in (
    "owner", "model_version", "width", "height", "steps")})


def _own_queued_images(owner, shape: str) -> int:
    info = scheduler.parse_shape(shape)
    row = _OWN_QUEUED.first(owner=owner.pk, model_version=info["model_version"], width=info["width"],
                            height=info["height"], steps=info["steps"])
    return (row[0] or 0) if row else 0


def _accepted(shape: str) -> None:
    queue_summary.note_submit(shape)


def count_prompt_check(user) -> None:
    """Every prompt check costs the user one unit of IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE,
    whatever it decides: blocked prompts are work for the cpu queue too. Redis errors propagate
    (the submit cannot go on without Redis anyway)."""
    from jobs.access import ratelimit

    per_minute = settings.IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE
    if per_minute <= 0:
        return
    verdict = ratelimit.take(f"prompt:{user.pk}", per_minute, 60.0)
    if not verdict.allowed:
        raise Refused(
            f"You sent more than {per_minute} prompts to check in a minute. Try again in {verdict.retry_after}s.",
            retry_after=verdict.retry_after,
            limit="prompt_checks",
        )


class Admitted(NamedTuple):
    steps: int
    estimate: Estimate
    rung: Rung | None = None  # the way down it was admitted on (jobs/admission/degrade.py); None: as asked


def admit_or_degrade(shape_for_steps, images: int, steps: int, allow_degrade: bool, owner=None,
                     tier: int = policy.INTERACTIVE, rewrite: bool = False,
                     degrade_steps: int = 0, down: Callable[[], Sequence[Rung]] | None = None) -> Admitted:
    """The steps to run with and the estimate, or Refused. Past the wait limit a job that allows
    degrading goes down the first rung of `down()` whose own lane's wait is within 1.5x the limit
    (jobs/admission/degrade.py: fewer steps, or the model's student, best measured quality first);
    without `down`, fewer steps (the model's `degrade_steps`, else IMAGEGEN_DEGRADE_STEPS). A job
    whose prompt goes through the rewriter waits one measured rewriter pass more
    (scheduling/costs.py)."""
    extra = cost_model.recent_rewrite_seconds() if rewrite else 0.0

    def estimate_of(shape: str) -> Estimate:
        est = current_estimate(shape, images, owner, tier)
        if extra and est.eta_seconds is not None:
            return dataclasses.replace(est, eta_seconds=est.eta_seconds + extra)
        return est

    shape = shape_for_steps(steps)
    est = estimate_of(shape)
    max_wait = settings.IMAGEGEN_BATCH_MAX_QUEUE_WAIT if tier == policy.BATCH else settings.IMAGEGEN_MAX_QUEUE_WAIT
    if est.queued_images + images > settings.IMAGEGEN_MAX_QUEUED_IMAGES:
        raise Refused(
            f"The queue is full ({est.queued_images} images waiting). Try again later.",
            retry_after=int(est.eta_seconds or 30),
            eta_seconds=est.eta_seconds,
            limit="queue_full",
        )
    if est.eta_seconds is None or est.eta_seconds <= max_wait:
        _accepted(shape)
        return Admitted(steps, est)
    if allow_degrade:
        if down is not None:
            ladder = list(down())
        else:
            fewer = degrade_steps or settings.IMAGEGEN_DEGRADE_STEPS
            info = scheduler.parse_shape(shape_for_steps(fewer))
            ladder = [Rung(info["model_version"], fewer, info["guidance_scale"], info["scheduler"], None,
                           shape_for_steps(fewer))] if steps > fewer else []
        estimates: dict[Rung, Estimate] = {}

        def eta_of(rung: Rung) -> float | None:
            estimates[rung] = e = estimate_of(rung.shape)
            return e.eta_seconds if e.queued_images + images <= settings.IMAGEGEN_MAX_QUEUED_IMAGES else None

        chosen = degrade.choose(ladder, eta_of, max_wait * 1.5)
        if chosen is not None:
            _accepted(chosen.shape)
            return Admitted(chosen.steps, estimates[chosen], chosen)
    raise Refused(
        f"The estimated wait is {est.eta_seconds:.0f}s, over the {max_wait:.0f}s limit. "
        "Try again later, or send allow_degrade=true to accept fewer steps.",
        retry_after=int(math.ceil(est.eta_seconds - max_wait)),
        eta_seconds=est.eta_seconds,
        limit="max_queue_wait",
    )
