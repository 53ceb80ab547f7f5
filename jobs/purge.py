"""Taking delivered images down: a moderator's rejection or the owner's deletion.

The public object is deleted (when no other row shares it through the request-hash cache),
its URL stops serving, the CDN purge hook is called, and the request-hash cache can no longer
point at it. Rows and verdicts stay, so the decision remains explainable.
"""

from __future__ import annotations

import logging

from django.db import transaction

from jobs import cdn
from jobs.models import GeneratedImage
from jobs.storage import delete_quietly, image_url, public_storage, quarantine_storage

log = logging.getLogger(__name__)


def _move_to_quarantine(image: GeneratedImage) -> None:
    """Keep the bytes for moderators, privately; then drop the public copy if unshared."""
    storage = public_storage()
    shared = GeneratedImage.objects.filter(storage_key=image.storage_key, tier="public").exclude(id=image.id).exists()
    try:
        with storage.open(image.storage_key, "rb") as f:
            data = f.read()
        if not quarantine_storage().exists(image.storage_key):
            from django.core.files.base import ContentFile

            quarantine_storage().save(image.storage_key, ContentFile(data))
    except Exception:
        log.warning("could not keep a private copy of %s", image.storage_key, exc_info=True)
    if not shared:
        delete_quietly(image.storage_key, storage)


def take_down(images: list[GeneratedImage], keep_private_copy: bool = True) -> int:
    """Unpublish images; returns how many were public. Safe to call twice."""
    urls = []
    for image in images:
        if image.tier != "public":
            continue
        url = image_url(image.storage_key)
        if keep_private_copy:
            _move_to_quarantine(image)
        else:
            shared = GeneratedImage.objects.filter(storage_key=image.storage_key).exclude(id=image.id).exists()
            if not shared:
                delete_quietly(image.storage_key, public_storage())
        GeneratedImage.objects.filter(id=image.id).update(tier="quarantine" if keep_private_copy else "deleted")
        urls.append(url)
    transaction.on_commit(lambda: cdn.purge(urls))
    return len(urls)
