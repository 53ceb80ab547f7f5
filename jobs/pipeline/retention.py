"""Retention tiers: hot -> cold -> bytes dropped (regenerated on demand).

Views are counted cheaply: ``count_view(storage_key)`` is one Redis HINCRBY in the serving path
(the local image view); with S3 behind a CDN the bucket is never hit per view, so views come
from the CDN's (or the bucket's) access logs: a log job calls ``add_views({storage_key: n})``.
``run_retention`` (periodic, io queue) first flushes the counters into GeneratedImage.views,
then:

1. **cold**: delivered images older than IMAGEGEN_HOT_DAYS with fewer than
   IMAGEGEN_COLD_MAX_VIEWS views. On S3 the object is copied onto itself with the storage class
   IMAGEGEN_S3_COLD_STORAGE_CLASS (same key, so the URL and the CDN's copy stay valid); locally
   only the flag changes. A cold image that reaches the view threshold again is warmed back.
2. **bytes dropped** (only with IMAGEGEN_DROP_COLD_BYTES): cold images older than
   IMAGEGEN_DROP_AFTER_DAYS, still under the view threshold, whose model version is the one
   served (so they can be regenerated): the object is deleted and the CDN purged; the row and
   its verdicts stay (bytes_dropped=True). See jobs/pipeline/regenerate.py.

Rows that share one object (request-hash cache hits) move together: an object changes tier only
when every delivered row pointing at it qualifies. Views are counted per object and added to
every row that points at it.
"""

from __future__ import annotations

import logging
import secrets
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from imagegen.redis_client import PREFIX, get_redis
from jobs import actions
from jobs.actions import purge_deleted
from jobs.media import cdn
from jobs.media.storage import image_url, is_s3, public_storage, s3_location
from jobs.models import GeneratedImage

log = logging.getLogger(__name__)

VIEWS_KEY = f"{PREFIX}views"
FLUSHING_KEY = f"{PREFIX}views:flushing"
LOCK_KEY = f"{PREFIX}retention:lock"


def count_view(image_key: str) -> None:
    """One view of the object under storage key ``image_key`` (e.g. "i/<hex>.png"). Never raises:
    a lost count must not fail serving the image."""
    try:
        get_redis().hincrby(VIEWS_KEY, image_key, 1)
    except Exception:
        log.debug("view of %s not counted", image_key, exc_info=True)


def add_views(counts: dict[str, int]) -> None:
    """Views from elsewhere (CDN or S3 access logs): {storage key: views}."""
    pipe = get_redis().pipeline()
    for key, n in counts.items():
        if n:
            pipe.hincrby(VIEWS_KEY, key, int(n))
    pipe.execute()


def flush_views() -> int:
    """Move the Redis counters into GeneratedImage.views; returns the views flushed. A crash
    between the rename and the update leaves FLUSHING_KEY behind, and the next run applies it."""
    r = get_redis()
    if not r.exists(FLUSHING_KEY):
        try:
            r.rename(VIEWS_KEY, FLUSHING_KEY)
        except Exception:  # no counters since the last flush
            return 0
    counts = r.hgetall(FLUSHING_KEY)
    total = actions.record_views({key: int(n) for key, n in counts.items()})
    r.delete(FLUSHING_KEY)
    return total


def _set_storage_class(key: str, storage_class: str) -> None:
    """S3: rewrite the object in place with another storage class (same key, same headers)."""
    storage: Any = public_storage()  # an S3Storage: retention tiers are for S3
    bucket, name = s3_location(storage, key)
    params = {"ContentType": "image/png", **storage.get_object_parameters(name)}
    if storage.default_acl:
        params["ACL"] = storage.default_acl
    storage.connection.meta.client.copy_object(
        Bucket=bucket, Key=name, CopySource={"Bucket": bucket, "Key": name},
        StorageClass=storage_class, MetadataDirective="REPLACE", **params,
    )


def _keys_where_all_rows(candidates, blockers, limit: int) -> list[str]:
    keys = list(candidates.values_list("storage_key", flat=True).distinct()[: limit * 4])
    if not keys:
        return []
    blocked = set(blockers.filter(storage_key__in=keys).values_list("storage_key", flat=True))
    return [k for k in keys if k not in blocked][:limit]


def move_to_cold(now=None) -> int:
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.IMAGEGEN_HOT_DAYS)
    max_views = settings.IMAGEGEN_COLD_MAX_VIEWS
    live = GeneratedImage.objects.filter(tier="public", bytes_dropped=False)
    keys = _keys_where_all_rows(
        live.filter(cold=False, created_at__lt=cutoff, views__lt=max_views),
        live.filter(Q(created_at__gte=cutoff) | Q(views__gte=max_views)),
        settings.IMAGEGEN_RETENTION_BATCH,
    )
    s3 = is_s3(public_storage())
    moved = 0
    for key in keys:
        if s3:
            try:
                _set_storage_class(key, settings.IMAGEGEN_S3_COLD_STORAGE_CLASS)
            except Exception:
                log.warning("could not move %s to %s; next run retries", key,
                            settings.IMAGEGEN_S3_COLD_STORAGE_CLASS, exc_info=True)
                continue
        moved += actions.mark_cold(key)
    return moved


