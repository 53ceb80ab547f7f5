"""Fair share and priority tiers through the real API, Redis, Celery and GPU worker: a light
user's job rides in the next pass behind a heavy user's backlog; batch work waits for
interactive work (scheduling/policy.py holds the rules; tests/test_scheduler_policy.py holds the
Lua and the Python twin identical)."""

from __future__ import annotations

import pytest

from jobs.models import Batch, GenerationJob
from tests.test_batching import gpu_held, wait_all, wait_scheduled
from tests.test_generation import submit

pytestmark = pytest.mark.django_db(transaction=True)


def _pass_order(job_ids) -> list:
    """The batches of these jobs, in the order the GPU worker took them."""
    batches = {GenerationJob.objects.get(id=j).batch_id for j in job_ids}
    return sorted(Batch.objects.filter(id__in=batches), key=lambda b: b.started_at)


def test_a_light_job_rides_in_the_next_pass_behind_a_heavy_backlog(workers, alice_api, bob_api):
    """Alice queues five passes' worth (five jobs of 4 images, the cap) while the GPU is busy;
    Bob then asks for one image of the same shape. First in, first out he would wait five
    passes; with fair share his job is in the first pass the worker takes once the blocker is
    cancelled (or the second, should one of Alice's have been taken ahead)."""
    with gpu_held(alice_api) as blocker:
        heavy = [submit(alice_api, seed=300 + i, steps=3, count=4, prompt="heavy user")["id"] for i in range(5)]
        light = submit(bob_api, seed=400, steps=3, count=1, prompt="light user")["id"]
        wait_scheduled([*heavy, light], blocker)
    jobs = wait_all([*heavy, light], timeout=180)
    order = _pass_order([*heavy, light])
    light_job = next(j for j in jobs if str(j.id) == light)
    place = [b.id for b in order].index(light_job.batch_id)
    assert place <= 1, f"the light job ran in pass {place + 1} of {len(order)}"
    # Every one of Alice's passes was full: the light job did not cost her fill.
    assert all(b.size == 4 for b in order if b.id != light_job.batch_id)


def test_batch_work_waits_for_interactive_work_of_the_same_shape(workers, alice_api, bob_api):
    """Batch jobs queued first still go after interactive jobs queued later: at most the pass
    already taken holds batch work."""
    with gpu_held(alice_api) as blocker:
        batch = [submit(alice_api, seed=500 + i, steps=3, count=4, priority="batch", prompt="batch work")["id"]
                 for i in range(3)]
        interactive = [submit(bob_api, seed=600 + i, steps=3, count=4, prompt="interactive")["id"] for i in range(2)]
        wait_scheduled([*batch, *interactive], blocker)
    wait_all([*batch, *interactive], timeout=180)
    order = [b.id for b in _pass_order([*batch, *interactive])]
    inter_places = sorted(order.index(GenerationJob.objects.get(id=j).batch_id) for j in interactive)
    assert inter_places[-1] <= 2, f"interactive work ran in passes {inter_places} of {len(order)}"
    assert GenerationJob.objects.get(id=batch[-1]).priority == "batch"
