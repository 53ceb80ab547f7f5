"""The scheduler's Lua (in Redis) and the Python policy make identical decisions, so the fleet
simulation and the wait estimate, which drive the Python policy, exercise the real scheduler."""

from __future__ import annotations

import random

import pytest
from django.test import override_settings

from imagegen.redis_client import get_redis
from scheduling import policy, scheduler


def cap_of_factory(caps: dict, default: int):
    def cap_of(shape: str) -> int:
        return caps.get(shape.split("|")[1], default)

    return cap_of


def _clear(model: str, shapes) -> None:
    r = get_redis()
    for shape in shapes:
        r.delete(f"ig:q:{shape}", f"ig:qb:{shape}", f"ig:drr:{shape}")
    r.delete(f"ig:shapes:{model}", scheduler.WEIGHTS_KEY)


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "fifo"])
@pytest.mark.parametrize("seed", range(6))
def test_lua_and_python_take_the_same_batches(redis_client, seed, fair):
    """Random arrivals of several owners (with weights), both tiers, full takes and fill takes:
    every take returns the same jobs in the same order, and the carried deficits agree."""
    rng = random.Random(seed)
    model = f"policy-{seed}-{fair}"
    caps = {"64x64": 4, "96x96": 2}
    sizes = [(64, 64), (96, 64), (96, 96), (64, 96)]
    shapes = [scheduler.shape_key("v", w, h, rng.choice([10, 20]), 5.0, "") for w, h in sizes]
    owners = ["1", "2", "3", "4", "5"]
    weights = {"2": 2.0, "3": 0.5, "5": 0.3}
    mirror: policy.Buckets = {}
    now = 1_000_000.0
    _clear(model, shapes)
    with override_settings(IMAGEGEN_BATCH_CAPS=caps, IMAGEGEN_BATCH_CAP=8, IMAGEGEN_STARVATION_SECONDS=30.0,
                           IMAGEGEN_FAIR_SHARE=fair):
        cap_of = cap_of_factory(caps, 8)
        for step in range(500):
            now += rng.random() * 3
            if rng.random() < 0.6:
                shape = rng.choice(shapes)
                owner = rng.choice(owners[:2] * 3 + owners)  # two heavy owners
                tier = policy.BATCH if rng.random() < 0.25 else policy.INTERACTIVE
                job, count = f"j{seed}-{step}", rng.choice([1, 1, 2, 3, 8])
                scheduler.enqueue(model, shape, job, count, now, owner=owner, tier=tier, weight=weights.get(owner, 1.0))
                policy.push(mirror, shape, (job, count, now, owner, tier))
            else:
                fill = rng.random() < 0.3 and mirror
                only = rng.choice(sorted(mirror)) if fill else ""
                max_images = rng.choice([1, 2, 3]) if fill else 0
                got = scheduler.take(model, only_shape=only, max_images=max_images, now=now)
                want = policy.take(mirror, now, cap_of, 30.0, only_shape=only, max_images=max_images, fair=fair,
                                   weights=weights)
                if only and only in mirror and not mirror[only]:
                    del mirror[only]
                if want is None:
                    assert got is None, (step, got)
                else:
                    assert got is not None, (step, want)
                    assert got.shape == want[0]
                    assert [(e.job_id, e.count, e.owner) for e in got.entries] == [(j, n, o) for j, n, _, o, _ in want[1]]
                if step % 25 == 0:
                    state, _ = scheduler.snapshot(model)
                    assert {s: (b.entries(), b.deficits) for s, b in state.items()} == {
                        s: (b.entries(), b.deficits) for s, b in mirror.items() if b
                    }, step
    _clear(model, shapes)


def test_a_starving_shape_goes_before_a_fuller_one(redis_client):
    buckets: policy.Buckets = {}
    for i in range(8):
        policy.push(buckets, "v|64x64|20|5|", (f"a{i}", 1, 100.0 + i, "1", 0))
    policy.push(buckets, "v|96x96|20|5|", ("old", 1, 1.0, "2", 0))
    shape, taken = policy.take(buckets, 120.0, lambda s: 8, starvation=60.0)
    assert shape == "v|96x96|20|5|" and [t[0] for t in taken] == ["old"]
    shape, taken = policy.take(buckets, 120.0, lambda s: 8, starvation=60.0)
    assert shape == "v|64x64|20|5|" and len(taken) == 8


HEAVY_AND_LIGHT = "v|64x64|20|5|"


def _heavy_backlog(jobs: int = 16, images: int = 8) -> policy.Buckets:
    buckets: policy.Buckets = {}
    for i in range(jobs):
        policy.push(buckets, HEAVY_AND_LIGHT, (f"heavy{i}", images, 100.0 + i, "heavy", 0))
    return buckets


