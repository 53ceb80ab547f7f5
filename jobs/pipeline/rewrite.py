"""The prompt rewriter's identity and a request's choice of it (the `rewrite` stage; its
worker side is gpu_tasks/rewriter.py and gpu_tasks/tasks.py).

A job's rewriter identity is the configured rewriter's folder name, the hash of its files and
its decoding settings. It is part of the request-hash cache key (jobs/media/cache.py), so a
cached image is reused only by a request the same rewriter would have rewritten the same way,
and it is recorded on the job with the prompt the rewriter wrote.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from django.conf import settings

# How the rewriter decodes (greedy, a bounded output) and the version of the nearest-drawable
# mapping around it (gpu_tasks/nearest.py VERSION: a test holds the two equal): part of its
# identity, so an image cached under an older mapping is not reused.
MAX_NEW_TOKENS = 32
NEAREST_VERSION = "1"
DECODING = f"greedy;max_new_tokens={MAX_NEW_TOKENS};nearest={NEAREST_VERSION}"
MODES = ("auto", "on", "off")


def model_version(path: str | Path) -> str:
    """A hash of every file of the model folder (weights, configuration, tokenizer)."""
    h = hashlib.sha256()
    root = Path(path)
    for f in sorted(p for p in root.rglob("*") if p.is_file() and p.name != "training_info.json"):
        h.update(f.relative_to(root).as_posix().encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


@lru_cache(maxsize=4)
def _identity_of(path: str) -> str:
    return f"{Path(path).name}@{model_version(path)};{DECODING}"


def identity(path: str | None = None) -> str:
    """The configured rewriter's identity ("" when none is configured). Read once per process."""
    path = path if path is not None else settings.IMAGEGEN_REWRITER_PATH
    return _identity_of(str(path)) if path else ""


def configured() -> bool:
    return bool(settings.IMAGEGEN_REWRITER_PATH)


def wanted(mode: str | None) -> bool:
    """Whether a request's `rewrite` choice (auto, on, off; None: auto) sends its prompt through
    the rewriter: auto follows IMAGEGEN_REWRITE_DEFAULT, and nothing is rewritten where no
    rewriter is configured (the serializer refuses an explicit `on` there)."""
    if not configured() or mode == "off":
        return False
    return mode == "on" or settings.IMAGEGEN_REWRITE_DEFAULT == "on"
