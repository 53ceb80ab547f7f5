"""Taking delivered images down (a moderator's rejection, the owner's deletion) and deleting a job.

The row leaves the public tier and, when no other row shares its object through the
request-hash cache, an outbox row (PendingUnpublish) is written in the same transaction. After
commit the public object is deleted and its URLs purged from the CDN; a failed attempt stays in
the outbox and is retried with backoff (`drain_unpublish`, the io queue's upkeep) until the
object is gone. The request-hash cache can no longer point at it (it serves only public images).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import partial

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.media import cdn
from jobs.media.storage import delete_quietly, image_url, quarantine_storage, remove_public
from jobs.models import GeneratedImage, GenerationJob, PendingUnpublish

log = logging.getLogger(__name__)


def take_down(images: list[GeneratedImage], keep_private_copy: bool = True) -> int:
    """Unpublish images (public -> quarantine, or -> deleted); returns how many were public.
    Each is a compare-and-set on the tier, so a second call does nothing."""
    taken = 0
    outbox: list[int] = []
    for image in images:
        to = "quarantine" if keep_private_copy else "deleted"
        if not GeneratedImage.objects.filter(id=image.id, tier="public").update(tier=to):
            continue
        taken += 1
        if not GeneratedImage.objects.filter(storage_key=image.storage_key, tier="public").exists():
            # A clip's every file goes (each kept privately too, so a moderator's approval puts them back).
            for key in (image.media or {}).get("files") or [image.storage_key]:
                row = PendingUnpublish.objects.create(storage_key=key, keep_private_copy=keep_private_copy,
                                                      urls=[image_url(key)])
                outbox.append(row.id)
    if outbox:
        transaction.on_commit(partial(drain_unpublish, outbox), robust=True)  # the upkeep retries what fails
    return taken


def _backoff(attempts: int) -> timedelta:
    """IMAGEGEN_UNPUBLISH_RETRY_BACKOFF (10 s), doubling up to an hour between attempts: never given up."""
    from django.conf import settings

    return timedelta(seconds=min(3600.0, settings.IMAGEGEN_UNPUBLISH_RETRY_BACKOFF * 2 ** max(0, attempts - 1)))


def drain_unpublish(ids: list[int] | None = None, limit: int = 200) -> dict:
    """Delete the public objects of the take-downs in the outbox (those named, else those due),
    then purge their URLs; a row goes once its object is gone, a failure waits its backoff.
    Never raises. A row whose object is public again for another row (a moderator approved it
    meanwhile) is dropped without a delete."""
    due = PendingUnpublish.objects.all()
    due = due.filter(id__in=ids) if ids is not None else due.filter(next_attempt_at__lte=timezone.now())
    removed = failed = 0
    for row in list(due[:limit]):
        if GeneratedImage.objects.filter(storage_key=row.storage_key, tier="public").exists():
            PendingUnpublish.objects.filter(id=row.id).delete()
            continue
        try:
            remove_public(row.storage_key, row.keep_private_copy)
        except Exception as exc:
            failed += 1
            attempts = row.attempts + 1
            log.warning("could not take %s down (attempt %d); retrying", row.storage_key, attempts, exc_info=True)
            PendingUnpublish.objects.filter(id=row.id).update(
                attempts=attempts, last_error=f"{type(exc).__name__}: {exc}"[:2000],
                next_attempt_at=timezone.now() + _backoff(attempts))
            continue
        PendingUnpublish.objects.filter(id=row.id).delete()
        removed += 1
        cdn.purge(list(row.urls))  # retried on the io queue when the hook fails
    return {"removed": removed, "failed": failed}


def reconcile_public(grace_seconds: float, limit: int = 1000) -> int:
    """Put in the outbox every public image object no public row points at (a take-down whose
    outbox row was lost, an object left by a crash), older than `grace_seconds` (a publish copies
    the object before the transaction that makes its row public). Returns how many."""
    from jobs.media.storage import public_image_keys

    queued = 0
    for key in public_image_keys(timezone.now() - timedelta(seconds=grace_seconds)):
        if queued >= limit:
            break
        rows = GeneratedImage.objects.filter(storage_key=key)
        if rows.filter(tier="public").exists() or PendingUnpublish.objects.filter(storage_key=key).exists():
            continue
        PendingUnpublish.objects.create(storage_key=key, keep_private_copy=rows.filter(tier="quarantine").exists(),
                                        urls=[image_url(key)])
        queued += 1
    if queued:
        log.warning("reconciliation: %d public object(s) whose rows are not public, taken down", queued)
    return queued


def delete_job(job: GenerationJob) -> None:
    """The owner deletes a job: cancelled first if it has not finished, gone from the owner's
    view, its public objects purged. Its safety record stays: the verdicts, the quarantined
    images (evidence of what was held or blocked) and a pending appeal, which moderators still
    decide; retention purges it after IMAGEGEN_SAFETY_RECORD_DAYS (purge_deleted)."""
    from jobs.actions.lifecycle import cancel_job

    if not job.is_terminal:
        cancel_job(job)
    with transaction.atomic():
        if not GenerationJob.objects.filter(id=job.id, deleted_at=None).update(deleted_at=timezone.now()):
            return  # deleted already
        take_down([im for im in job.images.all() if im.tier == "public"], keep_private_copy=False)


def purge_deleted(older_than_days: float, limit: int = 500) -> int:
    """Retention: jobs deleted longer ago than the safety record's retention, whose appeal (if
    any) is decided, go for good with their rows and private bytes. Returns how many."""
    from jobs.models import JobStatus

    cutoff = timezone.now() - timedelta(days=older_than_days)
    due = (GenerationJob.objects.filter(deleted_at__lt=cutoff)
           .exclude(status=JobStatus.BLOCKED, appealed_at__isnull=False, appeal_outcome="")[:limit])
    purged = 0
    for job in due:
        keys = [im.storage_key for im in job.images.all() if im.tier == "quarantine"]
        with transaction.atomic():
            if not GenerationJob.objects.filter(id=job.id, deleted_at__lt=cutoff).delete()[0]:
                continue
        purged += 1
        for key in keys:
            if not GeneratedImage.objects.filter(storage_key=key).exists():
                delete_quietly(key, quarantine_storage())
    return purged


def record_views(counts: dict[str, int]) -> int:
    """Views counted in Redis since the last flush, added to every row sharing each object."""
    total = 0
    for key, n in counts.items():
        if n > 0:
            GeneratedImage.objects.filter(storage_key=key).update(views=F("views") + n)
            total += n
    return total


def mark_cold(key: str) -> bool:
    return bool(GeneratedImage.objects.filter(storage_key=key, tier="public", bytes_dropped=False).update(cold=True))


def mark_warm(key: str) -> bool:
    return bool(GeneratedImage.objects.filter(storage_key=key, cold=True).update(cold=False))


def mark_bytes_dropped(key: str) -> None:
    GeneratedImage.objects.filter(storage_key=key, tier="public").update(bytes_dropped=True)


def settle_regeneration(original: GeneratedImage, made: GeneratedImage) -> bool:
    """Every row that shared a dropped object: restored from a regeneration whose pixels and
    metadata came out byte for byte the same under their content credentials (True), or lost
    for good when they did not (False)."""
    with transaction.atomic():
        same = GeneratedImage.objects.select_for_update().filter(
            storage_key=original.storage_key, sha256=original.sha256, bytes_dropped=True, lost=False
        )
        # The bytes under the content credentials (their salts and signature differ each time).
        if (made.content_sha256 or made.sha256) == (original.content_sha256 or original.sha256):
            same.update(storage_key=made.storage_key, byte_size=made.byte_size, sha256=made.sha256,
                        content_sha256=made.content_sha256, bytes_dropped=False, cold=False)
            return True
        same.update(lost=True)
        return False
