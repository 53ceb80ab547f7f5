"""The request-hash cache: an image is a pure function of its inputs, so an identical request
reuses the stored image instead of spending the GPU again.

Key: a hash of the canonical (model version, prompt, negative prompt, width, height, steps,
guidance, scheduler, per-image seed, the prompt gate's identity (the whole policy file, the
embedder and head: safety.policy_version.policy_identity), the image gate's identity), with the
owner in the key for the per-user scope. The gate's identity in the key is the one that judged
the image (recorded on its verdict), and a lookup uses the gate configured now, so an image
judged by another classifier, or by none, is never served. Value: the id of a stored image. An
entry is served only while its image is delivered (public tier, job done, an allow verdict by
that gate) and its bytes exist; anything else is a miss and the entry is dropped. Unchecked
images (classifier `none`) never enter the cache.

The output format is not in the key (the pixels do not depend on it): a hit stored in another
format is converted (`in_format`), not generated again.

Scope (IMAGEGEN_CACHE_SCOPE). A shared cache is an oracle: a hit is done in the submit answer,
so anyone could test in one request whether another user asked for a given (prompt, seed).
  k-anonymous      (default) an entry serves its owner at once; another user only once
                   IMAGEGEN_CACHE_SHARE_K distinct users (the asker among them) asked for that
                   request, so the head of the prompt distribution is shared and a rare prompt
                   never is; and a cross-user hit goes the way of a fresh job (admitted with its
                   estimate and reserved, its prompt checked, waiting while earlier jobs of its
                   lane wait, running for one pass of its shape, charged: jobs/actions/
                   lifecycle.py), so neither its answers, its events, its timing nor its charge
                   say that someone else asked
  user             an entry serves only the user whose request made it
  global-unseeded  requests without an explicit seed are shared (with IMAGEGEN_SEED_POLICY=fixed
                   that is where repeats come from); seeded ones stay per user. A hit still says
                   that someone asked for that prompt, so it suits a service whose prompts are
                   not secret from each other
  global           every entry serves everyone
Each delivered image is remembered under both keys (its owner's and the shared one), so the
scope is decided where the lookup happens and a change of setting applies at once.

In flight (issue 48): an identical request that arrives while the job that will make its images is
queued or running joins it instead of making a pass of its own. Each image of a job queued to be
generated is noted under its request keys (its owner's and the shared one, `rc-inflight:`) with
the job's id (`register_in_flight`); a request whose every image names one live job there, under
the same rule as a hit (its owner's key always; the shared key only where the scope shares it and,
k-anonymous, once k users asked), joins that job (`in_flight`). A note outlives its job only until
a lookup finds the job ended (and drops it) or its TTL; a job that ends is no longer joined.

A hit never shares an object: every job served from the cache gets its own file (`own_copies`:
the same pixels, its own parameters and content credentials, its own key), so deleting one job's
image removes one user's copy only. Entries keep pointing at the image that was generated.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from imagegen.redis_client import PREFIX, get_redis, keep_reads, pipeline_with_reads, read_ahead, reads, write
from safety.gate_identity import gate_identity, is_unchecked
from safety.policy_version import policy_identity

log = logging.getLogger(__name__)

TTL_SECONDS = 30 * 24 * 3600
# An in-flight note lives at most this long: a job lost without ending stops being joined then.
INFLIGHT_TTL_SECONDS = 6 * 3600
HITS_KEY = f"{PREFIX}stats:cache_hits"
MISSES_KEY = f"{PREFIX}stats:cache_misses"


SCOPES = ("k-anonymous", "user", "global-unseeded", "global")


def shares(seed_given: bool) -> bool:
    """Whether a request may be served from (and seen in) the shared entries under the scope."""
    scope = settings.IMAGEGEN_CACHE_SCOPE
    return scope in ("global", "k-anonymous") or (scope == "global-unseeded" and not seed_given)


def _askers_key(shared_key: str) -> str:
    return shared_key.replace(f"{PREFIX}rc:", f"{PREFIX}rc-askers:", 1)


def _ask(pipe, shared_key: str, owner_id) -> None:
    """k-anonymity: count the asker among the distinct users who asked for this request (a set
    per shared key, living as long as an entry); its SCARD is the third reply. A shared entry
    serves only at k of them."""
    askers = _askers_key(shared_key)
    pipe.sadd(askers, str(owner_id))
    pipe.expire(askers, TTL_SECONDS)
    pipe.scard(askers)


def reveal_delay(job) -> float:
    """Seconds a fresh job of this shape would take on an idle queue: one pass of its images,
    the measured overhead after a pass (hand-off, image gate, publish) and its fill wait. A
    cross-user hit is done no sooner than this."""
    from scheduling import costs as cost_model
    from scheduling import scheduler

    shape = scheduler.shape_key(job.model_version, job.width, job.height, job.steps, job.guidance_scale, job.scheduler)
    costs = cost_model.costs()
    return (cost_model.pass_seconds(shape, job.count, costs) + cost_model.overhead(costs)
            + float(settings.IMAGEGEN_FILL_WAIT))


def request_key(job, index: int, owner_id=None, shared: bool = False, classifier: str | None = None) -> str:
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
        "policy": policy_identity(),
        "gate": classifier if classifier is not None else gate_identity(),
    }
    if getattr(job, "rewrite", False):
        # The user's prompt plus the rewriter's identity (jobs/pipeline/rewrite.py): the same
        # request through the same rewriter draws the same prompt. Absent when not rewriting, so
        # those keys are as they were.
        canonical["rewriter"] = job.rewriter_version
    if not shared:
        canonical["owner"] = owner_id if owner_id is not None else job.owner_id
    digest = hashlib.sha256(json.dumps(canonical, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return f"{PREFIX}rc:{digest}"


def _servable(image_id: str):
    from jobs.media.storage import public_storage
    from jobs.models import GeneratedImage

    image = GeneratedImage.objects.select_related("job").filter(id=image_id, tier="public", job__status="done", bytes_dropped=False, lost=False).first()
    if image is None:
        return None
    if image.verdicts.filter(stage="image").exclude(decision="allow").exists():
        return None
    if not image.verdicts.filter(stage="image", decision="allow", classifier=gate_identity()).exists():
        return None  # judged by another gate (or none): this gate has not allowed it
    if not public_storage().exists(image.storage_key):
        return None
    return image


def lookup(job, shared: bool = False) -> dict[int, object]:
    """index -> a servable cached image, for the indices that hit: the owner's own entries,
    and with `shared` (see shares()) the shared ones."""
    if not settings.IMAGEGEN_CACHE_ENABLED or is_unchecked(gate_identity()):
        return {}
    r = get_redis()
    scopes = (False, True) if shared else (False,)
    keys = [request_key(job, i, shared=scope) for i in range(job.count) for scope in scopes]
    k_anonymous = settings.IMAGEGEN_CACHE_SCOPE == "k-anonymous"
    asked = [n for n in range(len(keys)) if k_anonymous and shared and n % len(scopes) == 1]
    # One round trip: the entries, the askers of each shared key, and whatever reads the
    # request queued to ride along (the submit's summary entry: redis_client.read_ahead).
    pipe, ahead = pipeline_with_reads()
    pipe.mget(keys)
    for n in asked:
        _ask(pipe, keys[n], job.owner_id)
    replies = keep_reads(pipe.execute(), ahead)
    job.askers_seen = {keys[n]: int(replies[3 + 3 * i]) for i, n in enumerate(asked)}  # for in_flight: no second trip
    enough = {n: int(replies[3 + 3 * i]) >= max(1, settings.IMAGEGEN_CACHE_SHARE_K) for i, n in enumerate(asked)}
    found = {}
    for n, (key, image_id) in enumerate(zip(keys, replies[0], strict=True)):
        index = n // len(scopes)
        is_shared = shared and n % len(scopes) == 1
        if n in enough and not enough[n]:
            continue  # fewer than k users asked for it: never shared (the entry stays)
        if index in found:
            continue
        image = _servable(image_id) if image_id else None
        if image is not None:
            image.cross_user = k_anonymous and is_shared and image.job.owner_id != job.owner_id
            found[index] = image
        elif image_id:
            r.delete(key)  # purged, blocked or lost since: never serve it again
    hits, misses = len(found), job.count - len(found)
    write(lambda p: (hits and p.incrby(HITS_KEY, hits), misses and p.incrby(MISSES_KEY, misses)))
    return found


def remember(job) -> None:
    """After delivery: point each request key at its delivered image."""
    if not settings.IMAGEGEN_CACHE_ENABLED or job.status != "done":
        return
    if not prompt_reusable(job):
        return  # a moderator-approved prompt is never reused for someone else without review
    pipe = get_redis().pipeline()
    for image in job.images.filter(tier="public"):
        judged_by = image.verdicts.filter(stage="image", decision="allow").values_list("classifier", flat=True).first()
        if not judged_by or is_unchecked(judged_by):
            continue  # unchecked (or a cache hit itself, already keyed): never a cache entry
        for shared in (False, True):
            pipe.set(request_key(job, image.index, shared=shared, classifier=judged_by), str(image.id), ex=TTL_SECONDS)
    pipe.execute()


def prompt_reusable(job) -> bool:
    """Whether the job's prompt (and its rewrite, where the rewriter changed it) was allowed by the
    gate itself: a moderator's approval is never reused for another request without review."""
    allowed = job.verdicts.filter(stage="prompt", decision="allow").exists()
    if job.rewrite and job.revised_prompt and job.revised_prompt != job.prompt:  # and its rewrite, by the gate
        allowed = allowed and job.verdicts.filter(stage="rewrite", decision="allow").exists()
    return allowed


