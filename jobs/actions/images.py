"""Taking delivered images down (a moderator's rejection, the owner's deletion) and deleting a job.

The public object is deleted (when no other row shares it through the request-hash cache), its
URL stops serving, the CDN purge hook is called after commit, and the request-hash cache can no
longer point at it (it serves only public images).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import partial

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.media import cdn
from jobs.media.storage import delete_quietly, image_url, quarantine_storage, unpublish_object
from jobs.models import GeneratedImage, GenerationJob

log = logging.getLogger(__name__)


def take_down(images: list[GeneratedImage], keep_private_copy: bool = True) -> int:
    """Unpublish images (public -> quarantine, or -> deleted); returns how many were public.
    Each is a compare-and-set on the tier, so a second call does nothing."""
    urls = []
    for image in images:
        to = "quarantine" if keep_private_copy else "deleted"
        if not GeneratedImage.objects.filter(id=image.id, tier="public").update(tier=to):
            continue
        urls.append(image_url(image.storage_key))
        if not GeneratedImage.objects.filter(storage_key=image.storage_key, tier="public").exists():
            transaction.on_commit(partial(unpublish_object, image.storage_key, keep_private_copy))
    if urls:
        transaction.on_commit(lambda: cdn.purge(urls))
    return len(urls)


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