def warm_up() -> int:
    """Cold objects that became popular again go back to the standard class."""
    keys = list(
        GeneratedImage.objects.filter(tier="public", cold=True, bytes_dropped=False,
                                      views__gte=settings.IMAGEGEN_COLD_MAX_VIEWS)
        .values_list("storage_key", flat=True).distinct()[: settings.IMAGEGEN_RETENTION_BATCH]
    )
    s3 = is_s3(public_storage())
    warmed = 0
    for key in keys:
        if s3:
            try:
                _set_storage_class(key, "STANDARD")
            except Exception:
                log.warning("could not warm %s; next run retries", key, exc_info=True)
                continue
        warmed += actions.mark_warm(key)
    return warmed


def drop_cold_bytes(now=None) -> int:
    """Delete the bytes of the regenerable cold tail; rows and verdicts stay."""
    if not settings.IMAGEGEN_DROP_COLD_BYTES:
        return 0
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.IMAGEGEN_DROP_AFTER_DAYS)
    max_views = settings.IMAGEGEN_COLD_MAX_VIEWS
    live = GeneratedImage.objects.filter(tier="public", bytes_dropped=False)
    keys = _keys_where_all_rows(
        live.filter(cold=True, created_at__lt=cutoff, views__lt=max_views,
                    job__model_version=settings.IMAGEGEN_MODEL_VERSION, job__status="done"),
        live.filter(Q(cold=False) | Q(created_at__gte=cutoff) | Q(views__gte=max_views)
                    | ~Q(job__model_version=settings.IMAGEGEN_MODEL_VERSION) | ~Q(job__status="done")),
        settings.IMAGEGEN_RETENTION_BATCH,
    )
    storage = public_storage()
    urls = []
    for key in keys:
        try:
            storage.delete(key)
        except Exception:
            log.warning("could not drop the bytes of %s; next run retries", key, exc_info=True)
            continue
        actions.mark_bytes_dropped(key)
        urls.append(image_url(key))
    cdn.purge(urls)
    return len(urls)


def apply_retention(now=None) -> dict:
    return {
        "views_flushed": flush_views(),
        "warmed": warm_up(),
        "cold": move_to_cold(now),
        "dropped": drop_cold_bytes(now),
        "deleted_records_purged": purge_deleted(settings.IMAGEGEN_SAFETY_RECORD_DAYS),
    }


@shared_task(name="jobs.pipeline.retention.run_retention")
def run_retention(now: str | None = None) -> dict:
    """Periodic (CELERY_BEAT_SCHEDULE["retention"], io queue). One run at a time across
    workers; a run that finds the lock taken does nothing."""
    from django.utils.dateparse import parse_datetime

    r = get_redis()
    token = secrets.token_hex(8)
    if not r.set(LOCK_KEY, token, nx=True, ex=3600):
        return {"skipped": True}
    try:
        result = apply_retention(parse_datetime(now) if now else None)
    finally:
        if r.get(LOCK_KEY) == token:
            r.delete(LOCK_KEY)
    if any(result.values()):
        log.info("retention: %s", result)
    return result


RECONCILED_KEY = f"{PREFIX}unpublish:reconciled"


@shared_task(name="jobs.pipeline.retention.run_unpublish")
def run_unpublish(reconcile: bool | None = None) -> dict:
    """Periodic (CELERY_BEAT_SCHEDULE["unpublish"], every IMAGEGEN_UNPUBLISH_INTERVAL, io queue):
    retry the take-downs in the outbox that are due, and at most once per
    IMAGEGEN_UNPUBLISH_RECONCILE_INTERVAL (or when `reconcile` says so) first put in the outbox
    every public object whose rows are not public (jobs.actions.reconcile_public)."""
    if reconcile is None:
        reconcile = bool(get_redis().set(RECONCILED_KEY, "1", nx=True,
                                         ex=max(1, round(settings.IMAGEGEN_UNPUBLISH_RECONCILE_INTERVAL))))
    queued = actions.reconcile_public(settings.IMAGEGEN_UNPUBLISH_RECONCILE_GRACE_SECONDS) if reconcile else 0
    result = {"reconciled": queued, **actions.drain_unpublish()}
    if result["failed"] or queued:
        log.warning("unpublish: %s", result)
    return result
