"""The batch scheduler's decision, in plain Python: which shape a free worker takes and which
jobs of it. scheduling/scheduler.py runs the same rules inside Redis (Lua) for atomicity; a
differential test (tests/test_scheduler_policy.py) holds the two to identical answers, so the
fleet simulation (bench/fleet_sim.py) and the wait estimate (jobs/admission/control.py), which call
this module, exercise the real policy.

Each shape has two tiers of FIFO queues: interactive (the default) and batch.

Choosing the shape: a shape with interactive work always goes before a shape with batch work
only (batch work runs on GPUs that interactive work leaves idle). Among shapes with interactive
work, one whose oldest interactive job has waited past the starvation bound goes first (the
oldest such); otherwise the one with the most interactive images ready (capped at the shape's
cap), then the most images ready in both tiers, ties to the older head. Among batch-only
shapes, the same with the batch tier's heads.

Taking jobs of the shape (fair share): deficit round robin by images across owners, the
interactive tier first, then the batch tier fills what room is left. Each owner with queued
work in the tier is a flow, visited in the order of its oldest job. In each round a flow's
deficit grows by the owner's weight (IMAGEGEN_USER_WEIGHTS, default 1), and the flow sends its
head job while the job's images are within the deficit (the deficit shrinks by them). A job that
its deficit covers but that does not fit the room left blocks its flow for this take (the flow
keeps its deficit, so it goes first next time); other flows still fill the pass. Rounds repeat
until the pass is full or every flow is blocked or empty. A flow whose queue empties drops its
deficit (as in DRR). Jobs are taken whole; a lone job larger than the cap runs alone. With
only_shape/max_images (filling a partial batch), only jobs that fit are taken.

With fairness off (IMAGEGEN_FAIR_SHARE=false) each tier is taken FIFO instead, stopping at the
first job that does not fit: the scheduler before fair share, kept for comparison
(bench/fairness.py).

Fairness applies across the first HEAD_SCAN jobs of each tier of a shape (the oldest); with the
per-user in-flight limit that is at least HEAD_SCAN / IMAGEGEN_USER_MAX_IN_FLIGHT owners.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice

# An entry: (job_id, images, enqueued_at, owner, tier); tier 0 interactive, 1 batch.
Entry = tuple[str, int, float, str, int]
INTERACTIVE, BATCH = 0, 1
TIERS = (INTERACTIVE, BATCH)
TIER_NAMES = ("interactive", "batch")
HEAD_SCAN = 64  # entries read from the head of each tier of a bucket (the Lua reads the same)
MIN_WEIGHT = 0.1  # bounds the rounds one take runs


@dataclass
class Bucket:
    """One shape's queued work: a FIFO deque per tier, and the carried deficit per flow."""

    tiers: tuple[deque, deque] = field(default_factory=lambda: (deque(), deque()))
    deficits: dict[tuple[int, str], float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tiers[0]) + len(self.tiers[1])

    def append(self, entry: Entry) -> None:
        self.tiers[entry[4]].append(entry)

    def entries(self) -> list[Entry]:
        return [*self.tiers[0], *self.tiers[1]]


Buckets = dict[str, Bucket]


def _ready(queue: deque, cap: int) -> int:
    images = 0
    for i, entry in enumerate(queue):
        if i >= HEAD_SCAN:
            break
        images += entry[1]
        if images >= cap:
            break
    return min(images, cap)


def _rank(bucket: Bucket, cap: int, now: float, starvation: float) -> tuple:
    inter, batch = bucket.tiers
    if inter:
        oldest = inter[0][2]
        if now - oldest > starvation:
            return (0, oldest)
        ready = _ready(inter, cap)
        return (1, -ready, -min(cap, ready + _ready(batch, cap)), oldest)
    oldest = batch[0][2]
    if now - oldest > starvation:
        return (2, oldest)
    return (3, -_ready(batch, cap), oldest)


def choose_shape(buckets: Buckets, now: float, cap_of: Callable[[str], int], starvation: float) -> str | None:
    best, best_rank = None, None
    for shape in sorted(buckets):  # the Lua sorts SMEMBERS the same way; ties keep the first
        bucket = buckets[shape]
        if not bucket:
            continue
        rank = _rank(bucket, cap_of(shape), now, starvation)
        if best_rank is None or rank < best_rank:
            best, best_rank = shape, rank
    return best


