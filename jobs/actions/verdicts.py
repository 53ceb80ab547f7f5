"""The prompt gate's verdict on a job: recorded once (a redelivered check reuses it)."""

from __future__ import annotations

from imagegen import metrics
from jobs.models import GenerationJob


def record_prompt_verdict(job: GenerationJob, result, stage: str = "prompt"):
    """The prompt filter's result as the job's prompt SafetyVerdict (the reason shown to the
    owner; the matched terms kept for moderators). `stage` is "rewrite" for the second check, on
    the rewriter's prompt."""
    from safety.models import SafetyVerdict

    matched = f"matched: {result.matched}" if result.matched else ""
    verdict = SafetyVerdict.objects.create(
        job=job,
        stage=stage,
        decision=result.decision,
        category=result.category,
        score=result.score,
        reason=result.reason if result.decision != "allow" else matched,
        policy_version=result.policy_version,
        language=getattr(result, "language", ""),
        notes=matched,
    )
    if stage == "prompt":  # no longer among the prompts the cpu worker's drain looks for
        GenerationJob.objects.filter(id=job.id, prompt_checked_at=None).update(prompt_checked_at=verdict.created_at)
    metrics.count_verdicts([verdict])
    return verdict
