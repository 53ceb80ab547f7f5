"""Submitting a job: limits, the request-hash cache, admission, the row, then the first stage."""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from imagegen import metrics
from imagegen.redis_client import batched as redis_batched
from jobs import actions
from jobs.admission import control as admission
from jobs.admission import degrade
from jobs.media import cache
from jobs.models import GenerationJob
from jobs.pipeline import rewrite, stages
from scheduling import catalogue, lanes, scheduler


def submit_job(owner, data: dict) -> GenerationJob:
    """Admit a validated request: served from the request-hash cache when every image is
    there (done at once, no queue, no GPU; each image a file of the job's own), else queued with
    only the missing images to make, and its prompt check dispatched after commit. A hit on
    another user's entries (k-anonymous scope) is admitted, queued and checked as a fresh job
    and revealed when one would be done (jobs/media/cache.py). A request identical to a job in flight
    joins it (cache.in_flight): no pass of its own, its own copies when that job delivers. Raises admission.Refused (429) past the
    user's limits or the honest wait limit. The job's estimate is left on job.estimate.

    The user's limits are checked twice: the in-flight limit first without a lock, so a user at
    it costs no estimate, then all of them inside the transaction that inserts the job, under
    the user's lock (jobs/access/usage.py), so concurrent submits cannot all pass one count."""
    with redis_batched():  # the counters it writes in one round trip at the end
        return _submit(owner, data)


def _submit(owner, data: dict) -> GenerationJob:
    seed = data.get("seed")
    shared = cache.shares(seed_given=seed is not None)
    if seed is None:
        seed = settings.IMAGEGEN_FIXED_SEED if settings.IMAGEGEN_SEED_POLICY == "fixed" else secrets.randbelow(2**32)
    priority = data.get("priority") or "interactive"
    admission.check_user_limits(owner, None, priority)
    job = GenerationJob(
        owner=owner,
        prompt=data["prompt"],
        negative_prompt=data.get("negative_prompt", ""),
        width=data["width"],
        height=data["height"],
        steps=data["steps"],
        guidance_scale=data["guidance_scale"],
        seed=seed,
        count=data["count"],
        frames=data.get("frames") or 1,
        fps=data.get("fps") or 0,
        progress_total=data["steps"],
        output_format=data.get("output_format") or "png",
        output_compression=data.get("output_compression"),
        regenerates=data.get("regenerates"),
        steering=data.get("steering"),  # a regeneration's: its original's (jobs/pipeline/regenerate.py)
        scheduler=data.get("variant", ""),  # a quality tier's levers (gpu_tasks/levers.py)
        rewrite=rewrite.wanted(data.get("rewrite")),
        **_integration_fields(data),
    )
    job.model_version = data.get("model") or lanes.pick_version(job.id)
    job.rewriter_version = rewrite.identity() if job.rewrite else ""  # the cache key's part (jobs/media/cache.py)

    def shape_for(steps: int) -> str:
        return scheduler.shape_key(job.model_version, job.width, job.height, steps, job.guidance_scale, job.scheduler)

    # The estimate's summary entry is read in the cache lookup's round trip (a miss needs it).
    admission.read_ahead(shape_for(job.steps), job.count, scheduler.tier_of(job.priority))
    # A video is neither looked up nor joined: its files are a set the cache does not copy (yet).
    reusable = job.frames == 1
    if reusable:
        cache.read_ahead_in_flight(job, shared)  # and the in-flight notes a join needs
    cached, cross_user = _usable(cache.lookup(job, shared), job.count) if reusable else ({}, False)
    job.estimate = None

    def joinable() -> tuple:
        return (None, False) if cached or cross_user or not reusable else cache.in_flight(job, shared)

    # The owner's own join spends no GPU and skips admission, as the owner's own cache hit does.
    leader, joins_across = joinable()
    if (len(cached) < job.count or cross_user) and (leader is None or joins_across):
        # A cross-user hit is admitted as the fresh job it must look like: the same estimate,
        # refusal or degradation, for all its images.
        steps, job.estimate, rung = admission.admit_or_degrade(
            shape_for, job.count if cross_user else job.count - len(cached), job.steps, data.get("allow_degrade", False),
            owner, scheduler.tier_of(job.priority), rewrite=job.rewrite, down=lambda: _ways_down(job),
        )
        if rung is not None:
            # Degraded: fewer steps, or drawn by the model's student on its own lane (the job
            # records the model that draws it, at the student's steps and guidance).
            metrics.inc("imagegen_degraded_total", to="student" if rung.student else "steps")
            job.degraded, job.requested_steps, job.steps, job.progress_total = True, job.steps, steps, steps
            job.model_version, job.guidance_scale, job.scheduler = rung.model_version, rung.guidance_scale, rung.variant
            cached, cross_user = _usable(cache.lookup(job, shared), job.count) if reusable else ({}, False)
            leader, joins_across = joinable()
    if leader is not None:
        # An identical request in flight: this job joins its pass (no GPU of its own), checked by
        # its own prompt check, then waiting for the leader's delivery to take its own copies
        # (jobs/actions/lifecycle.py reveal_start). Charged like a cache hit: nothing for the
        # owner's own repeat; another user's join (k-anonymous) as the fresh job it looks like.
        job.joins = leader
        job.billable_images = job.count if joins_across else 0
        job.cache_reveal_at = cache.reveal_at(job, job.estimate.eta_seconds) if joins_across else None
    elif cross_user:
        # Queued, checked, reserved, charged and timed as a fresh job; its own files are made at
        # its reveal, off this request, in the GPU worker (jobs/actions/lifecycle.py reveal_start).
        job.billable_images, job.cache_reveal_at = job.count, cache.reveal_at(job, job.estimate.eta_seconds)
        cached = {}
    else:
        # The quota counts GPU work in images: a clip is its frames' worth.
        job.billable_images = (job.count - len(cached)) * job.frames
        cached = cache.own_copies(job, cached)  # each hit a file of this job's own, in its format
    try:
        with transaction.atomic():
            admission.check_user_limits(owner, job.billable_images, job.priority, locked=True)  # lock + counts: one statement
            cache.publish(cached)  # before the commit that makes the rows public (as the publish stage does)
            if len(cached) == job.count:
                actions.finish_from_cache(job, cached)
            else:
                admission.count_prompt_check(owner)
                actions.create_queued(job, cached)
                # Robust: a broker outage must not turn an accepted (committed) job into an error
                # answer that invites a duplicate; the reaper re-sends lost prompt checks.
                # The first stage, through the stage table (imagegen/stage_table.py: its task and queue).
                transaction.on_commit(lambda: stages.send("prompt", str(job.id)), robust=True)
                if reusable and not cached and leader is None and job.cache_reveal_at is None:
                    # to be generated: an identical request arriving while it is in flight joins it
                    transaction.on_commit(lambda: cache.register_in_flight(job), robust=True)
    except BaseException:
        cache.discard(cached)
        raise
    return job


