"""The wait-estimate summary: what jobs.admission.replay.estimate() answers, computed once per interval
and kept in Redis, so that a submit or a poll costs the same with 10 or 10,000 images queued.

estimate() replays the scheduler over the whole backlog (jobs/admission/control.py): exact, but its
cost grows with the queue, and every submit and every poll of a queued job paid it. Here each
answer is computed by calling that same machinery, once per interval for all the web processes,
and requests read the result:

- ``new|<shape>|<images>``: estimate(shape, images) for a new job, stored with the absolute time
  its pass ends; a request answers ``eta_end - now``.
- ``bucket|<shape>``: one replay for every job of the shape's bucket (admission.queued_ends):
  a queued job's ETA is its own (fair share does not serve a bucket in FIFO order); a job that
  joined since is interpolated between the samples (SAMPLES places spread over the bucket)
  around its place.
- ``counts``: jobs and images queued per shape (GET /api/v1/queue).

A queued job's position (jobs ahead) is counted exactly in Redis, one ZCOUNT per shape: no scan.

Freshness: an entry is refreshed once it is older than FRESH_FACTOR (20) times its own compute
time (at most IMAGEGEN_SUMMARY_MAX_AGE), so keeping one entry fresh never takes more than 1/20
of a core, whatever the backlog: a replay of 10,000 images (~135 ms of CPU here) is redone
every ~3 s, against a wait of many minutes; one of an empty queue (~2.5 ms) every 0.05 s. Costs
are CPU seconds (thread time), steady when the machine is busy. A cheap new-job entry (under
SYNC_BUDGET: a short queue) is also refreshed once a job of its shape was accepted after it was
made. A request never recomputes an entry that exists: a stale one (or one outdated by a
submit) answers as it is while it is recomputed off the request path, by the refresher thread
of a cpu Celery worker (refresher_loop, started on worker_ready, every REFRESH_EVERY; one
computer per entry across all of them, a Redis lock) when one is alive, asked for by a marker
the request sends with its other counters; else by a thread of the web process. The refresher
takes at most REFRESHER_SHARE of a core in all (it waits in proportion to what a pass cost), so
under a burst an entry outdated by submits lags them by a few hundred milliseconds rather than
taking the prompt checks' core. Until
issue 33 a cheap entry was recomputed in the request that found it stale, which cost a submit
eight Redis round trips each time one of its shape had come before. An entry older than
IMAGEGEN_SUMMARY_MAX_AGE (no refresher: twice its freshness, at least STALE_GRACE), or
missing, is computed by the request that wants it; others wanting it meanwhile wait for that
computation. A submit reads its entry in the request-hash cache's round trip (read_ahead_new).
Changes to the replay (scheduling/policy.py, jobs/admission/control.py) flow through unchanged.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from celery.signals import worker_ready
from django.conf import settings
from django.db import close_old_connections

from imagegen.redis_client import PREFIX, batched, get_redis, keep_reads, pipeline_with_reads, read_ahead, reads, write
from jobs.admission import replay as admission
from scheduling import catalogue, scheduler
from scheduling import costs as cost_model
from scheduling.lanes import lane_of, lane_of_shape

SAMPLES = 6  # replays per shape bucket for queued jobs' ETAs
FRESH_FACTOR = 20.0  # an entry stays fresh for this many times its compute time
CHANGE_FACTOR = 4.0  # a cheap entry outdated by a submit is recomputed at most this often (x its cost)
SYNC_BUDGET = 0.008  # CPU seconds: an entry cheaper than this is refreshed after a submit of its shape
STALE_GRACE = 1.0  # seconds a stale entry answers while this process recomputes it (no refresher alive)
ENTRY_TTL = 3600  # seconds an unused entry stays in Redis
FIRST_WAIT = 2.0  # seconds a request waits for another's first computation of an entry

log = logging.getLogger(__name__)
_refresher = ThreadPoolExecutor(1, thread_name_prefix="queue-summary")
_pending: set[str] = set()
_pending_lock = threading.Lock()


def _key(model: str) -> str:
    return f"{PREFIX}summary:{model}"


def _fresh_for(entry: dict) -> float:
    return min(settings.IMAGEGEN_SUMMARY_MAX_AGE, FRESH_FACTOR * entry["cost"])


def _store(model: str, field: str, compute: Callable[[], dict], submits: str | None = None) -> dict:
    """Compute the entry, store it, and release its lock (taken or not: a lock outlives no
    computation)."""
    # Cost in CPU seconds of this thread: what an entry takes from a core (its freshness is
    # 20x that), steady whether or not this machine is busy with other work.
    started = time.thread_time()
    r = get_redis()
    try:
        entry = compute()
        entry["cost"] = time.thread_time() - started
        if submits is not None:  # the submit counter read before computing: later ones are not in it
            entry["submits"] = submits
        pipe = r.pipeline(transaction=False)
        pipe.hset(_key(model), field, json.dumps(entry))
        pipe.expire(_key(model), ENTRY_TTL)
        pipe.execute()
    finally:
        r.delete(_lock_key(model, field))
    return entry


def _lock_key(model: str, field: str) -> str:
    return f"{_key(model)}:lock:{field}"


def _lock(model: str, field: str, seconds: float) -> bool:
    """One computer per entry across every process and thread, for at most `seconds`."""
    return bool(get_redis().set(_lock_key(model, field), "1", nx=True, px=max(100, int(seconds * 1000))))


def _refresh_in_background(model: str, field: str, compute: Callable[[], dict], submits: str | None = None) -> None:
    token = f"{model}\0{field}"
    with _pending_lock:
        if token in _pending:
            return
        _pending.add(token)

    def run() -> None:
        close_old_connections()
        try:
            _store(model, field, compute, submits)
        except Exception:  # the stale entry keeps answering; the next request retries
            log.exception("queue summary %s: refresh failed", field)
        finally:
            close_old_connections()
            with _pending_lock:
                _pending.discard(token)

    _refresher.submit(run)


def _reads(model: str, field: str, counter: str | None) -> tuple[tuple, tuple]:
    """The two reads behind an entry (one round trip, or none when read ahead): the entry with
    its submit counter, and whether a refresher is alive."""
    return ("HMGET", _key(model), field, counter or field), ("EXISTS", _alive_key())


def _grace(current: dict, alive: bool) -> float:
    """How old a stale entry may be and still answer while it is recomputed off the request:
    with a refresher, IMAGEGEN_SUMMARY_MAX_AGE; without, twice its freshness (at least
    STALE_GRACE: a cheap entry's freshness is a few milliseconds)."""
    if alive:
        return settings.IMAGEGEN_SUMMARY_MAX_AGE
    return max(2 * _fresh_for(current), STALE_GRACE)


def entry(model: str, field: str, compute: Callable[[], dict], shape: str = "") -> dict:
    """The summary entry `field`, fresh enough (see the module docstring). With `shape`, a cheap
    entry is also refreshed once a job of that shape was accepted after it was made (it is not
    in the entry), at most every CHANGE_FACTOR x its compute time. A request recomputes only a
    missing entry or one past its grace: a stale one answers as it is, and the refresher of a
    cpu worker (or, with none alive, a thread of this process) recomputes it."""
    counter = f"submits|{shape}" if shape else None
    (raw, submits), alive = reads(*_reads(model, field, counter))
    current = json.loads(raw) if raw else None
    if current is None:
        return _first(model, field, compute, submits if counter else None)
    age = time.time() - current["at"]
    changed = counter is not None and current["cost"] <= SYNC_BUDGET \
        and (submits or "0") != current.get("submits", "0") and age > CHANGE_FACTOR * current["cost"]
    if age <= _fresh_for(current) and not changed:
        return current
    if age <= _grace(current, bool(alive)):
        if alive:  # the refresher's next pass (every REFRESH_EVERY) recomputes it
            wanted = repr(time.time())
            write(lambda pipe: pipe.hset(_key(model), f"want|{field}", wanted))
        elif _lock(model, field, max(1.0, 3 * current["cost"])):
            _refresh_in_background(model, field, compute, submits if counter else None)
        return current
    if not _lock(model, field, max(1.0, 3 * current["cost"])):
        return _wait_newer(model, field, current, 3 * current["cost"] + 0.01)  # another is computing it
    return _store(model, field, compute, submits if counter else None)


def read_ahead_new(shape: str, images: int, model_name: str | None = None) -> None:
    """Queue the reads of new_job_estimate(shape, images) to ride in the request's next pipeline
    (the submit's request-hash cache lookup: one round trip for both)."""
    model = model_name or lane_of_shape(shape)
    read_ahead(*_reads(model, f"new|{shape}|{images}", f"submits|{shape}"))


def _wait_newer(model: str, field: str, current: dict, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.002)
        raw = get_redis().hget(_key(model), field)
        if raw:
            newer = json.loads(raw)
            if newer["at"] > current["at"]:
                return newer
    return current


def note_submit(shape: str, model_name: str | None = None) -> None:
    """A job of `shape` was accepted: cheap new-job entries of that shape are recomputed (sent
    with the request's other counters: redis_client.batched)."""
    key = _key(model_name or lane_of_shape(shape))
    write(lambda pipe: pipe.hincrby(key, f"submits|{shape}", 1))


def _first(model: str, field: str, compute: Callable[[], dict], submits: str | None = None) -> dict:
    """No entry yet: one request computes it; the others that want it meanwhile wait for it
    (up to FIRST_WAIT seconds, then compute it themselves) instead of all replaying at once."""
    if _lock(model, field, FIRST_WAIT):
        return _store(model, field, compute, submits)
    deadline = time.monotonic() + FIRST_WAIT
    while time.monotonic() < deadline:
        time.sleep(0.01)
        raw = get_redis().hget(_key(model), field)
        if raw:
            return json.loads(raw)
    return _store(model, field, compute, submits)


# --- a new job ---

def _compute_new(shape: str, images: int, model: str) -> dict:
    now = time.time()
    est = admission.estimate(shape, images, model_name=model)
    costs = cost_model.costs()
    return {
        "at": now,
        "eta_end": None if est.eta_seconds is None else now + est.eta_seconds,
        # a pass of its own on an idle GPU: no stale entry may promise less than this
        "floor": cost_model.pass_seconds(shape, images, costs) + cost_model.overhead(costs)
        + (scheduler.fill_wait_for(_version(shape)) if images < scheduler.cap_for(*_size(shape), _version(shape)) else 0.0),
        "position": est.position,
        "work_ahead": est.work_ahead_seconds,
        "queued_images": est.queued_images,
        "gpus": est.active_gpus,
        # what current_estimate needs for an owner with jobs of the shape queued: a full pass
        # and the overhead, read with the entry instead of the cost model's hash
        "full_pass": cost_model.pass_seconds(shape, scheduler.cap_for(*_size(shape), _version(shape)), costs),
        "overhead": cost_model.overhead(costs),
    }


def _version(shape: str) -> str:
    return shape.split("|", 1)[0]


def _size(shape: str) -> tuple[int, int]:
    info = scheduler.parse_shape(shape)
    return info["width"], info["height"]


def _eta(eta_end: float | None, floor: float, now: float) -> float | None:
    return None if eta_end is None else max(eta_end - now, floor)


def new_job_entry(shape: str, images: int, model_name: str | None = None) -> dict:
    """The summary's new-job entry for (shape, images): what new_job_estimate answers from."""
    model = model_name or lane_of_shape(shape)
    return entry(model, f"new|{shape}|{images}", lambda: _compute_new(shape, images, model), shape=shape)


def estimate_of(e: dict) -> admission.Estimate:
    return admission.Estimate(_eta(e["eta_end"], e["floor"], time.time()), e["position"], e["work_ahead"],
                              e["queued_images"], e["gpus"])


def new_job_estimate(shape: str, images: int, model_name: str | None = None) -> admission.Estimate:
    """admission.estimate(shape, images) for a new job, from the summary."""
    e = new_job_entry(shape, images, model_name)
    return admission.Estimate(_eta(e["eta_end"], e["floor"], time.time()), e["position"], e["work_ahead"],
                              e["queued_images"], e["gpus"])


# --- a job already queued ---

def _compute_bucket(shape: str, model: str) -> dict:
    """One replay for every job of the bucket (admission.queued_ends): each job's own ETA, as
    estimate(..., job_id=) answers it (fair share does not serve a bucket in FIFO order), and
    samples by place for a job that joined since."""
    now = time.time()
    bucket = scheduler.queued_entries(model).get(shape, [])
    gpus = admission.active_gpus(model) if bucket else None
    ends = admission.queued_ends(shape, model) if gpus else {}
    picks = sorted({round(i * (len(bucket) - 1) / (SAMPLES - 1)) for i in range(SAMPLES)}) if bucket else []
    samples = [[index, None if bucket[index][0] not in ends else now + ends[bucket[index][0]]] for index in picks]
    return {"at": now, "samples": samples, "gpus": gpus, "jobs": len(bucket),
            "ends": {job_id: now + end for job_id, end in ends.items()},
            "overhead": cost_model.overhead(cost_model.costs())}


def interpolate(samples: list[list], index: int) -> float | None:
    """The ETA (absolute) at place `index` of the bucket, between the samples around it; past
    the last sample (a job that joined since), along the last two samples' slope."""
    if not samples or any(end is None for _, end in samples):
        return None
    places = [p for p, _ in samples]
    k = bisect.bisect_left(places, index)
    if k < len(places) and places[k] == index:
        return samples[k][1]
    if k == 0:
        return samples[0][1]
    if k == len(places):
        if len(samples) == 1:
            return samples[-1][1]
        (p0, e0), (p1, e1) = samples[-2], samples[-1]
        return e1 + max(0.0, (e1 - e0) / (p1 - p0)) * (index - p1)
    (p0, e0), (p1, e1) = samples[k - 1], samples[k]
    return e0 + (e1 - e0) * (index - p0) / (p1 - p0)


# The jobs queued before a bound, per shape of a model (both tiers' buckets): one call, so a
# poll's position and its summary entry ride in one pipeline.
_AHEAD_LUA = """
local out = {}
for _, s in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  out[#out + 1] = s
  out[#out + 1] = redis.call('ZCOUNT', ARGV[1] .. 'q:' .. s, '-inf', ARGV[2])
                + redis.call('ZCOUNT', ARGV[1] .. 'qb:' .. s, '-inf', ARGV[2])
end
return out
"""
_ahead_script = None


def _ahead(model: str, shape: str, enqueued_at: float) -> tuple[int, int]:
    """(jobs queued ahead in every bucket, jobs ahead in the job's own bucket): exact, one ZCOUNT
    per shape, all in one script sent with the reads queued ahead in this block."""
    global _ahead_script
    if _ahead_script is None:
        _ahead_script = get_redis().register_script(_AHEAD_LUA)
    pipe, n = pipeline_with_reads()
    _ahead_script(keys=[f"{PREFIX}shapes:{model}"], args=[PREFIX, f"({enqueued_at!r}"], client=pipe)
    flat = keep_reads(pipe.execute(), n)[0]
    counts = {flat[i]: int(flat[i + 1]) for i in range(0, len(flat), 2)}
    return sum(counts.values()), counts.get(shape, 0)


def queued_job_estimate(shape: str, images: int, enqueued_at: float, model_name: str | None = None,
                        job_id: str | None = None) -> admission.Estimate:
    """admission.estimate(shape, images, enqueued_at, job_id=...) for a job queued in the
    scheduler since `enqueued_at`, from the summary (exact for a job the summary replayed)."""
    model = model_name or lane_of_shape(shape)
    field = f"bucket|{shape}"
    with batched():   # the entry's reads ride in the position's pipeline: one round trip
        read_ahead(*_reads(model, field, None))
        position, in_bucket = _ahead(model, shape, enqueued_at)
        e = entry(model, field, lambda: _compute_bucket(shape, model))
    if e["gpus"] == 0:
        return admission.Estimate(None, position, 0.0, 0, 0)
    if job_id is not None and job_id in e.get("ends", {}):
        return admission.Estimate(_eta(e["ends"][job_id], e["overhead"], time.time()), position, 0.0, 0, e["gpus"] or 0)
    end = interpolate(e["samples"], in_bucket)
    if end is None and not e["samples"]:  # the bucket was empty at the last summary: as a new job
        return new_job_estimate(shape, images, model)
    return admission.Estimate(_eta(end, e["overhead"], time.time()), position, 0.0, 0, e["gpus"] or 0)


# --- the queue's shape counts (GET /api/v1/queue) ---

def _compute_counts(model: str) -> dict:
    shapes = {s: {"jobs": len(es), "images": sum(n for _, n, _ in es)} for s, es in scheduler.queued_entries(model).items()}
    return {"at": time.time(), "shapes": shapes}


def queue_counts(model_name: str | None = None) -> dict[str, dict]:
    model = model_name or settings.IMAGEGEN_MODEL_NAME
    return entry(model, "counts", lambda: _compute_counts(model))["shapes"]


# --- the refresher: costly entries recomputed by a cpu worker, off the web processes ---

ALIVE_TTL = 5.0
REFRESH_EVERY = 0.05  # a submit's stale entry is recomputed this soon after (on an idle machine)
# The refresher's share of a core, at most: after a pass that cost c CPU seconds it waits
# c x (1/SHARE - 1) (and at least REFRESH_EVERY). Under a burst every submit outdates its shape's
# cheap entries, and recomputing each as soon as allowed took most of a core of the cpu worker
# that also runs the prompt checks (bench/api_load.py --run-command, issue 48 item 6).
REFRESHER_SHARE = 0.1
_stop = threading.Event()


def _alive_key() -> str:
    return f"{PREFIX}summary-refresher"


def _compute_for(model: str, field: str) -> tuple[Callable[[], dict], str | None] | None:
    """The computation behind an entry's field name, and its submit counter's field."""
    if field == "counts":
        return (lambda: _compute_counts(model)), None
    if field.startswith("bucket|"):
        shape = field[len("bucket|"):]
        return (lambda: _compute_bucket(shape, model)), None
    if field.startswith("new|"):
        shape, images = field[len("new|"):].rsplit("|", 1)
        return (lambda: _compute_new(shape, int(images), model)), f"submits|{shape}"
    return None


def refresh_wanted(model: str) -> int:
    """Recompute every entry that a request found stale (or, cheap, outdated by a submit of its
    shape) since it was made. Returns how many."""
    r = get_redis()
    fields = r.hgetall(_key(model))
    done = 0
    for field, raw in fields.items():
        wanted = fields.get(f"want|{field}")
        how = _compute_for(model, field)
        if wanted is None or how is None:
            continue
        current = json.loads(raw)
        compute, counter = how
        submits = fields.get(counter) if counter else None
        changed = counter is not None and (submits or "0") != current.get("submits", "0")
        if float(wanted) < current["at"] or (time.time() - current["at"] <= _fresh_for(current) and not changed):
            continue
        if not _lock(model, field, max(1.0, 3 * current["cost"])):
            continue
        _store(model, field, compute, submits)
        done += 1
    return done


def refresher_wait(cost: float) -> float:
    """Seconds to wait after a pass that cost `cost` CPU seconds (REFRESHER_SHARE)."""
    return min(ALIVE_TTL / 2, max(REFRESH_EVERY, cost * (1.0 / REFRESHER_SHARE - 1.0)))


def refresher_loop() -> None:
    while not _stop.is_set():
        started = time.thread_time()
        try:
            get_redis().set(_alive_key(), "1", px=int(ALIVE_TTL * 1000))
            close_old_connections()
            for served in catalogue.served():
                refresh_wanted(lane_of(served))
        except Exception:  # Redis or the database away: the web processes compute for themselves
            log.exception("queue summary refresher")
        _stop.wait(refresher_wait(time.thread_time() - started))


def start_refresher(sender=None, **kwargs) -> None:
    """On a Celery worker that serves the cpu queue (worker_ready): one refresher thread."""
    consumer = getattr(sender, "task_consumer", None)
    queues = {q.name for q in getattr(consumer, "queues", [])}
    if settings.QUEUE_CPU in queues:
        threading.Thread(target=refresher_loop, name="queue-summary-refresher", daemon=True).start()


worker_ready.connect(start_refresher)
