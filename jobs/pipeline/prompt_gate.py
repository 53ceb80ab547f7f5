"""The prompt gate stage (cpu queue): allow (to the scheduler, or first to the rewriter), review
(held) or block, with a verdict record, before any GPU time is spent.

A job whose prompt the rewriter changed comes through the gate a second time, on the prompt it
will draw (the rewriter may write what the user did not): that verdict is recorded at stage
`rewrite`, and a block or a hold there names that stage."""

from __future__ import annotations

import logging
import time

from imagegen import timing
from imagegen.precompiled import Precompiled
from jobs import actions
from jobs.models import GenerationJob, JobStage
from safety.models import SafetyVerdict

log = logging.getLogger(__name__)


# Every prompt check runs these (imagegen/precompiled.py: compiled once, filled per call).
_JOB = Precompiled(lambda id: GenerationJob.objects.filter(id=id)[:1], id=GenerationJob._meta.get_field("id"))
_FIRST_VERDICT = Precompiled(
    lambda job, stage: SafetyVerdict.objects.filter(job_id=job, stage=stage).order_by("created_at")[:1],
    job=SafetyVerdict._meta.get_field("job"), stage=SafetyVerdict._meta.get_field("stage"))
_LAST_HUMAN = Precompiled(
    lambda job: SafetyVerdict.objects.filter(job_id=job, stage="human", image__isnull=True).order_by("-created_at")[:1],
    job=SafetyVerdict._meta.get_field("job"))
_LAST_HUMAN_AFTER = Precompiled(
    lambda job, after: SafetyVerdict.objects.filter(job_id=job, stage="human", image__isnull=True, created_at__gt=after)
    .order_by("-created_at")[:1],
    job=SafetyVerdict._meta.get_field("job"), after=SafetyVerdict._meta.get_field("created_at"))


def gate_prompt(job_id: str) -> str:
    job = _JOB.first(id=job_id)
    if job is None or job.stage not in (JobStage.PROMPT, JobStage.REWRITE_CHECK):
        return "skipped"  # a duplicate, a stale re-send, or a job that moved on
    timing.note(waited_s=max(0.0, time.time() - job.created_at.timestamp()))  # since the submit
    rewritten = job.stage == JobStage.REWRITE_CHECK
    stage, prompt = ("rewrite", job.revised_prompt) if rewritten else ("prompt", job.prompt)
    # A verdict already recorded (a redelivered task) is reused, never decided twice.
    verdict = _FIRST_VERDICT.first(job=job.id, stage=stage)
    if verdict is None:
        from jobs.pipeline import prompt_batch

        try:
            result = prompt_batch.check(job, prompt)  # with other waiting prompts in one encoder pass
        except Exception as exc:  # fail closed: a broken filter blocks nothing through
            log.exception("prompt filter failed for job %s", job_id)
            actions.fail_unstarted(job.id, f"the prompt safety check failed ({type(exc).__name__}); nothing was generated")
            return "error"
        verdict = actions.record_prompt_verdict(job, result, stage=stage)
    # A human verdict on the prompt (not on an image) wins over the gate's: a moderator's approval
    # whose admit was lost is admitted when the reaper re-sends the check, never re-held. On the
    # rewritten prompt only a decision made after its own verdict counts (one on the user's
    # prompt did not see what the rewriter wrote).
    human = (_LAST_HUMAN_AFTER.first(job=job.id, after=verdict.created_at) if rewritten
             else _LAST_HUMAN.first(job=job.id))
    if human is None and rewritten and verdict.decision == "review":
        human = _approval_carried(job.id, verdict)
    if human is not None:
        verdict = human
    # Each outcome is a move from the stage this check holds: a duplicate finds it gone.
    if verdict.decision == "block":
        actions.block_job(job.id, stage, _naming(stage, verdict.reason), from_stages=[job.stage])
    elif verdict.decision == "review":
        actions.hold_for_review(job.id, stage, _naming(stage, verdict.reason), from_stages=[job.stage])
    else:
        actions.admit(job.id, from_stages=[job.stage])  # to the scheduler; or first to the rewriter
    return verdict.decision


def _approval_carried(job_id, held) -> SafetyVerdict | None:
    """A moderator's approval of the user's prompt answers a hold of its rewrite when the rewrite
    raises no category the moderator was not asked about: a job asks a moderator at most once
    about its prompt (then once about its images). The gate's own verdict on the rewrite stays
    on record; a block on the rewrite is never carried over."""
    approval = _LAST_HUMAN.first(job=job_id)
    if approval is None or approval.decision != "allow":
        return None
    seen = set(SafetyVerdict.objects.filter(job_id=job_id, stage="prompt").exclude(decision="allow")
               .values_list("category", flat=True))
    return approval if held.category in seen else None


def _naming(stage: str, reason: str) -> str:
    return f"the rewritten prompt: {reason}" if stage == "rewrite" and reason else reason