def _usable(cached: dict, count: int) -> tuple[dict, bool]:
    """The hits a job may use, and whether it is a cross-user hit (k-anonymous scope). Another
    user's entries serve only a job they cover whole: a part served at once and a part made would
    be told apart from a fresh job."""
    if any(getattr(image, "cross_user", False) for image in cached.values()):
        if len(cached) == count:
            return cached, True
        cached = {index: image for index, image in cached.items() if not getattr(image, "cross_user", False)}
    return cached, False


def _integration_fields(data: dict) -> dict:
    """Priority tier, deadline (cancel_after seconds from now) and webhook URL (issue 19)."""
    cancel_after = data.get("cancel_after")
    return {
        "priority": data.get("priority") or "interactive",
        "cancel_after": cancel_after,
        "deadline_at": timezone.now() + timedelta(seconds=cancel_after) if cancel_after else None,
        "webhook_url": data.get("webhook_url") or "",
    }


def _ways_down(job: GenerationJob) -> list[degrade.Rung]:
    """Fewer steps on the job's model, or its student, best measured quality first
    (jobs/admission/degrade.py)."""
    return degrade.rungs(job.model_version, job.width, job.height, job.steps, job.guidance_scale, job.scheduler,
                         job.negative_prompt, _degrade_steps(job.model_version) or settings.IMAGEGEN_DEGRADE_STEPS)


def _degrade_steps(version: str) -> int:
    """What an allow_degrade job on this model is lowered to: its serving.json's, else the
    setting, never below the model's floor (0: the setting, for a version not served)."""
    served = catalogue.get(version)
    return max(served.min_steps, served.degrade_steps or settings.IMAGEGEN_DEGRADE_STEPS) if served is not None else 0
