"""A batch past denoising: its images handed to quarantine, judged, and published.

The stages after the GPU each take a batch id. The batch row says which stage it has reached
and holds the lease of that stage (the jobs' own leases end at the hand-off), so the reaper
re-runs a stuck batch from its stage; each step is a compare-and-set on the batch stage and on
the jobs' (status, batch, attempts), so a re-run or a duplicated task never writes twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from imagegen import metrics
from imagegen.stage_table import STAGES
from jobs.actions.lifecycle import release_joiners
from jobs.actions.notify import status_on_commit
from jobs.actions.stages import enter_stage
from jobs.models import Batch, BatchStage, GeneratedImage, GenerationJob, JobStage, JobStatus, at

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Written:
    """One image the GPU worker wrote to quarantine."""

    job_id: str
    index: int
    seed: int
    key: str
    width: int
    height: int
    byte_size: int
    sha256: str
    content_type: str
    content_sha256: str = ""  # the file before its content credentials (jobs/media/credentials.py)


def held_jobs(batch_id, attempts: dict[str, int]) -> set[str]:
    """The jobs of the batch that this attempt still holds (generating, in this batch, same attempt)."""
    rows = GenerationJob.objects.filter(id__in=list(attempts), stage=JobStage.GENERATE, batch_id=batch_id)
    return {str(job_id) for job_id, n in rows.values_list("id", "attempts") if attempts.get(str(job_id)) == n}


def hand_off(batch_id, attempts: dict[str, int], written: list[Written]) -> tuple[set[str], list[Written]]:
    """The images are in quarantine: record them, end the jobs' generation leases and move the
    batch to the classify stage, in one transaction. Returns the jobs handed on and the images
    of jobs this attempt no longer holds (cancelled, or requeued after a lost lease), whose
    bytes the caller deletes."""
    with transaction.atomic():
        locked = Batch.objects.select_for_update().filter(id=batch_id, stage=BatchStage.GENERATE).first()
        if locked is None:
            return set(), written
        held = held_jobs(batch_id, attempts)
        keep = [w for w in written if w.job_id in held]
        GeneratedImage.objects.bulk_create([
            GeneratedImage(
                job_id=w.job_id, batch_id=batch_id, index=w.index, seed=w.seed, storage_key=w.key, width=w.width,
                height=w.height, byte_size=w.byte_size, sha256=w.sha256, content_type=w.content_type,
                content_sha256=w.content_sha256, tier="quarantine",
            )
            for w in keep
        ])
        GenerationJob.objects.filter(id__in=held, stage=JobStage.GENERATE, batch_id=batch_id).update(
            **at(JobStage.CLASSIFY), lease_expires_at=None, progress_step=locked.steps
        )
        if held:
            Batch.objects.filter(id=batch_id).update(**enter_stage(BatchStage.CLASSIFY, timezone.now()))
        else:
            Batch.objects.filter(id=batch_id).update(stage=BatchStage.DONE, lease_expires_at=None)
    return held, [w for w in written if w.job_id not in held]


def close_empty(batch_id) -> None:
    """Nothing of the batch went on (every job cancelled, or the pass failed)."""
    Batch.objects.filter(id=batch_id, stage=BatchStage.GENERATE).update(stage=BatchStage.DONE, lease_expires_at=None)


def live_images(batch: Batch) -> list[GeneratedImage]:
    """The quarantined images of the batch whose jobs are still in it (classify or publish)."""
    return list(
        GeneratedImage.objects.filter(batch=batch, job__stage__in=(JobStage.CLASSIFY, JobStage.PUBLISH), job__batch=batch)
        .select_related("job").order_by("job_id", "index")
    )


def record_verdicts(batch_id, run: str, verdicts: list, gate_error: str = "") -> bool:
    """The image gate's answer for the batch (one SafetyVerdict per image), or the reason it
    could not judge: classify -> its row's next stage (publish), once, and only by the run
    holding the stage."""
    from safety.models import SafetyVerdict

    with transaction.atomic():
        locked = Batch.objects.select_for_update().filter(id=batch_id, stage=BatchStage.CLASSIFY, stage_run=run).first()
        if locked is None:
            return False
        if gate_error:
            locked.gate_error = gate_error[:2000]
        else:
            SafetyVerdict.objects.bulk_create(verdicts)
            metrics.count_verdicts(verdicts)
        # On to the stage after classify in the table (publish, or a stage a row puts between them).
        following = STAGES[BatchStage.CLASSIFY].next or BatchStage.PUBLISH
        Batch.objects.filter(id=batch_id).update(**enter_stage(following, timezone.now()), gate_error=locked.gate_error)
        GenerationJob.objects.filter(batch_id=batch_id, stage=JobStage.CLASSIFY).update(**at(JobStage.PUBLISH))
    return True


@dataclass(frozen=True)
class Outcome:
    job_id: str
    attempts: int
    status: str
    stage: str
    reason: str


def _within_review_cap(outcome: Outcome) -> Outcome:
    """An image-stage hold counts against IMAGEGEN_USER_MAX_IN_REVIEW like a prompt hold: an
    owner whose cases already fill it has the job blocked instead (its images stay private).
    Called inside finish_batch's transaction, under the owner's lock."""
    from django.conf import settings

    from jobs.access import usage

    owner_id = GenerationJob.objects.filter(id=outcome.job_id).values_list("owner_id", flat=True).first()
    if owner_id is None:
        return outcome
    usage.lock_user(owner_id)
    held, limit = usage.review_cases(owner_id), settings.IMAGEGEN_USER_MAX_IN_REVIEW
    if held < limit:
        return outcome
    return Outcome(outcome.job_id, outcome.attempts, JobStatus.BLOCKED, outcome.stage, (
        f"{outcome.reason} (it would be held for review, but {held} of your jobs already wait for a moderator; "
        f"the limit is {limit})"
    ))


def finish_batch(batch_id, run: str, outcomes: list[Outcome], now=None,
                 clips: dict | None = None) -> tuple[list[str], set[str]] | None:
    """Publish: each job's final stage, done, blocked or review (compare-and-set on the stage
    `publish`, this batch, this attempt)
    with its images public when it is done, in one transaction; publish -> done, only by the run
    holding the stage. The caller has copied the allowed images to public storage already (and
    packaged each done clip: `clips`, its row's fields naming its public files, by row id).
    Returns (the jobs finished, the jobs this run saw leave the batch under its lock: cancelled
    meanwhile, whose copies the caller removes), or None when this run does not hold the stage:
    another run finished it or took it over, and the caller touches nothing."""
    finished: list[str] = []
    with transaction.atomic():
        locked = Batch.objects.select_for_update().filter(id=batch_id, stage=BatchStage.PUBLISH, stage_run=run).first()
        if locked is None:
            return None
        now = now or timezone.now()
        for outcome in outcomes:
            if outcome.status == JobStatus.REVIEW:
                outcome = _within_review_cap(outcome)
            updated = GenerationJob.objects.filter(
                id=outcome.job_id, stage=JobStage.PUBLISH, batch_id=batch_id, attempts=outcome.attempts
            ).update(**at(outcome.status), blocked_stage=outcome.stage, reason=outcome.reason, finished_at=now,
                     lease_expires_at=None)
            if not updated:
                continue
            finished.append(outcome.job_id)
            metrics.count_jobs(outcome.status, locked.model_version)
            if outcome.status == JobStatus.DONE:
                GeneratedImage.objects.filter(job__id=outcome.job_id, batch_id=batch_id).update(tier="public")
                for image_id in GeneratedImage.objects.filter(job__id=outcome.job_id, batch_id=batch_id,
                                                              id__in=list(clips or ())).values_list("id", flat=True):
                    GeneratedImage.objects.filter(id=image_id).update(**(clips or {})[image_id])
        rest = {o.job_id for o in outcomes} - set(finished)
        gone = {str(j) for j in GenerationJob.objects.filter(id__in=rest).exclude(
            stage=JobStage.PUBLISH, batch_id=batch_id).values_list("id", flat=True)}
        Batch.objects.filter(id=batch_id).update(stage=BatchStage.DONE, lease_expires_at=None)
        status_on_commit(*finished)
        release_joiners(finished)  # identical requests that joined these jobs' pass take their copies now
    return finished, gone
