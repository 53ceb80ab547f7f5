"""Honest wait estimates: the replay of the scheduler.

The cost model (pass seconds per shape and size, the overhead after a pass) is measured by the
workers and kept in Redis (scheduling/costs.py); heartbeats give the live GPU workers per lane
(scheduling/heartbeats.py).

The estimate replays the scheduler: the live GPUs become free when their running passes end;
each free GPU takes from the queued work by the scheduler's own rules (scheduling/policy.py,
the Python twin of the Lua take), waits the fill wait when its batch is partial, and runs the
pass for its measured time. The job's estimate is the end of the pass that takes it, plus the
overhead. Jobs still in the prompt check count as queued ahead. Work that arrives later is not
foreseen: a job of a rare shape can still be overtaken by fuller buckets until the starvation
bound, which the replay applies with the real enqueue times.

(A first version divided the GPU-seconds ahead by the GPU count and added the job's share of a
full batch; at 80% load it under-predicted a lone job's wait by half, because a job finishes
when its whole pass does, not after its share of it. bench/admission.py measures both.)
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from imagegen.redis_client import get_redis
from scheduling import costs as cost_model
from scheduling import policy, scheduler
from scheduling.costs import pass_seconds, seconds_per_image
from scheduling.lanes import lane_of_shape

PROMPT_CHECK_SECONDS = 0.05  # about one prompt check, for joining a pass still filling
NEW_JOB = "\0new"  # the replay's id for a job not submitted yet


def active_gpus(model_name: str | None = None) -> int:
    from scheduling.heartbeats import live_workers

    return len(live_workers(model_name or settings.IMAGEGEN_MODEL_NAME))


@dataclass(frozen=True)
class Estimate:
    eta_seconds: float | None  # None: no live GPU worker, so no honest number
    position: int  # jobs queued ahead
    work_ahead_seconds: float
    queued_images: int
    active_gpus: int


def cap_of(shape: str) -> int:
    info = scheduler.parse_shape(shape)
    return scheduler.cap_for(info["width"], info["height"], info["model_version"])


@dataclass(frozen=True)
class _Filling:
    """A claimed partial pass still inside its fill wait: a job of its shape can join it."""
    shape: str
    room: int
    fill_ends_in: float
    started_in: float  # negative: seconds ago


def _running(workers: list[str], costs: dict, now: float) -> tuple[list[float], list[_Filling]]:
    """Seconds until each of a lane's live GPU workers (`workers`) is free (its running pass's
    measured time less the time it has run, then the pass of any batch it took ahead while this
    one runs; idle GPUs: 0), and the passes still waiting for more of their shape. A pass of
    another lane on one of these workers counts (a worker may serve several lanes: `make run` on
    one machine); one on a worker of another lane's alone does not."""
    from jobs.models import Batch, GenerationJob

    batch_ids = set(GenerationJob.objects.filter(status="running").exclude(batch=None).values_list("batch_id", flat=True)[:1000])
    by_worker: dict[str, list] = {}
    for batch in Batch.objects.filter(id__in=batch_ids, finished_at=None, worker__in=workers).order_by("started_at"):
        by_worker.setdefault(batch.worker or str(batch.id), []).append(batch)
    remaining, filling = [], []
    for batches in by_worker.values():
        free_in = 0.0
        for batch in batches:
            shape = scheduler.shape_key(batch.model_version, batch.width, batch.height, batch.steps, batch.guidance_scale, batch.scheduler)
            size = max(1, batch.size)
            started_in = (batch.pass_started_at or batch.started_at).timestamp() - now
            fill = scheduler.fill_wait_for(batch.model_version) if size < batch.cap and batch.pass_started_at is None else 0.0
            if batch.pass_started_at is None and free_in > 0:  # taken ahead: runs when the current pass ends
                free_in += pass_seconds(shape, size, costs)
            else:
                free_in = max(free_in, started_in + fill + pass_seconds(shape, size, costs))
            if fill and started_in + fill > 0:
                filling.append(_Filling(shape, batch.cap - size, started_in + fill, started_in))
        remaining.append(max(0.0, free_in))
    remaining.sort()
    gpus = len(workers)
    return (remaining + [0.0] * gpus)[:gpus], filling


def _fill_wait_of(shape: str) -> float:
    return scheduler.fill_wait_for(scheduler.parse_shape(shape)["model_version"])


