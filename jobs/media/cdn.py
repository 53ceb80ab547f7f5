"""The CDN purge hook: called with the public URLs of objects that were deleted.

Pluggable: IMAGEGEN_CDN_PURGE_HOOK names a function "module:function" taking a list of URLs.
Shipped hooks:

- ``jobs.media.cdn:log_purge`` (the embedded default): logs the URLs; there is no CDN in front of
  the local folder, and the local view stops serving a deleted key at once.
- ``jobs.media.cdn:http_purge``: sends ``IMAGEGEN_CDN_PURGE_METHOD`` (default PURGE) to each URL, the
  way Varnish, Fastly and many CDNs accept single-URL purges. ``IMAGEGEN_CDN_PURGE_TOKEN``, when
  set, goes in the ``IMAGEGEN_CDN_PURGE_HEADER`` header (default ``Fastly-Key``).
- ``jobs.media.cdn:cloudfront_invalidate``: a CloudFront invalidation of the URLs' paths in
  ``IMAGEGEN_CDN_CLOUDFRONT_DISTRIBUTION_ID``.

A hook that fails is retried on the io queue (``jobs.media.cdn.retry_purge``, bounded), so a taken
down image never stays cached at the edge because of one failed call.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
import urllib.request
from urllib.parse import urlsplit

from celery import shared_task
from django.conf import settings

log = logging.getLogger(__name__)


def log_purge(urls: list[str]) -> None:
    for url in urls:
        log.info("cdn purge %s", url)


def _setting(name: str, default: str = "") -> str:
    return str(getattr(settings, name, None) or os.environ.get(name) or default)


def http_purge(urls: list[str]) -> None:
    method = _setting("IMAGEGEN_CDN_PURGE_METHOD", "PURGE")
    token = _setting("IMAGEGEN_CDN_PURGE_TOKEN")
    header = _setting("IMAGEGEN_CDN_PURGE_HEADER", "Fastly-Key")
    for url in urls:
        request = urllib.request.Request(url, method=method)
        if token:
            request.add_header(header, token)
        with urllib.request.urlopen(request, timeout=10) as response:
            if response.status >= 400:  # pragma: no cover - urlopen raises on 4xx/5xx
                raise RuntimeError(f"purge of {url} answered {response.status}")


def cloudfront_invalidate(urls: list[str]) -> None:
    import boto3

    distribution = _setting("IMAGEGEN_CDN_CLOUDFRONT_DISTRIBUTION_ID")
    if not distribution:
        raise RuntimeError("IMAGEGEN_CDN_CLOUDFRONT_DISTRIBUTION_ID is not set")
    paths = sorted({urlsplit(url).path or "/" for url in urls})
    boto3.client("cloudfront").create_invalidation(
        DistributionId=distribution,
        InvalidationBatch={"Paths": {"Quantity": len(paths), "Items": paths}, "CallerReference": f"imagegen-{time.time_ns()}"},
    )


def _hook():
    spec = settings.IMAGEGEN_CDN_PURGE_HOOK
    module_name, _, func_name = spec.partition(":")
    return getattr(importlib.import_module(module_name), func_name)


def purge(urls: list[str]) -> None:
    """Call the purge hook; on failure, log and retry later on the io queue. Never raises: the
    bytes are already gone from the origin when this runs."""
    if not urls:
        return
    try:
        _hook()(list(urls))
    except Exception:
        log.exception("cdn purge of %d url(s) failed; retrying on the io queue", len(urls))
        try:
            retry_purge.apply_async(args=[list(urls)], countdown=10)
        except Exception:
            log.exception("could not queue the cdn purge retry: %s", urls)


class PurgeFailed(Exception):
    """The purge hook raised: Celery retries the purge (autoretry_for), backing off."""


@shared_task(name="jobs.media.cdn.retry_purge", autoretry_for=(PurgeFailed,), retry_backoff=30, retry_backoff_max=3600,
             retry_jitter=True, max_retries=8)
def retry_purge(urls: list[str]) -> None:
    """A purge that failed, again: 30 s, doubling up to an hour apart, 8 times (about 4 hours)."""
    try:
        _hook()(list(urls))
    except Exception as exc:  # any error of a pluggable hook: retried by Celery, never lost silently
        raise PurgeFailed(f"{type(exc).__name__}: {exc}") from exc
