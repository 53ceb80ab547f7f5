"""Which image gate judged an image: a stable identity of the configured classifier(s), cheap to
compute without loading a model (the web process needs it for every cache lookup).

The identity is the kind and a fingerprint of the model's files (names, sizes and the first
64 KiB of each), not its path, so the same model installed anywhere has the same identity and a
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
_HEAD_BYTES = 64 * 1024


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
    digest = hashlib.sha256()
    files = sorted(p for p in (path.rglob("*") if path.is_dir() else [path]) if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        digest.update(str(file.stat().st_size).encode())
        with open(file, "rb") as f:
            digest.update(f.read(_HEAD_BYTES))
    return digest.hexdigest()[:16]
