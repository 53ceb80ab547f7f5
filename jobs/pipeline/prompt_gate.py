"""The prompt gate stage (cpu queue): allow (to the scheduler), review (held) or block, with a
verdict record, before any GPU time is spent."""

from __future__ import annotations

import logging

from jobs import actions
from jobs.models import GenerationJob, JobStatus
from safety.models import SafetyVerdict

log = logging.getLogger(__name__)


def gate_prompt(job_id: str) -> str:
    job = GenerationJob.objects.filter(id=job_id).first()
    if job is None or job.status != JobStatus.QUEUED or job.scheduled_at is not None:
        return "skipped"
    # A verdict already recorded (a redelivered task) is reused, never decided twice.
    verdict = SafetyVerdict.objects.filter(job=job, stage="prompt").order_by("created_at").first()
    if verdict is None:
        from jobs.pipeline import prompt_batch

        try:
            result = prompt_batch.check(job)  # with other waiting prompts in one encoder pass
        except Exception as exc:  # fail closed: a broken filter blocks nothing through
            log.exception("prompt filter failed for job %s", job_id)
            actions.fail_unstarted(job.id, f"the prompt safety check failed ({type(exc).__name__}); nothing was generated")
            return "error"
        verdict = actions.record_prompt_verdict(job, result)
    # A human verdict on the prompt (not on an image) wins over the gate's: a moderator's approval
    # whose admit was lost is admitted when the reaper re-sends the check, never re-held.
    human = SafetyVerdict.objects.filter(job=job, stage="human", image__isnull=True).order_by("-created_at").first()
    if human is not None:
        verdict = human
    if verdict.decision == "block":
        actions.block_job(job.id, "prompt", verdict.reason)
    elif verdict.decision == "review":
        actions.hold_for_review(job.id, "prompt", verdict.reason)
    else:
        actions.admit(job.id)
    return verdict.decision
