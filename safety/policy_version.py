"""The safety policy's version, read cheaply (no filter or embedder load), and the prompt gate's
identity for cache keys.

The version string names the policy in verdict records; the cache key binds the gate itself
(`policy_identity`): the whole policy file's bytes, whether the semantic check is on, and the
fingerprints (whole files) of the embedding model and of the policy's classifier head. A policy
edited without a version bump, another embedder or a retrained head is another gate, so an
image it never judged is not served from the cache. The policy file is hashed again whenever its
size or mtime changes; the model files once per process (safety.gate_identity).
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache

from django.conf import settings

from safety.gate_identity import fingerprint


def policy_path() -> str:
    return os.environ.get("IMAGEGEN_SAFETY_POLICY") or settings.IMAGEGEN_SAFETY_POLICY


@lru_cache(maxsize=4)
def _version(path: str, mtime: float) -> str:
    with open(path) as f:
        return str(json.load(f)["version"])


def policy_version() -> str:
    path = policy_path()
    return _version(path, os.path.getmtime(path))


def _embeddings_on() -> bool:
    return os.environ.get("IMAGEGEN_SAFETY_EMBEDDINGS", "1").strip().lower() not in ("0", "false", "no", "off")


@lru_cache(maxsize=4)
def _embedder_identity(model_dir_env: str) -> str:
    from safety.embeddings import MAX_SEQ_LENGTH, EmbeddingModelError, default_model_dir

    try:
        model_dir = default_model_dir()
    except EmbeddingModelError:
        return "absent"
    return f"minilm:{MAX_SEQ_LENGTH}:{fingerprint(model_dir)}"


@lru_cache(maxsize=8)
def _identity(path: str, size: int, mtime_ns: int, embeddings: bool, model_dir_env: str) -> str:
    from safety.prompt_semantic import MODELS_DIR

    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data)
    if embeddings:
        try:
            head = json.loads(data).get("prompt_head", "prompt-head-v2")
        except ValueError:
            head = ""
        digest.update(f"|embedder={_embedder_identity(model_dir_env)}".encode())
        digest.update(f"|head={head}:{fingerprint(MODELS_DIR / head) if head else 'absent'}".encode())
    else:
        digest.update(b"|rules-only")
    return digest.hexdigest()[:24]


def policy_identity() -> str:
    """The prompt gate as configured now: what the request-hash cache binds."""
    path = policy_path()
    stat = os.stat(path)
    return _identity(path, stat.st_size, stat.st_mtime_ns, _embeddings_on(),
                     os.environ.get("IMAGEGEN_EMBEDDING_MODEL_DIR", ""))
