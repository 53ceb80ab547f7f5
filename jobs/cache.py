"""The request-hash cache: an image is a pure function of its inputs, so an identical request
reuses the stored image instead of spending the GPU again.

Key: a hash of the canonical (model version, prompt, negative prompt, width, height, steps,
guidance, scheduler, per-image seed, safety policy version), with the owner in the key for the
per-user scope. Value: the id of a stored image. An entry is served only while its image is
delivered (public tier, job done, image verdict allow) and its bytes exist; anything else is a
miss and the entry is dropped.

Scope (IMAGEGEN_CACHE_SCOPE). A shared cache is an oracle: a hit is done in the submit answer,
so anyone could test in one request whether another user asked for a given (prompt, seed).
  user             (default) an entry serves only the user whose request made it
  global-unseeded  requests without an explicit seed are shared (with IMAGEGEN_SEED_POLICY=fixed
                   that is where repeats come from); seeded ones stay per user. A hit still says
                   that someone asked for that prompt, so it suits a service whose prompts are
                   not secret from each other
  global           every entry serves everyone
Each delivered image is remembered under both keys (its owner's and the shared one), so the
scope is decided where the lookup happens and a change of setting applies at once.
"""

from __future__ import annotations

import hashlib
import json
import logging

from django.conf import settings

from imagegen.redis_client import PREFIX, get_redis
from safety.policy_version import policy_version

log = logging.getLogger(__name__)

TTL_SECONDS = 30 * 24 * 3600
HITS_KEY = f"{PREFIX}stats:cache_hits"
MISSES_KEY = f"{PREFIX}stats:cache_misses"


SCOPES = ("user", "global-unseeded", "global")


def shares(seed_given: bool) -> bool:
    """Whether a request may be served from (and seen in) the shared entries under the scope."""
    scope = settings.IMAGEGEN_CACHE_SCOPE
    return scope == "global" or (scope == "global-unseeded" and not seed_given)


def request_key(job, index: int, owner_id=None, shared: bool = False) -> str:
    canonical = {
        "model": job.model_version,
        "prompt": job.prompt,
        "negative_prompt": job.negative_prompt,
        "width": job.width,
        "height": job.height,
        "steps": job.steps,
        "guidance": round(float(job.guidance_scale), 4),
        "scheduler": job.scheduler,
        "seed": int(job.seed) + index,
        "policy": policy_version(),
    }
    if not shared:
        canonical["owner"] = owner_id if owner_id is not None else job.owner_id
    digest = hashlib.sha256(json.dumps(canonical, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return f"{PREFIX}rc:{digest}"


def _servable(image_id: str):
    from jobs.models import GeneratedImage
    from jobs.storage import public_storage

    image = GeneratedImage.objects.select_related("job").filter(id=image_id, tier="public", job__status="done", bytes_dropped=False, lost=False).first()
    if image is None:
        return None
    if image.verdicts.filter(stage="image").exclude(decision="allow").exists():
        return None
    if not image.verdicts.filter(stage__in=["image", "human"], decision="allow").exists():
        return None
    if not public_storage().exists(image.storage_key):
        return None
    return image


def lookup(job, shared: bool = False) -> dict[int, object]:
    """index -> a servable cached image, for the indices that hit: the owner's own entries,
    and with `shared` (see shares()) the shared ones."""
    if not settings.IMAGEGEN_CACHE_ENABLED:
        return {}
    r = get_redis()
    scopes = (False, True) if shared else (False,)
    keys = [request_key(job, i, shared=scope) for i in range(job.count) for scope in scopes]
    found = {}
    for n, (key, image_id) in enumerate(zip(keys, r.mget(keys), strict=True)):
        index = n // len(scopes)
        if index in found:
            continue
        image = _servable(image_id) if image_id else None
        if image is not None:
            found[index] = image
        elif image_id:
            r.delete(key)  # purged, blocked or lost since: never serve it again
    if found:
        r.incrby(HITS_KEY, len(found))
    if job.count - len(found):
        r.incrby(MISSES_KEY, job.count - len(found))
    return found


def remember(job) -> None:
    """After delivery: point each request key at its delivered image."""
    if not settings.IMAGEGEN_CACHE_ENABLED or job.status != "done":
        return
    prompt_allowed = job.verdicts.filter(stage="prompt", decision="allow").exists()
    if not prompt_allowed:
        return  # a moderator-approved prompt is never reused for someone else without review
    pipe = get_redis().pipeline()
    for image in job.images.filter(tier="public"):
        for shared in (False, True):
            pipe.set(request_key(job, image.index, shared=shared), str(image.id), ex=TTL_SECONDS)
    pipe.execute()


def stats() -> dict:
    hits, misses = get_redis().mget([HITS_KEY, MISSES_KEY])
    return {"hits": int(hits or 0), "misses": int(misses or 0)}