def _in_flight_key(key: str) -> str:
    return key.replace(f"{PREFIX}rc:", f"{PREFIX}rc-inflight:", 1)


def _in_flight_keys(job) -> list[str]:
    return [_in_flight_key(request_key(job, i, shared=shared)) for i in range(job.count) for shared in (False, True)]


def register_in_flight(job) -> None:
    """After the commit that queued a job to be generated (none of its images from the cache, not
    a joiner, not a cross-user hit): its request keys name it while it is in flight. Best effort:
    without the note an identical request is generated, as before."""
    if not settings.IMAGEGEN_CACHE_ENABLED or is_unchecked(gate_identity()):
        return
    keys = _in_flight_keys(job)
    try:  # inside a submit's batched block: in its one pipeline at the end
        write(lambda pipe: [pipe.set(key, str(job.id), ex=INFLIGHT_TTL_SECONDS) for key in keys])
    except RedisError:
        log.warning("job %s not noted in flight (Redis away): an identical request is generated", job.id)


def _live_leader(job_id: str):
    """The job named by an in-flight note while it can still be joined: queued for or in its pass,
    generated for itself (not a joiner, not a cross-user hit)."""
    from jobs.models import JOINABLE_STAGES, GenerationJob

    return GenerationJob.objects.filter(id=job_id, stage__in=JOINABLE_STAGES, joins=None, cache_reveal_at=None).first()


