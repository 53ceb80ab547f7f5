"""The scheduler's Lua (in Redis) and the Python policy make identical decisions, so the fleet
simulation that drives the Python policy exercises the real scheduler."""

from __future__ import annotations

import random
from collections import deque

import pytest
from django.test import override_settings

from imagegen.redis_client import get_redis
from scheduling import policy, scheduler


def cap_of_factory(caps: dict, default: int):
    def cap_of(shape: str) -> int:
        return caps.get(shape.split("|")[1], default)

    return cap_of


@pytest.mark.parametrize("seed", range(6))
def test_lua_and_python_take_the_same_batches(redis_client, seed):
    rng = random.Random(seed)
    model = f"policy-{seed}"
    caps = {"64x64": 4, "96x96": 2}
    sizes = [(64, 64), (96, 64), (96, 96), (64, 96)]
    shapes = [scheduler.shape_key("v", w, h, rng.choice([10, 20]), 5.0, "") for w, h in sizes]
    mirror: dict[str, deque] = {}
    now = 1_000_000.0
    with override_settings(IMAGEGEN_BATCH_CAPS=caps, IMAGEGEN_BATCH_CAP=8, IMAGEGEN_STARVATION_SECONDS=30.0):
        cap_of = cap_of_factory(caps, 8)
        for step in range(400):
            now += rng.random() * 3
            if rng.random() < 0.6:
                shape = rng.choice(shapes)
                job, count = f"j{seed}-{step}", rng.choice([1, 1, 2, 3, 8])
                scheduler.enqueue(model, shape, job, count, now)
                mirror.setdefault(shape, deque()).append((job, count, now))
            else:
                fill = rng.random() < 0.3 and mirror
                only = rng.choice(sorted(mirror)) if fill else ""
                max_images = rng.choice([1, 2, 3]) if fill else 0
                got = scheduler.take(model, only_shape=only, max_images=max_images, now=now)
                want = policy.take(mirror, now, cap_of, 30.0, only_shape=only, max_images=max_images)
                if only and only in mirror and not mirror[only]:
                    del mirror[only]
                if want is None:
                    assert got is None, (step, got)
                else:
                    assert got is not None, (step, want)
                    assert got.shape == want[0]
                    assert [(e.job_id, e.count) for e in got.entries] == [(j, n) for j, n, _ in want[1]]
    r = get_redis()
    for shape in shapes:
        r.delete(f"ig:q:{shape}")
    r.delete(f"ig:shapes:{model}")


def test_a_starving_shape_goes_before_a_fuller_one(redis_client):
    buckets = {
        "v|64x64|20|5|": deque([(f"a{i}", 1, 100.0 + i) for i in range(8)]),
        "v|96x96|20|5|": deque([("old", 1, 1.0)]),
    }
    shape, taken = policy.take(buckets, 120.0, lambda s: 8, starvation=60.0)
    assert shape == "v|96x96|20|5|" and [t[0] for t in taken] == ["old"]
    shape, taken = policy.take(buckets, 120.0, lambda s: 8, starvation=60.0)
    assert shape == "v|64x64|20|5|" and len(taken) == 8
