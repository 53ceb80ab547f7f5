"""Which image gate judged an image: a stable identity of the configured classifier(s), cheap to
compute without loading a model (the web process needs it for every cache lookup).

The identity is the kind and a fingerprint of the model's files (names, sizes and the whole
bytes of each, hashed once per process and again only when a file's size or mtime changes), not
its path, so the same model installed anywhere has the same identity and a
retrained one a new identity; a python: classifier is named by its class and `version`. The
request-hash cache keys on it, and serves an image only to requests that the same gate would
judge (jobs/media/cache.py).
"""

from __future__ import annotations

import hashlib
import importlib
from functools import lru_cache
from pathlib import Path

from django.conf import settings

UNCHECKED = "none"
_CHUNK = 1024 * 1024


def configured_specs(spec: str | None = None) -> list[str]:
    spec = settings.IMAGEGEN_IMAGE_CLASSIFIER if spec is None else spec
    return sorted(part.strip() for part in spec.replace(";", ",").split(",") if part.strip())


def gate_identity(spec: str | None = None) -> str:
    specs = configured_specs(spec)
    return "+".join(_identity(s) for s in specs) if specs else "unset"


def is_unchecked(identity: str) -> bool:
    return identity == UNCHECKED or identity == "unset"


@lru_cache(maxsize=32)
def _identity(spec: str) -> str:
    kind, _, arg = spec.partition(":")
    if kind == UNCHECKED:
        return UNCHECKED
    if kind == "python":
        module_name, _, rest = arg.partition(":")
        class_name, _, class_arg = rest.partition(":")
        try:
            version = getattr(getattr(importlib.import_module(module_name), class_name), "version", "")
        except Exception:  # the gate itself fails closed on it; the identity only names it
            version = "unloadable"
        return f"python:{module_name}:{class_name}:{class_arg}@{version}"
    path = Path(arg)
    if arg and path.exists():
        return f"{kind}:{_fingerprint(path)}"
    return spec


def _fingerprint(path: Path) -> str:
    """A hash of every file under `path` (or of the file): names, sizes and whole contents."""
    digest = hashlib.sha256()
    files = sorted(p for p in (path.rglob("*") if path.is_dir() else [path]) if p.is_file())
    for file in files:
        stat = file.stat()
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        digest.update(str(stat.st_size).encode())
        digest.update(_file_digest(str(file.resolve()), stat.st_size, stat.st_mtime_ns).encode())
    return digest.hexdigest()[:16]


def fingerprint(path: str | Path) -> str:
    """The fingerprint of a model file or folder, or "absent" when there is none."""
    path = Path(path)
    return _fingerprint(path) if path.exists() else "absent"


@lru_cache(maxsize=1024)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """The whole file's sha256, once per (path, size, mtime): a model's weights are read once
    per process, and a file replaced in place is read again."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