def _in_flight_read(job, shared: bool) -> tuple[list[str], list[str], tuple]:
    """The owner's note keys, the shared request keys, and the one MGET of their notes."""
    own = [_in_flight_key(request_key(job, i)) for i in range(job.count)]
    common = [request_key(job, i, shared=True) for i in range(job.count)] if shared else []
    return own, common, ("MGET", *own, *[_in_flight_key(key) for key in common])


def read_ahead_in_flight(job, shared: bool = False) -> None:
    """Queue the read of the job's in-flight notes to ride in the cache lookup's round trip."""
    if settings.IMAGEGEN_CACHE_ENABLED and not is_unchecked(gate_identity()):
        read_ahead(_in_flight_read(job, shared)[2])


def in_flight(job, shared: bool = False) -> tuple[Any, bool]:
    """The live job an identical request in flight makes, which this one may join, and whether
    joining it is a cross-user join (k-anonymous scope: it must look like a fresh job). Every image
    of the job must be one of that job's: its owner's notes first, then, with `shared` (shares()),
    the shared ones, only once k users asked under the k-anonymous scope (the submit's lookup
    counted the asker). Notes naming a job that ended are dropped."""
    if not settings.IMAGEGEN_CACHE_ENABLED or is_unchecked(gate_identity()):
        return None, False
    k_anonymous = settings.IMAGEGEN_CACHE_SCOPE == "k-anonymous"
    own, common, notes = _in_flight_read(job, shared)
    r = get_redis()
    try:
        # The notes were read in the submit's lookup round trip (read_ahead_in_flight); the askers
        # were counted there (lookup: askers_seen), this asker among them.
        [names] = reads(notes)
        seen = getattr(job, "askers_seen", {})
        counts = [seen[key] if key in seen else r.scard(_askers_key(key)) for key in (common if k_anonymous else ())]
    except RedisError:
        return None, False
    enough = all(int(n) >= max(1, settings.IMAGEGEN_CACHE_SHARE_K) for n in counts)
    candidates = [(names[:len(own)], False)]
    if common and enough:
        candidates.append((names[len(own):], True))
    for found, is_shared in candidates:
        if not found or None in found or len(set(found)) != 1:
            continue
        leader = _live_leader(found[0])
        if leader is None:
            try:
                r.delete(*[key for key, name in zip(own + [_in_flight_key(k) for k in common], names, strict=True)
                           if name == found[0]])
            except RedisError:
                pass
            continue
        return leader, k_anonymous and is_shared and leader.owner_id != job.owner_id
    return None, False