def _take_fifo(queue: deque, room: int, fill_only: bool, total: int) -> list[Entry]:
    taken: list[Entry] = []
    scanned = 0
    while queue and scanned < HEAD_SCAN:
        n = queue[0][1]
        if total + n > room and not (total == 0 and not fill_only):
            break
        taken.append(queue.popleft())
        total += n
        scanned += 1
        if total >= room:
            break
    return taken


def _take_fair(bucket: Bucket, tier: int, room: int, fill_only: bool, total: int,
               weights: dict[str, float]) -> list[Entry]:
    queue = bucket.tiers[tier]
    scan = min(HEAD_SCAN, len(queue))
    head = list(islice(queue, scan))
    flows: dict[str, list[int]] = {}
    for i, entry in enumerate(head):
        flow = flows.get(entry[3])
        if flow is None:
            flows[entry[3]] = [i]
        else:
            flow.append(i)
    order = list(flows)  # by first appearance: the oldest job's owner first
    lists = [flows[o] for o in order]
    deficit = [bucket.deficits.get((tier, o), 0.0) for o in order]
    weight = [max(MIN_WEIGHT, weights.get(o, 1.0)) for o in order] if weights else [1.0] * len(order)
    pos = [0] * len(order)
    picked: list[int] = []
    full = total >= room
    active = [] if full else list(range(len(order)))
    while active:  # one round: each flow not blocked and not empty, in order
        still = []
        for k in active:
            d = deficit[k] + weight[k]
            indices, p, blocked = lists[k], pos[k], False
            while p < len(indices):
                n = head[indices[p]][1]
                if n > d:
                    break
                if total + n > room and not (total == 0 and not fill_only):
                    blocked = True  # covered but does not fit: keeps its deficit for next time
                    break
                picked.append(indices[p])
                p += 1
                d -= n
                total += n
                if total >= room:
                    full = True
                    break
            deficit[k], pos[k] = d, p
            if full:
                break
            if p < len(indices) and not blocked:
                still.append(k)
        active = [] if full else still
    for k, owner in enumerate(order):
        if pos[k] < len(lists[k]):
            bucket.deficits[(tier, owner)] = deficit[k]
        else:
            bucket.deficits.pop((tier, owner), None)
    if not picked:
        return []
    chosen = set(picked)
    for _ in range(scan):
        queue.popleft()
    queue.extendleft(reversed([e for i, e in enumerate(head) if i not in chosen]))
    return [head[i] for i in picked]


def take_from(bucket: Bucket, cap: int, fill_only: bool, fair: bool = True,
              weights: dict[str, float] | None = None) -> list[Entry]:
    taken: list[Entry] = []
    for tier in TIERS:
        total = sum(e[1] for e in taken)
        if total >= cap or not bucket.tiers[tier]:
            continue
        if fair:
            taken += _take_fair(bucket, tier, cap, fill_only, total, weights or {})
        else:
            taken += _take_fifo(bucket.tiers[tier], cap, fill_only, total)
    if not bucket:
        bucket.deficits.clear()
    return taken


def take(buckets: Buckets, now: float, cap_of: Callable[[str], int], starvation: float,
         only_shape: str = "", max_images: int = 0, fair: bool = True,
         weights: dict[str, float] | None = None) -> tuple[str, list[Entry]] | None:
    if only_shape:
        shape = only_shape if buckets.get(only_shape) else None
    else:
        shape = choose_shape(buckets, now, cap_of, starvation)
    if shape is None:
        return None
    cap = cap_of(shape)
    if 0 < max_images < cap:
        cap = max_images
    taken = take_from(buckets[shape], cap, fill_only=max_images > 0, fair=fair, weights=weights)
    if not buckets[shape] and not only_shape:
        del buckets[shape]
    return (shape, taken) if taken else None


def push(buckets: Buckets, shape: str, entry: Entry) -> None:
    buckets.setdefault(shape, Bucket()).append(entry)


def buckets_from(entries: Iterable[tuple[str, Entry]],
                 deficits: dict[str, dict[tuple[int, str], float]] | None = None) -> Buckets:
    out: Buckets = {}
    for shape, entry in sorted(entries, key=lambda se: (se[0], se[1][2])):
        push(out, shape, entry)
    for shape, carried in (deficits or {}).items():
        if shape in out:
            out[shape].deficits.update(carried)
    return out

