"""Taking delivered images down (a moderator's rejection, the owner's deletion) and deleting a job.

The public object is deleted (when no other row shares it through the request-hash cache), its
URL stops serving, the CDN purge hook is called after commit, and the request-hash cache can no
longer point at it (it serves only public images).
"""

from __future__ import annotations

import logging
from functools import partial

from django.db import transaction

from jobs import cdn
from jobs.models import GeneratedImage, GenerationJob
from jobs.storage import delete_quietly, image_url, quarantine_storage, unpublish_object

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
    """The owner deletes a job: cancelled first if it has not finished, its images' public
    objects purged, private copies deleted when nothing else points at them, then the row."""
    from jobs.actions.lifecycle import cancel_job

    if not job.is_terminal:
        cancel_job(job)
    images = list(job.images.all())
    private_keys = [im.storage_key for im in images if im.tier == "quarantine"]
    with transaction.atomic():
        take_down(images, keep_private_copy=False)
        job.delete()
    for key in private_keys:
        if not GeneratedImage.objects.filter(storage_key=key, tier="quarantine").exists():
            delete_quietly(key, quarantine_storage())