def forget_in_flight(job) -> None:
    """The job ended: its notes go, where they still name it (best effort: a lookup drops a stale
    one anyway)."""
    keys = _in_flight_keys(job)
    try:
        r = get_redis()
        stale = [key for key, name in zip(keys, r.mget(keys), strict=True) if name == str(job.id)]
        if stale:
            r.delete(*stale)
    except RedisError:
        pass


def joined_sources(job, leader) -> dict[int, object]:
    """index -> the leader's delivered image that is this job's (the same seed), servable as a cache
    entry is: public, the leader done, allowed by this gate, its bytes there. An index missing means
    the joiner cannot be served from it."""
    if not prompt_reusable(leader):
        return {}
    by_seed = dict(leader.images.filter(tier="public").values_list("seed", "id"))
    found: dict[int, object] = {}
    for index in range(job.count):
        image_id = by_seed.get(int(job.seed) + index)
        image = _servable(str(image_id)) if image_id else None
        if image is not None:
            found[index] = image
    return found


def blocked_pixels(job, leader) -> str:
    """The image gate's reason where it blocked one of the leader's images that are this job's: the
    same pixels under the same gate (both in the key) would be blocked again. Empty otherwise."""
    from safety.models import SafetyVerdict

    seeds = [int(job.seed) + index for index in range(job.count)]
    verdict = SafetyVerdict.objects.filter(image__job=leader, image__seed__in=seeds, stage="image", decision="block",
                                           classifier=gate_identity()).first()
    return verdict.reason if verdict is not None else ""


def stats() -> dict:
    hits, misses = get_redis().mget([HITS_KEY, MISSES_KEY])
    return {"hits": int(hits or 0), "misses": int(misses or 0)}


