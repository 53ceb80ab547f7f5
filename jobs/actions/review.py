"""Human review: moderators approve or reject held prompts and images, and decide appeals.

Every decision is a SafetyVerdict at stage "human" with the reviewer and notes, and a
compare-and-set on the job's stage, so two moderators acting at once cannot both win. An
approved prompt moves on as the gate's allow would have moved it (jobs.actions.admit).
`decide` is the one door of the admin's buttons, its bulk actions and the moderation API: a case
is decided once, and a decision on a case that is not open raises CaseNotOpen.

An appeal a moderator overturned whose job a check then blocks again (the image gate on the
images the approval let be made, or the rewrite's check) is open again
(jobs.actions.notify `reopen_appeals_blocked_again`, in the transaction of that block): the user's appeal shows as
pending with a reason that says so, and the case is back in the queue, where the moderator who
overturned it is told (`overturned_then_blocked`).
"""

from __future__ import annotations

import logging
from functools import partial

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from imagegen import metrics
from jobs.actions.images import take_down
from jobs.actions.lifecycle import admit, move
from jobs.actions.notify import BLOCKED_AGAIN, status_on_commit
from jobs.media.clips import publish_clip
from jobs.media.storage import delete_quietly, publish_object, quarantine_storage
from jobs.models import GeneratedImage, GenerationJob, JobStage, JobStatus, at
from safety.models import SafetyVerdict
from safety.policy_version import policy_version

log = logging.getLogger(__name__)


class ReviewError(Exception):
    pass


class CaseNotOpen(ReviewError):
    """The job is not waiting for a moderator (decided already, or never a case)."""


class NoSuchCase(ReviewError):
    pass


DECISIONS = ("approve", "reject")
OPEN_CASE = Q(stage=JobStage.REVIEW) | Q(stage=JobStage.BLOCKED, appealed_at__isnull=False, appeal_outcome="")
def overturned_before(reviewer=None) -> Exists:
    """A moderator's allow after the appeal (by `reviewer`, when given): an open appeal with one
    was overturned once and blocked again."""
    verdicts = SafetyVerdict.objects.filter(job=OuterRef("pk"), stage="human", decision="allow",
                                            created_at__gte=OuterRef("appealed_at"))
    return Exists(verdicts.filter(reviewer=reviewer) if reviewer is not None else verdicts)


def review_queue():
    """Held jobs, and blocked jobs with an undecided appeal, oldest first; each annotated with
    `reopened` (an appeal overturned once, then blocked again)."""
    return GenerationJob.objects.filter(OPEN_CASE).annotate(reopened=overturned_before()).order_by("created_at")


def case_kind(job: GenerationJob) -> str:
    """held (a check held it), appeal (its owner appealed a block) or reopened_appeal."""
    if job.stage == JobStage.REVIEW:
        return "held"
    return "reopened_appeal" if getattr(job, "reopened", False) else "appeal"


def overturned_then_blocked(reviewer):
    """The open cases `reviewer` overturned on appeal that a check blocked again since."""
    return review_queue().filter(stage=JobStage.BLOCKED).filter(overturned_before(reviewer))


def is_open(job: GenerationJob) -> bool:
    return job.stage == JobStage.REVIEW or (
        job.stage == JobStage.BLOCKED and job.appealed_at is not None and not job.appeal_outcome)


def decide(job_id, decision: str, reviewer, notes: str = "") -> str:
    """A moderator's decision on one case, `approve` or `reject`: the outcome (approved,
    rejected, overturned, upheld). The row is locked for the decision, so of two decisions at
    once the second finds the case decided: CaseNotOpen (NoSuchCase for an unknown job)."""
    if decision not in DECISIONS:
        raise ValueError(f"a decision is one of {DECISIONS}, not {decision!r}")
    with transaction.atomic():
        job = GenerationJob.objects.select_for_update().filter(id=job_id).first()
        if job is None:
            raise NoSuchCase("no such case")
        if not is_open(job):
            decided = f", appeal {job.appeal_outcome}" if job.appeal_outcome else ""
            raise CaseNotOpen(f"this case is not open: the job is {job.status}{decided}")
        return (approve if decision == "approve" else reject)(job, reviewer, notes)


def blocked_again(job_ids):
    """Of these jobs, those whose appeal a moderator overturned and that a check (not a
    moderator) has blocked since: the definition jobs.actions.notify `reopen_appeals_blocked_again` writes by hand."""
    return GenerationJob.objects.filter(id__in=list(job_ids), stage=JobStage.BLOCKED, appeal_outcome="overturned").exclude(
        blocked_stage="human")


def _verdict(job, decision: str, reviewer, notes: str, reason: str, image=None) -> None:
    verdict = SafetyVerdict.objects.create(
        job=job,
        image=image,
        image_index=image.index if image is not None else None,
        stage="human",
        decision=decision,
        reviewer=reviewer,
        notes=notes,
        reason=reason,
        policy_version=policy_version(),
    )
    metrics.count_verdicts([verdict])


