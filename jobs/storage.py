"""Where image bytes go: public storage for delivered images, private quarantine for the rest."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage, Storage, default_storage

_quarantine: Storage | None = None


def public_storage() -> Storage:
    return default_storage


def quarantine_storage() -> Storage:
    global _quarantine
    if _quarantine is None:
        _quarantine = FileSystemStorage(location=settings.VAR_DIR / "quarantine", base_url=None)
    return _quarantine


@dataclass(frozen=True)
class StoredObject:
    key: str
    sha256: str
    byte_size: int


def new_image_key() -> str:
    # Unguessable and never reused: an object under a key never changes, so it can be cached forever.
    return f"i/{secrets.token_hex(16)}.png"


def store_bytes(data: bytes, storage: Storage) -> StoredObject:
    key = new_image_key()
    saved = storage.save(key, ContentFile(data))
    return StoredObject(key=saved, sha256=hashlib.sha256(data).hexdigest(), byte_size=len(data))


def delete_quietly(key: str, storage: Storage) -> None:
    try:
        storage.delete(key)
    except Exception:
        pass


def image_url(key: str) -> str:
    return public_storage().url(key)