def _awaiting_prompt_check(lanes: list[str]) -> list[tuple[str, policy.Entry]]:
    """Admitted jobs of `lanes` whose prompt check has not finished: they enter the queue ahead
    of a new job. (Another lane's are not ahead: they go to other GPUs.)"""
    from jobs.models import GenerationJob
    from scheduling import catalogue

    out = []
    recent = timezone.now() - timedelta(minutes=10)
    for job in GenerationJob.objects.filter(stage__in=("prompt", "rewrite", "rewrite_check"), created_at__gte=recent,
                                            model_version__in=[catalogue.version_of_lane(lane) for lane in lanes]).only(
        "id", "owner_id", "model_version", "width", "height", "steps", "guidance_scale", "scheduler", "count",
        "created_at", "priority",
    )[:2000]:
        shape = scheduler.shape_key(job.model_version, job.width, job.height, job.steps, job.guidance_scale, job.scheduler)
        out.append((shape, (str(job.id), job.count, job.created_at.timestamp(), str(job.owner_id),
                            scheduler.tier_of(job.priority))))
    return out


FORECAST_LIMIT = 5000  # forecast arrivals one replay may add
FORECAST_OWNER = "\0forecast"  # forecast arrivals share one fair-share flow: the rest of the traffic


def replay(buckets: policy.Buckets, free_in: list[float], target: str, now: float, costs: dict,
           rates: dict[str, float] | None = None, weights: dict[str, float] | None = None) -> float | None:
    """Seconds from now until the pass that takes `target` ends, replaying the scheduler on the
    queued work with the GPUs free after `free_in` seconds, while work keeps arriving at the
    measured `rates` (images per second per shape; one-image interactive jobs, evenly spaced,
    as one fair-share flow). None if the target is never taken."""
    return replay_all(buckets, free_in, {target}, now, costs, rates, weights).get(target)


def replay_all(buckets: policy.Buckets, free_in: list[float], targets: set[str], now: float, costs: dict,
               rates: dict[str, float] | None = None, weights: dict[str, float] | None = None) -> dict[str, float]:
    """replay() for several jobs at once: the seconds until the pass of each of `targets` ends
    (one replay, run until the last of them is taken; a job never taken is left out)."""
    starvation = settings.IMAGEGEN_STARVATION_SECONDS
    fair = settings.IMAGEGEN_FAIR_SHARE
    step = {shape: 1.0 / rate for shape, rate in (rates or {}).items() if rate > 0}
    next_at = dict(step)
    made = 0
    ends: dict[str, float] = {}

    def arrive_until(t: float) -> None:
        nonlocal made
        for shape in next_at:
            while next_at[shape] <= t and made < FORECAST_LIMIT:
                job = f"\0forecast{made}"
                policy.push(buckets, shape, (job, 1, now + next_at[shape], FORECAST_OWNER, policy.INTERACTIVE))
                next_at[shape] += step[shape]
                made += 1

    heap = list(free_in)
    heapq.heapify(heap)
    while heap and len(ends) < len(targets):
        t = heapq.heappop(heap)
        arrive_until(t)
        taken = policy.take(buckets, now + t, cap_of, starvation, fair=fair, weights=weights)
        if taken is None:  # idle until the next arrival
            if not next_at or made >= FORECAST_LIMIT:
                break
            heapq.heappush(heap, min(next_at.values()))
            continue
        shape, entries = taken
        cap = cap_of(shape)
        size = sum(e[1] for e in entries)
        start = t
        if size < cap:  # a partial pass waits the fill wait, taking what arrives meanwhile
            fill_wait = _fill_wait_of(shape)
            arrive_until(t + fill_wait)
            more = policy.take(buckets, now + t + fill_wait, cap_of, starvation, only_shape=shape,
                               max_images=cap - size, fair=fair, weights=weights)
            if more is not None:
                entries = entries + more[1]
                size += sum(e[1] for e in more[1])
            start = t + fill_wait if size < cap else max(t, max(e[2] - now for e in entries))
            if shape in buckets and not buckets[shape]:
                del buckets[shape]
        end = start + pass_seconds(shape, size, costs)
        for e in entries:
            if e[0] in targets:
                ends[e[0]] = end
        heapq.heappush(heap, end)
    return ends


def _queued(model_name: str) -> tuple[policy.Buckets, dict[str, float]]:
    return scheduler.snapshot(model_name)


def _sharing(lane: str, workers: list[str]) -> list[str]:
    """The served lanes whose live workers include one of `lane`'s (one GPU worker serving several
    lanes, as `make run` starts it on one machine): their queued work is taken by the same GPUs."""
    from scheduling.heartbeats import HEARTBEAT_TTL, workers_key
    from scheduling.lanes import served_lanes

    others = [other for other in served_lanes() if other != lane]
    if not others or not workers:
        return []
    pipe = get_redis().pipeline(transaction=False)
    for other in others:
        pipe.zrangebyscore(workers_key(other), time.time() - HEARTBEAT_TTL, "+inf")
    mine = set(workers)
    return [other for other, live in zip(others, pipe.execute(), strict=True) if mine & set(live)]


