"""The batch scheduler's decision, in plain Python: which shape a free worker takes and which
jobs of it. gpu_tasks/scheduler.py runs the same rules inside Redis (Lua) for atomicity; a
differential test (tests/test_scheduler_policy.py) holds the two to identical answers, so the
fleet simulation (bench/fleet_sim.py), which calls this module, exercises the real policy.

Rules: a shape whose oldest job has waited past the starvation bound goes first (the oldest
such); otherwise the fullest bucket (images ready, capped at the shape's cap), ties to the
older head. Jobs are taken whole, FIFO, while they fit the cap; a lone job larger than the cap
runs alone. With only_shape/max_images (filling a partial batch), only jobs that fit are taken.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

# An entry: (job_id, images, enqueued_at); buckets: shape -> deque of entries in FIFO order.
Entry = tuple[str, int, float]
HEAD_SCAN = 32  # entries read from a bucket's head (the Lua reads 64 members = 32 pairs)


def choose_shape(buckets: dict[str, deque], now: float, cap_of: Callable[[str], int], starvation: float) -> str | None:
    best = None
    best_images = -1
    best_oldest = 0.0
    starving = False
    for shape in sorted(buckets):  # Redis SMEMBERS order is arbitrary; ties broken by age below
        bucket = buckets[shape]
        if not bucket:
            continue
        cap = cap_of(shape)
        oldest = bucket[0][2]
        images = 0
        for i, (_, n, _) in enumerate(bucket):
            if i >= HEAD_SCAN:
                break
            images += n
            if images >= cap:
                break
        images = min(images, cap)
        if now - oldest > starvation:
            if not starving or oldest < best_oldest:
                best, best_images, best_oldest, starving = shape, images, oldest, True
        elif not starving:
            if images > best_images or (images == best_images and oldest < best_oldest):
                best, best_images, best_oldest = shape, images, oldest
    return best


def take_from(bucket: deque, cap: int, fill_only: bool) -> list[Entry]:
    taken: list[Entry] = []
    total = 0
    scanned = 0
    while bucket and scanned < HEAD_SCAN:
        job_id, n, t = bucket[0]
        if total + n > cap and not (total == 0 and not fill_only):
            break
        taken.append(bucket.popleft())
        total += n
        scanned += 1
        if total >= cap:
            break
    return taken


def take(buckets: dict[str, deque], now: float, cap_of: Callable[[str], int], starvation: float,
         only_shape: str = "", max_images: int = 0) -> tuple[str, list[Entry]] | None:
    if only_shape:
        shape = only_shape if buckets.get(only_shape) else None
    else:
        shape = choose_shape(buckets, now, cap_of, starvation)
    if shape is None:
        return None
    cap = cap_of(shape)
    if 0 < max_images < cap:
        cap = max_images
    taken = take_from(buckets[shape], cap, fill_only=max_images > 0)
    if not buckets[shape] and not only_shape:
        del buckets[shape]
    return (shape, taken) if taken else None


def buckets_from(entries: Iterable[tuple[str, Entry]]) -> dict[str, deque]:
    out: dict[str, deque] = {}
    for shape, entry in sorted(entries, key=lambda se: (se[0], se[1][2])):
        out.setdefault(shape, deque()).append(entry)
    return out