def test_a_light_job_rides_in_the_next_pass_behind_a_heavy_backlog():
    buckets = _heavy_backlog(jobs=16, images=4)
    policy.push(buckets, HEAVY_AND_LIGHT, ("light", 1, 200.0, "light", 0))
    _, first = policy.take(buckets, 201.0, lambda s: 8, starvation=60.0)
    assert [e[0] for e in first] == ["light", "heavy0"]  # not behind 64 images
    fifo_buckets = _heavy_backlog(jobs=16, images=4)
    policy.push(fifo_buckets, HEAVY_AND_LIGHT, ("light", 1, 200.0, "light", 0))
    _, fifo = policy.take(fifo_buckets, 201.0, lambda s: 8, 60.0, fair=False)
    assert [e[0] for e in fifo] == ["heavy0", "heavy1"]


def test_the_pass_still_fills_to_its_cap():
    """Light jobs go first, then the heavy owner's jobs fill the room that is left."""
    buckets = _heavy_backlog(jobs=4, images=2)
    for i in range(3):
        policy.push(buckets, HEAVY_AND_LIGHT, (f"light{i}", 1, 150.0 + i, f"l{i}", 0))
    _, taken = policy.take(buckets, 200.0, lambda s: 8, starvation=60.0)
    assert sum(e[1] for e in taken) == 7  # 3 light + 2 heavy jobs of 2: the next 2 does not fit 1
    assert {e[0] for e in taken} == {"light0", "light1", "light2", "heavy0", "heavy1"}
    # A fill take for the last image finds nothing that fits (the heavy jobs are of 2).
    assert policy.take(buckets, 200.0, lambda s: 8, 60.0, only_shape=HEAVY_AND_LIGHT, max_images=1) is None


def test_a_job_its_deficit_covers_but_that_does_not_fit_goes_first_next_time():
    """Deficit round robin carries the credit: an 8-image job kept out by light jobs runs in
    the next pass even when more light jobs arrive (no starvation of large jobs)."""
    buckets = _heavy_backlog(jobs=2, images=8)
    policy.push(buckets, HEAVY_AND_LIGHT, ("light0", 1, 150.0, "l0", 0))
    _, taken = policy.take(buckets, 200.0, lambda s: 8, starvation=60.0)
    assert [e[0] for e in taken] == ["light0"]
    assert buckets[HEAVY_AND_LIGHT].deficits[(0, "heavy")] == 8.0
    for i in range(1, 9):
        policy.push(buckets, HEAVY_AND_LIGHT, (f"light{i}", 1, 200.0 + i, f"l{i}", 0))
    _, taken = policy.take(buckets, 210.0, lambda s: 8, starvation=60.0)
    assert [e[0] for e in taken] == ["heavy0"]


def test_weights_share_the_pass():
    buckets: policy.Buckets = {}
    for i in range(8):
        policy.push(buckets, HEAVY_AND_LIGHT, (f"a{i}", 1, 100.0 + i, "a", 0))
        policy.push(buckets, HEAVY_AND_LIGHT, (f"b{i}", 1, 100.5 + i, "b", 0))
    _, taken = policy.take(buckets, 200.0, lambda s: 6, starvation=60.0, weights={"b": 2.0})
    assert sorted(e[3] for e in taken) == ["a", "a", "b", "b", "b", "b"]


def test_batch_work_fills_but_goes_after_interactive_work():
    buckets: policy.Buckets = {}
    for i in range(6):
        policy.push(buckets, HEAVY_AND_LIGHT, (f"b{i}", 1, 10.0 + i, "bulk", policy.BATCH))
    policy.push(buckets, "v|96x96|20|5|", ("i0", 1, 100.0, "user", policy.INTERACTIVE))
    policy.push(buckets, HEAVY_AND_LIGHT, ("i1", 2, 101.0, "user", policy.INTERACTIVE))
    # The batch shape has older and more work, but a shape with interactive work goes first.
    shape, taken = policy.take(buckets, 102.0, lambda s: 8, starvation=60.0)
    assert shape == HEAVY_AND_LIGHT and [e[0] for e in taken] == ["i1", "b0", "b1", "b2", "b3", "b4", "b5"]
    shape, taken = policy.take(buckets, 102.0, lambda s: 8, starvation=60.0)
    assert shape == "v|96x96|20|5|" and [e[0] for e in taken] == ["i0"]
    # Starving batch work waits on interactive work all the same (its own wait limit is at admission).
    policy.push(buckets, HEAVY_AND_LIGHT, ("b9", 1, 1.0, "bulk", policy.BATCH))
    policy.push(buckets, "v|96x96|20|5|", ("i2", 1, 500.0, "user", policy.INTERACTIVE))
    shape, _ = policy.take(buckets, 501.0, lambda s: 8, starvation=60.0)
    assert shape == "v|96x96|20|5|"
