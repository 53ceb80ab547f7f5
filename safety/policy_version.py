"""The safety policy's version, read cheaply (no filter or embedder load) for cache keys."""

from __future__ import annotations

import json
import os
from functools import lru_cache

from django.conf import settings


def policy_path() -> str:
    return os.environ.get("IMAGEGEN_SAFETY_POLICY") or settings.IMAGEGEN_SAFETY_POLICY


@lru_cache(maxsize=4)
def _version(path: str, mtime: float) -> str:
    with open(path) as f:
        return str(json.load(f)["version"])


def policy_version() -> str:
    path = policy_path()
    return _version(path, os.path.getmtime(path))
