"""Where image bytes go: every generated image is written to private quarantine first; only the
publish stage (after an allow verdict) or a moderator's approval moves it to public storage, by
a server-side copy (`publish_object`). Nothing else in the project writes to public storage
(tests/test_pipeline_stages.py checks the source for it).

Both are entries of settings.STORAGES: "default" (public: immutable keys, long-cached URLs) and
"quarantine" (private: staff only). The embedded default is two local folders; with
IMAGEGEN_S3_BUCKET they are S3 buckets (or a bucket and a private prefix) through
django-storages (see imagegen/settings.py and docs/storage.md).
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage, Storage, default_storage, storages

log = logging.getLogger(__name__)


def public_storage() -> Storage:
    return default_storage


def quarantine_storage() -> Storage:
    """Private storage; never served by a public URL. Re-read on each call so a settings
    override (tests) or a reconfigured STORAGES takes effect."""
    if "quarantine" in settings.STORAGES:
        return storages["quarantine"]
    return FileSystemStorage(location=settings.VAR_DIR / "quarantine", base_url=None)


def is_s3(storage: Storage) -> bool:
    try:
        from storages.backends.s3 import S3Storage
    except ImportError:  # pragma: no cover - django-storages is in requirements.txt
        return False
    return isinstance(storage, S3Storage)  # default_storage is lazy: __class__ is proxied


def s3_location(storage: Any, key: str) -> tuple[str, str]:
    """(bucket, object key) of a storage key on an S3 storage (its location prefix applied)."""
    from storages.utils import clean_name

    return storage.bucket_name, storage._normalize_name(clean_name(key))


@dataclass(frozen=True)
class StoredObject:
    key: str
    sha256: str
    byte_size: int


def new_image_key(extension: str = "png") -> str:
    # Unguessable and never reused: an object under a key never changes, so it can be cached forever.
    return f"i/{secrets.token_hex(16)}.{extension}"


_TRANSIENT_S3_CODES = frozenset(
    {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "Throttling", "ThrottlingException",
     "RequestLimitExceeded", "503", "500"}
)


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: the network, a throttling or 5xx answer from the store, a local I/O error.
    Not worth it: a refusal (403), a missing bucket (404), a bad request (400)."""
    try:
        from botocore.exceptions import ClientError, HTTPClientError
        from botocore.exceptions import ConnectionError as BotoConnectionError
    except ImportError:  # pragma: no cover
        ClientError = BotoConnectionError = HTTPClientError = ()
    if ClientError and isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return code in _TRANSIENT_S3_CODES or int(status) >= 500
    if BotoConnectionError and isinstance(exc, (BotoConnectionError, HTTPClientError)):
        return True  # EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError
    if isinstance(exc, (PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    return isinstance(exc, (OSError, TimeoutError))


def store_quarantined(data: bytes, extension: str = "png") -> StoredObject:
    """Write a generated image to private quarantine storage under a new immutable key (the key
    it keeps when it is published)."""
    return store_bytes(data, quarantine_storage(), new_image_key(extension))


def store_bytes(data: bytes, storage: Storage, key: str | None = None) -> StoredObject:
    """Upload under a new immutable key, once: on S3 botocore retries transient errors itself
    (adaptive mode, IMAGEGEN_UPLOAD_ATTEMPTS in all: imagegen/settings.py); past that, or on any
    other error, the error is raised with nothing left under the key, and the caller's stage
    decides (the GPU hand-off puts the job back in its queue; a Celery stage retries through its
    row's retry options). The caller creates rows only after this returns, so there is never a
    row without bytes."""
    key = key or new_image_key()
    try:
        saved = storage.save(key, ContentFile(data))
    except Exception:
        delete_quietly(key, storage)  # never leave a half-written object behind
        raise
    return StoredObject(key=saved, sha256=hashlib.sha256(data).hexdigest(), byte_size=len(data))


def publish_once(key: str, make: Callable[[], bytes]) -> bytes:
    """Write `make()` as the public object `key` unless one is there already; returns the bytes the
    object holds (the first writer's: a clip's files are written once by the publish stage, and a
    duplicate run reads back what the first one signed, without making them again)."""
    public = public_storage()
    if public.exists(key):
        with public.open(key, "rb") as f:
            return f.read()
    data = make()
    store_bytes(data, public, key)
    return data


def _copy(key: str, source: Any, target: Any) -> None:
    """Copy an object between the two storages without passing its bytes through this process
    where the backend allows: S3 CopyObject between buckets or prefixes, a file copy on local
    storage. The target's own headers apply (public: immutable cache; private: no-store)."""
    if is_s3(source) and is_s3(target):
        src_bucket, src_key = s3_location(source, key)
        dst_bucket, dst_key = s3_location(target, key)
        extra = target._get_write_parameters(key)  # the target's Cache-Control, ACL; the key's ContentType
        target.connection.meta.client.copy_object(
            CopySource={"Bucket": src_bucket, "Key": src_key}, Bucket=dst_bucket, Key=dst_key,
            MetadataDirective="REPLACE", **extra,
        )
        return
    if isinstance(source, FileSystemStorage) and isinstance(target, FileSystemStorage):
        src, dst = Path(source.path(key)), Path(target.path(key))
        dst.parent.mkdir(parents=True, exist_ok=True)
        partial = dst.with_name(f".{dst.name}.{secrets.token_hex(4)}.part")
        shutil.copyfile(src, partial)
        os.replace(partial, dst)  # never a half-written object under the key
        return
    with source.open(key, "rb") as f:  # mixed backends: through this process
        data = f.read()
    if target.exists(key):
        target.delete(key)
    target.save(key, ContentFile(data))


def publish_object(key: str) -> None:
    """Make a quarantined object public under the same key: a server-side copy, then the private
    copy is deleted. Idempotent: a repeat after a crash finds the public copy and finishes."""
    public, private = public_storage(), quarantine_storage()
    if private.exists(key):
        _copy(key, private, public)  # a transient error: the publish stage retries (its row)
        delete_quietly(key, private)
    elif not public.exists(key):
        raise FileNotFoundError(f"{key} is in neither quarantine nor public storage")


def unpublish_object(key: str, keep_private_copy: bool = True) -> None:
    """Take a public object down: keep a private copy for moderators (server-side copy), then
    delete the public one. Idempotent."""
    public = public_storage()
    if keep_private_copy:
        _keep_private_copy(key, public)
    delete_quietly(key, public)


def _keep_private_copy(key: str, public) -> None:
    """A moderator's copy of a public object (server-side copy), best effort: a take-down
    never waits on it."""
    private = quarantine_storage()
    if public.exists(key) and not private.exists(key):
        try:
            _copy(key, public, private)
        except Exception:
            log.warning("could not keep a private copy of %s", key, exc_info=True)


def remove_public(key: str, keep_private_copy: bool = True) -> None:
    """Take a public object down for a take-down: keep a private copy for moderators when asked
    (best effort: the take-down must not wait on it), then delete the public object and check it
    is gone. Raises when it is not (the take-down's outbox row retries it). Idempotent."""
    public = public_storage()
    if keep_private_copy:
        _keep_private_copy(key, public)
    public.delete(key)
    if public.exists(key):
        raise RuntimeError(f"{key} is still in public storage after its delete")


def public_image_keys(older_than: datetime) -> Iterator[str]:
    """Every image object (keys under i/) in public storage last written before `older_than`:
    one listing on S3 (ListObjectsV2 pages), a walk of the folder locally."""
    storage: Any = public_storage()
    if is_s3(storage):
        bucket, prefix = s3_location(storage, "i/")
        strip = len(prefix) - len("i/")
        paginator = storage.connection.meta.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                if item["LastModified"] < older_than:
                    yield item["Key"][strip:]
        return
    if isinstance(storage, FileSystemStorage):
        root = Path(storage.location)
        folder = root / "i"
        if not folder.is_dir():
            return
        cutoff = older_than.timestamp()
        for path in folder.rglob("*"):
            if path.is_file() and not path.name.startswith(".") and path.stat().st_mtime < cutoff:
                yield path.relative_to(root).as_posix()


def delete_quietly(key: str, storage: Storage) -> None:
    try:
        storage.delete(key)
    except Exception:
        log.warning("could not delete %s", key, exc_info=True)


def image_url(key: str) -> str:
    return public_storage().url(key)


def media_origins() -> list[str]:
    """The origins the page may show images from besides its own: the public storage's, when
    its URLs are absolute (an S3 endpoint, a CDN domain). Read from the configured storage,
    never from a URL a client sent; the page states them in a meta tag (static/imagegen/util.js
    `safeSrc`)."""
    from urllib.parse import urlsplit

    url = urlsplit(image_url("i/probe.png"))
    if url.scheme in ("http", "https") and url.netloc:
        return [f"{url.scheme}://{url.netloc}"]
    return []


def private_url(key: str, expires: int | None = None) -> str | None:
    """A short-lived presigned URL for a quarantined object on S3, for staff tooling; None on
    local storage (use the staff view /staff/images/<id>, which works on both)."""
    storage: Any = quarantine_storage()  # an S3Storage past the check below
    if not is_s3(storage):
        return None
    return storage.url(key, expire=expires or settings.IMAGEGEN_S3_PRESIGN_SECONDS)


def storage_for_tier(tier: str) -> Storage | None:
    if tier == "public":
        return public_storage()
    if tier == "quarantine":
        return quarantine_storage()
    return None