def _publish_images(job: GenerationJob) -> None:
    """A moderator approved the images: quarantine -> public (same immutable key). A held clip is
    packaged now (its strip -> MP4, poster, HLS: jobs/media/clips.py); a clip taken down after
    delivery has each of its files put back."""
    for image in job.images.filter(tier="quarantine"):
        if image.media:
            for key in image.media.get("files", []):
                publish_object(key)
            fields = {}
        elif job.frames > 1:
            fields = publish_clip(image, job)
        else:
            publish_object(image.storage_key)
            fields = {}
        GeneratedImage.objects.filter(id=image.id, tier="quarantine").update(tier="public", **fields)
        if fields:  # the strip has done its work once the row names the files
            transaction.on_commit(partial(delete_quietly, image.storage_key, quarantine_storage()))


def approve(job: GenerationJob, reviewer, notes: str = "") -> str:
    """Held prompt -> generation continues; held images -> delivered; appeal -> overturned."""
    appeal = job.stage == JobStage.BLOCKED and job.appealed_at is not None and not job.appeal_outcome
    # Images exist when the gate held or blocked them (stage image) or a moderator took a
    # delivered image down (stage human): approving publishes them; otherwise the prompt was
    # held or blocked and the job goes back to the queue to be generated.
    has_images = job.images.filter(tier="quarantine").exists()
    with transaction.atomic():
        if job.stage == JobStage.REVIEW or appeal:
            source = JobStage.BLOCKED if appeal else JobStage.REVIEW
            if has_images and job.blocked_stage in ("image", "human"):
                updated = GenerationJob.objects.filter(id=job.id, stage=source).update(
                    **at(JobStage.DONE), finished_at=timezone.now(), reason="", blocked_stage="",
                    appeal_outcome="overturned" if appeal else job.appeal_outcome,
                )
                if not updated:
                    raise CaseNotOpen("the case was decided meanwhile")
                _publish_images(job)
                metrics.count_jobs(JobStatus.DONE, job.model_version)
                status_on_commit(job.id)
                for image in job.images.all():
                    _verdict(job, "allow", reviewer, notes, "approved by a moderator", image=image)
            else:
                # The prompt (or its rewrite) approved: on to the rewriter or the scheduler.
                if not admit(job.id, from_stages=[source], reason="", blocked_stage="", finished_at=None,
                             appeal_outcome="overturned" if appeal else job.appeal_outcome):
                    raise CaseNotOpen("the case was decided meanwhile")
                _verdict(job, "allow", reviewer, notes, "prompt approved by a moderator")
        else:
            raise CaseNotOpen(f"a {job.status} job is not waiting for review")
    return "overturned" if appeal else "approved"


def reject(job: GenerationJob, reviewer, notes: str = "") -> str:
    """Held -> blocked (bytes stay private); appeal -> upheld, the job stays blocked."""
    appeal = job.stage == JobStage.BLOCKED and job.appealed_at is not None and not job.appeal_outcome
    reason = notes or "rejected by a moderator"
    with transaction.atomic():
        if appeal:
            updated = bool(GenerationJob.objects.filter(id=job.id, stage=JobStage.BLOCKED, appeal_outcome="").update(
                appeal_outcome="upheld", reason=f"{job.reason.removesuffix(BLOCKED_AGAIN)} (appeal upheld: {reason})"
            ))
            if updated:
                status_on_commit(job.id)  # the same status, a new reason
        elif job.stage == JobStage.REVIEW:
            # The decision is the moderator's: the job says so, in the moderator's words (not as
            # the check that held it).
            updated = move(job.id, JobStage.REVIEW, JobStage.BLOCKED, reason=reason, finished_at=timezone.now(),
                           blocked_stage="human")
        else:
            raise CaseNotOpen(f"a {job.status} job is not waiting for review")
        if not updated:
            raise CaseNotOpen("the case was decided meanwhile")
        _verdict(job, "block", reviewer, notes, reason)
    return "upheld" if appeal else "rejected"


def reject_delivered(image: GeneratedImage, reviewer, notes: str = "") -> int:
    """An image already delivered is taken down everywhere it is shared, and each job that
    showed it goes done -> blocked (a compare-and-set: a job deleted or blocked meanwhile is left)."""
    with transaction.atomic():
        root = image.source_key or image.storage_key  # converted copies (other formats) share the pixels
        sharing = list(GeneratedImage.objects.select_related("job").filter(
            Q(storage_key=root) | Q(source_key=root), tier="public"))
        count = take_down(sharing)
        for other in sharing:
            _verdict(other.job, "block", reviewer, notes, "image rejected by a moderator after delivery", image=other)
            move(other.job_id, JobStage.DONE, JobStage.BLOCKED, blocked_stage="human",
                 reason=notes or "an image was rejected by a moderator")
    return count


def appeal(job: GenerationJob, note: str) -> None:
    """The owner of a blocked job asks once for a human decision."""
    if job.status != JobStatus.BLOCKED:
        raise ReviewError(f"only a blocked job can be appealed (this one is {job.status})")
    updated = GenerationJob.objects.filter(id=job.id, stage=JobStage.BLOCKED, appealed_at__isnull=True).update(
        appealed_at=timezone.now(), appeal_note=note
    )
    if not updated:
        raise ReviewError("this job was already appealed")
