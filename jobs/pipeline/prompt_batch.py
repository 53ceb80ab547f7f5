"""Prompt checks batched across prompts, as the GPU batches images: the check that a cpu worker
runs for one job also checks the prompts of other jobs still waiting for theirs, with the
encoder run once for all of them (safety's PromptFilter.check_many), and records their verdicts.
Their own check_prompt tasks then find the verdict recorded (as a redelivered task does) and
only apply it. On two shared cores the MiniLM forward is most of a short prompt's check, and
its cost per call barely grows with the prompts packed into it (bench/prompt_batch.py).

A waiting job is claimed in Redis before it is checked here (one claim per job for CLAIM_SECONDS),
so two workers draining at once never check one prompt twice; a job whose claim is taken, or
that got a verdict meanwhile, is left to its own task.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from imagegen import timing
from imagegen.redis_client import PREFIX, get_redis
from jobs import actions
from jobs.models import GenerationJob, JobStage

log = logging.getLogger(__name__)

CLAIM_SECONDS = 60
RECENT = timedelta(minutes=10)  # older waiting jobs are the reaper's (a lost message), not a drain's


def _claim_key(job_id: str) -> str:
    return f"{PREFIX}prompt-batch:{job_id}"


def results(job_ids: list[str]) -> dict[str, object]:
    """job id -> the prompt filter's result (a PromptVerdict, or the exception its check raised),
    for the jobs that exist; one encoder pass for all of their prompts."""
    from safety.prompt_filter import get_prompt_filter

    jobs = {str(j.id): j for j in GenerationJob.objects.filter(id__in=job_ids).only("id", "prompt", "negative_prompt")}
    order = [i for i in job_ids if i in jobs]
    answers = get_prompt_filter().check_many([(jobs[i].prompt, jobs[i].negative_prompt) for i in order])
    return dict(zip(order, answers, strict=True))


def waiting_query(job_id, n: int):
    """Up to n jobs other than `job_id` still waiting for their prompt check, oldest first: read
    through the partial index of those alone (jobs.models: job_awaiting_prompt_check), so the
    rows read do not grow with the jobs waiting for a GPU or with the verdicts of the past. (An
    anti-join on the verdicts read every verdict once per queued job when PostgreSQL's
    statistics lagged a burst: ~0.5 s a pass behind 1,000 queued jobs; tests/test_prompt_batch.py.)"""
    return (
        GenerationJob.objects.filter(stage=JobStage.PROMPT, prompt_checked_at=None,
                                     created_at__gte=timezone.now() - RECENT)
        .exclude(id=job_id)
        .order_by("created_at")
        .only("id", "prompt", "negative_prompt", "owner_id", "stage")[:n]
    )


def _waiting(job: GenerationJob, n: int) -> list[GenerationJob]:
    """Up to n other jobs still waiting for their prompt check (queued, never scheduled, no
    prompt verdict), oldest first, claimed for this worker."""
    if n <= 0:
        return []

    candidates = list(waiting_query(job.id, n))
    if not candidates:
        return []
    pipe = get_redis().pipeline(transaction=False)
    pipe.set(_claim_key(str(job.id)), "1", ex=CLAIM_SECONDS)  # this one is being checked: others leave it
    for other in candidates:
        pipe.set(_claim_key(str(other.id)), "1", nx=True, ex=CLAIM_SECONDS)
    return [other for other, won in zip(candidates, pipe.execute()[1:], strict=True) if won]


def check(job: GenerationJob, prompt: str | None = None):
    """The prompt filter's result for `job`'s `prompt` (its own by default; the rewriter's at the
    second check) (what PromptFilter.check answers; it raises as check does), with up to IMAGEGEN_PROMPT_BATCH - 1 other waiting prompts checked in the same encoder
    pass and their verdicts recorded. A failure for another job is logged and left to its own
    task."""
    from safety.prompt_filter import get_prompt_filter

    try:
        others = _waiting(job, settings.IMAGEGEN_PROMPT_BATCH - 1)
    except Exception:  # Redis or the database away: this job alone, as before batching
        log.warning("prompt batch: no waiting checks taken", exc_info=True)
        others = []
    prompt = job.prompt if prompt is None else prompt
    timing.note(batch=1 + len(others))
    if not others:
        return get_prompt_filter().check(prompt, job.negative_prompt)
    answers = get_prompt_filter().check_many([(prompt, job.negative_prompt)] + [(j.prompt, j.negative_prompt) for j in others])
    for other, answer in zip(others, answers[1:], strict=True):
        if isinstance(answer, Exception):
            continue  # its own task checks it again (and fails closed there)
        try:
            from safety.models import SafetyVerdict

            if not SafetyVerdict.objects.filter(job=other, stage="prompt").exists():
                actions.record_prompt_verdict(other, answer)
        except Exception:
            log.warning("prompt batch: the verdict of job %s not recorded", other.id, exc_info=True)
    if isinstance(answers[0], Exception):
        raise answers[0]
    return answers[0]