def _queued_on(lane: str, workers: list[str]) -> tuple[policy.Buckets, dict[str, float], int, list[str]]:
    """The queued work `lane`'s GPUs will take (its own, and that of the lanes sharing a worker
    with it), the owners' weights, the images queued on the lane itself, and the lanes merged."""
    buckets, weights = _queued(lane)
    own_images = sum(e[1] for b in buckets.values() for e in b.entries())
    lanes = [lane, *_sharing(lane, workers)]
    for other in lanes[1:]:
        buckets.update(_queued(other)[0])  # shapes name their version: no two lanes share one
    return buckets, weights, own_images, lanes


def _arrival_rates(lanes: list[str], now: float) -> dict[str, float]:
    rates: dict[str, float] = {}
    for lane in lanes:
        rates.update(scheduler.arrival_rates(lane, now))
    return rates


def estimate(shape: str, images: int, enqueued_at: float | None = None, model_name: str | None = None,
             job_id: str | None = None, owner: str = "", tier: int = policy.INTERACTIVE) -> Estimate:
    """For a new job (enqueued_at None) or one already queued since enqueued_at (job_id: its id).
    `owner`: the submitter (a new job joins their fair-share flow; "" for an owner with nothing queued)."""
    from scheduling.heartbeats import live_workers

    model_name = model_name or lane_of_shape(shape)
    now = time.time()
    costs = cost_model.costs()
    workers = live_workers(model_name)
    buckets, weights, queued_images, lanes = _queued_on(model_name, workers)
    entries = [(s, e) for s, b in buckets.items() for e in b.entries()]
    target = job_id if job_id is not None and any(e[0] == job_id for _, e in entries) else NEW_JOB
    if enqueued_at is None:
        for s, e in _awaiting_prompt_check(lanes):
            policy.push(buckets, s, e)
            entries.append((s, e))
    if target == NEW_JOB:
        new = (NEW_JOB, images, enqueued_at if enqueued_at is not None else now, owner or NEW_JOB, tier)
        policy.push(buckets, shape, new)
        entries.append((shape, new))
    ahead = [(s, e) for s, e in entries if e[0] != target and (enqueued_at is None or e[2] < enqueued_at)]
    work_ahead = sum(seconds_per_image(s, costs) * e[1] for s, e in ahead)
    gpus = len(workers)
    if gpus == 0:
        return Estimate(None, len(ahead), work_ahead, queued_images, 0)
    free_in, filling = _running(workers, costs, now)
    _sort(buckets)
    end = replay(buckets, free_in, target, now, costs, _arrival_rates(lanes, now), weights)
    if target == NEW_JOB and not any(s == shape for s, e in entries if e[0] != NEW_JOB):
        # Nothing of its shape waits: it may join a pass of its shape that is still filling,
        # if its prompt check ends before that pass's fill wait does.
        admit = PROMPT_CHECK_SECONDS
        for f in filling:
            if f.shape == shape and f.room >= images and f.fill_ends_in > admit:
                size = cap_of(shape) - f.room + images
                start = f.started_in + _fill_wait_of(shape) if size < cap_of(shape) else admit
                joined = start + pass_seconds(shape, size, costs)
                end = joined if end is None else min(end, joined)
    if end is None:  # cannot happen with the real policy; stay honest with the plain bound
        end = work_ahead / gpus + pass_seconds(shape, images, costs) + _fill_wait_of(shape)
    overhead = cost_model.overhead(costs)
    return Estimate(end + overhead, len(ahead), work_ahead, queued_images, gpus)


def queued_ends(shape: str, model_name: str | None = None) -> dict[str, float]:
    """Seconds from now until the pass of each job queued in `shape`'s bucket ends, plus the
    overhead: one replay for them all (what estimate(..., job_id=j) answers for each j)."""
    from scheduling.heartbeats import live_workers

    model_name = model_name or lane_of_shape(shape)
    now = time.time()
    costs = cost_model.costs()
    workers = live_workers(model_name)
    buckets, weights, _, lanes = _queued_on(model_name, workers)
    targets = {e[0] for e in buckets[shape].entries()} if shape in buckets else set()
    if not targets or not workers:
        return {}
    free_in, _ = _running(workers, costs, now)
    overhead = cost_model.overhead(costs)
    ends = replay_all(buckets, free_in, targets, now, costs, _arrival_rates(lanes, now), weights)
    return {j: end + overhead for j, end in ends.items()}


def _sort(buckets: policy.Buckets) -> None:
    """Each tier's queue in enqueue order (jobs in the prompt check and the new job join by time)."""
    for bucket in buckets.values():
        for queue in bucket.tiers:
            ordered = sorted(queue, key=lambda e: e[2])
            queue.clear()
            queue.extend(ordered)
