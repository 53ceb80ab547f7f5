"""The publish stage (io queue): a judged batch's outcome made real.

For each job still running in the batch: the worst image decides (block > review > allow; a
gate error fails the job, nothing delivered). A done job's images move from quarantine to
public storage by a server-side copy, before the transaction that marks them public, so a
public URL never points at missing bytes; held and blocked images stay private. Then one
transaction sets every job's status (compare-and-set), and after it commits: the request-hash
cache entries, the final events (actions), the metrics.

A done clip (a video job's row: its frames side by side in quarantine) is packaged here, off the
GPU worker: an MP4 with its content credentials, a poster, a sprite sheet and HLS
(jobs/media/video.py), each an immutable public object under `v/<row id>/`, written once (a
duplicate run finds them and writes nothing); the row then names the MP4 and lists the rest in its
`media`, in the transaction that makes it public. Held and blocked clips stay the private strip.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from django.utils import timezone

from imagegen import metrics, stage_table
from jobs import actions
from jobs.media import cache
from jobs.media.clips import publish_clip
from jobs.media.storage import delete_quietly, publish_object, quarantine_storage, unpublish_object
from jobs.models import Batch, BatchStage, GeneratedImage, GenerationJob, JobStatus
from jobs.pipeline import stages
from scheduling import costs

log = logging.getLogger(__name__)


def _outcome(job: GenerationJob, images: list[GeneratedImage], verdicts: dict, gate_error: str) -> actions.Outcome:
    if gate_error:
        return actions.Outcome(str(job.id), job.attempts, JobStatus.FAILED, "",
                               f"the image safety check failed, nothing was delivered: {gate_error}")
    if any(image.id not in verdicts for image in images):  # never deliver an image the gate did not judge
        return actions.Outcome(str(job.id), job.attempts, JobStatus.FAILED, "",
                               "the image safety check has no verdict for an image; nothing was delivered")
    judged = [verdicts[image.id] for image in images]
    for decision, status in (("block", JobStatus.BLOCKED), ("review", JobStatus.REVIEW)):
        worst = next((v for v in judged if v.decision == decision), None)
        if worst is not None:
            return actions.Outcome(str(job.id), job.attempts, status, stage_table.hold("image"), worst.reason)
    return actions.Outcome(str(job.id), job.attempts, JobStatus.DONE, "", "")


def publish(batch_id: str) -> list[str]:
    """Returns the ids of the jobs this run finished (none for a duplicate or stale run)."""
    return stages.run("publish", batch_id, lambda run: _publish(batch_id, run)) or []


def _publish(batch_id: str, run: str) -> list[str]:
    from safety.models import SafetyVerdict

    batch = Batch.objects.filter(id=batch_id, stage=BatchStage.PUBLISH).first()
    if batch is None:
        return []  # published already, or not judged yet
    images = actions.live_images(batch)
    by_job: dict[str, list[GeneratedImage]] = defaultdict(list)
    jobs: dict[str, GenerationJob] = {}
    for image in images:
        by_job[str(image.job_id)].append(image)
        jobs[str(image.job_id)] = image.job
    verdicts = {v.image_id: v for v in SafetyVerdict.objects.filter(image__in=images, stage="image")}
    outcomes = [_outcome(jobs[j], by_job[j], verdicts, batch.gate_error) for j in jobs]
    done = {o.job_id for o in outcomes if o.status == JobStatus.DONE}
    clips: dict = {}  # a done clip's row id -> its fields once packaged
    for image in images:
        if str(image.job_id) in done:
            if image.job.frames > 1:
                clips[image.id] = publish_clip(image, image.job)
            else:
                publish_object(image.storage_key)
    now = timezone.now()
    _record_overhead(batch, [jobs[o.job_id] for o in outcomes], now)  # before the commit a watcher sees
    result = actions.finish_batch(batch_id, run, outcomes, now, clips)
    if result is None:
        return []  # another run finished the batch, or took this one's lease: touch nothing
    finished, dropped = result
    for image in images:
        if str(image.job_id) in dropped:  # seen cancelled under this run's lock
            if image.id in clips:
                for key in clips[image.id]["media"]["files"]:
                    unpublish_object(key, keep_private_copy=False)
            elif str(image.job_id) in done:
                unpublish_object(image.storage_key, keep_private_copy=False)
            else:
                delete_quietly(image.storage_key, quarantine_storage())
    for image in images:  # a published clip's strip has done its work (its frames are the files now)
        if image.id in clips and str(image.job_id) in set(finished) - dropped:
            delete_quietly(image.storage_key, quarantine_storage())
    delivered = list(GenerationJob.objects.filter(id__in=finished).prefetch_related("images"))
    for job in delivered:
        if job.frames == 1:  # a clip's files are not cached (jobs/pipeline/submit.py)
            cache.remember(job)
        if job.status == JobStatus.DONE and job.finished_at is not None:
            metrics.observe("imagegen_submit_to_done_seconds", (job.finished_at - job.created_at).total_seconds())
    return finished


def _record_overhead(batch: Batch, jobs: list[GenerationJob], now) -> None:
    """Feed the estimate the time each first-attempt job spends after its pass: the hand-off,
    the image gate and publishing. (The claim is not in it: the GPU worker takes and claims the
    next batch while the current one denoises, so the claim is hidden behind a pass.)"""
    if batch.finished_at is None:
        return
    samples = [(now - batch.finished_at).total_seconds() for job in jobs if job.attempts == 1]
    try:
        costs.record_overhead([max(0.0, s) for s in samples])
    except Exception:
        log.warning("overhead not recorded", exc_info=True)