def sources(job) -> dict[int, object]:
    """index -> the servable cached image for it (the owner's entry, else the shared one), looked
    up again where a cross-user hit is revealed: the submit's lookup decided the scope and counted
    the asker, this counts nothing. An index whose image went meanwhile is missing."""
    if not settings.IMAGEGEN_CACHE_ENABLED or is_unchecked(gate_identity()):
        return {}
    keys = [request_key(job, i, shared=scope) for i in range(job.count) for scope in (False, True)]
    found: dict[int, object] = {}
    for n, image_id in enumerate(get_redis().mget(keys)):
        if image_id and n // 2 not in found:
            image = _servable(image_id)
            if image is not None:
                found[n // 2] = image
    return found


def reveal_at(job, eta_seconds: float | None):
    """When a cross-user hit is done: when a fresh job admitted with this estimate would be, and
    no sooner than one of its shape on an idle queue."""
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() + timedelta(seconds=max(eta_seconds or 0.0, reveal_delay(job)))


def own_copies(job, cached: dict[int, object]) -> dict[int, object]:
    """Each hit as a file of this job's own: the cached image's pixels, encoded again in this job's
    output format with its own parameters and content credentials (naming this job, not the one
    that made it), written to private quarantine under a new key; `publish` makes them public. So
    no two jobs share an object: a delete removes one user's copy, never another's. Each copy
    names its source (source_key): a moderator's take-down of any of them reaches them all.

    It signs, so it runs where the signing key is (imagegen/signing_credentials.py): the web
    process for a hit answered at once, the GPU worker for a cross-user hit (its reveal stage).
    A lossless (PNG) source gives exactly the file a fresh job would have written; a JPEG or WebP
    source is decoded and encoded again."""
    from jobs.media import credentials, encoding
    from jobs.media.storage import public_storage, store_quarantined
    from safety.image_policy import steered_negative

    adopt(job, cached)
    out: dict[int, object] = {}
    try:
        for index, image in cached.items():
            key = image.storage_key  # type: ignore[attr-defined]
            with public_storage().open(key, "rb") as fh:
                data = fh.read()
            # the negative prompt the model was given: the source job's recorded steering before the
            # user's own (the key says the user's is this job's)
            given = steered_negative(image.job.steering or "", job.negative_prompt)  # type: ignore[attr-defined]
            parameters = encoding.ImageParameters.of(job, int(job.seed) + index, given)
            encoded = encoding.convert(data, job.output_format, job.output_compression, parameters)
            encoded, content_sha256 = credentials.credentialed(encoded, job.output_format, parameters)
            stored = store_quarantined(encoded.data, encoded.extension)
            own = copy.copy(image)
            own.storage_key, own.byte_size, own.sha256 = stored.key, stored.byte_size, stored.sha256  # type: ignore[attr-defined]
            own.content_type, own.content_sha256 = encoded.content_type, content_sha256  # type: ignore[attr-defined]
            own.source_key = image.source_key or key  # type: ignore[attr-defined]
            out[index] = own
    except Exception:
        discard(out)
        raise
    return out


REWRITE_FIELDS = ("revised_prompt", "rewriter_version", "rewrite_notes")  # what a rewrite wrote on its job


def adopt(job, cached: dict[int, object]) -> None:
    """What the job takes from the job that made its images: the same prompt through the same
    rewriter draws the same rewrite (the key says so), and the same pixels were made with the same
    steering (a regeneration needs it)."""
    if not cached:
        return
    source = next(iter(cached.values())).job  # type: ignore[attr-defined]
    if job.rewrite:
        for name in REWRITE_FIELDS:
            if hasattr(source, name):
                setattr(job, name, getattr(source, name))
        job.rewritten_at = job.rewritten_at or source.rewritten_at
    job.steering = source.steering


def publish(copies: dict[int, object]) -> None:
    from jobs.media.storage import publish_object

    for own in copies.values():
        publish_object(own.storage_key)  # type: ignore[attr-defined]


def discard(copies: dict[int, object]) -> None:
    """Copies that will never be delivered (the submit refused, the job cancelled): deleted."""
    from jobs.media.storage import delete_quietly, public_storage, quarantine_storage

    for own in copies.values():
        delete_quietly(own.storage_key, quarantine_storage())  # type: ignore[attr-defined]
        delete_quietly(own.storage_key, public_storage())  # type: ignore[attr-defined]
