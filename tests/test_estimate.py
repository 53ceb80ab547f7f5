"""The wait estimate: the measured pass-time model and the replay of the scheduler."""

from __future__ import annotations

import time

import pytest

from imagegen.redis_client import get_redis
from jobs.admission.replay import replay
from scheduling import policy, scheduler
from scheduling.costs import COST_KEY, OVERHEAD_FIELD, pass_seconds, record_batch_cost

A = scheduler.shape_key("m", 64, 64, 20, 5.0, "")
B = scheduler.shape_key("m", 96, 96, 10, 5.0, "")


def _buckets(jobs: dict) -> policy.Buckets:
    """The policy's buckets: each job its own owner, interactive."""
    out: policy.Buckets = {}
    for shape, entries in jobs.items():
        for job_id, n, t in entries:
            policy.push(out, shape, (job_id, n, t, job_id, policy.INTERACTIVE))
    return out


@pytest.fixture
def knobs(settings):
    settings.IMAGEGEN_BATCH_CAP = 4
    settings.IMAGEGEN_BATCH_CAPS = {}
    settings.IMAGEGEN_FILL_WAIT = 0.3
    settings.IMAGEGEN_STARVATION_SECONDS = 10.0
    return settings


@pytest.fixture
def redis_clean(redis_client):
    def clean():
        for key in [COST_KEY, *redis_client.scan_iter("ig:arr:est-test:*"), *redis_client.scan_iter("ig:q:m|*"), "ig:shapes:est-test"]:
            redis_client.delete(key)

    clean()
    yield redis_client
    clean()


def test_pass_time_is_measured_per_size_and_interpolated_between_sizes():
    costs = {f"{A}#1": "2.0", f"{A}#4": "2.9"}
    assert pass_seconds(A, 1, costs) == 2.0
    assert pass_seconds(A, 2, costs) == pytest.approx(2.3)
    assert pass_seconds(A, 6, costs) == pytest.approx(2.9 + 2 * 0.3)  # along the last two sizes
    # below every measured size: along the slope, but never cheaper per image than measured
    assert pass_seconds(A, 1, {f"{A}#3": "2.6", f"{A}#4": "2.9"}) == pytest.approx(2.0)
    assert pass_seconds(A, 1, {f"{A}#3": "0.3", f"{A}#4": "2.9"}) == pytest.approx(0.1)
    # nothing per size yet: the per-image figure
    assert pass_seconds(A, 3, {A: "0.5"}) == pytest.approx(1.5)


def test_recording_a_pass_keeps_moving_averages_per_shape_and_size(redis_clean):
    record_batch_cost(A, 4, 2.0)
    record_batch_cost(A, 4, 3.0)
    record_batch_cost(A, 1, 1.0)
    costs = get_redis().hgetall(COST_KEY)
    assert float(costs[f"{A}#4"]) == pytest.approx(0.3 * 3.0 + 0.7 * 2.0)
    assert float(costs[f"{A}#1"]) == pytest.approx(1.0)
    assert f"{A}#2" not in costs


def test_the_replay_ends_when_the_pass_that_takes_the_job_ends(knobs):
    now = time.time()
    buckets = _buckets({A: [(f"j{i}", 1, now - 10 + i) for i in range(6)]})
    costs = {f"{A}#4": "3.0", f"{A}#2": "2.0"}
    # GPU 1 is free in 1 s and takes a full pass (j0-j3) ending at 4; GPU 2 is free in 2 s,
    # takes the last two, waits the fill wait for more (none comes) and ends at 2.3 + 2.0.
    assert replay(buckets, [1.0, 2.0], "j5", now, costs) == pytest.approx(4.3)
    buckets = _buckets({A: [(f"j{i}", 1, now - 10 + i) for i in range(6)]})
    assert replay(buckets, [1.0, 2.0], "j1", now, costs) == pytest.approx(4.0)


def test_forecast_arrivals_keep_a_rare_shape_waiting_until_the_starvation_bound(knobs):
    now = time.time()
    costs = {f"{A}#4": "2.0", f"{B}#1": "1.0"}

    def buckets():
        return _buckets({A: [(f"a{i}", 1, now - 1) for i in range(4)], B: [("target", 1, now)]})

    # Without arrivals the fullest bucket (A) goes first, then the target: 2 + 0.3 + 1.
    assert replay(buckets(), [0.0], "target", now, costs) == pytest.approx(3.3)
    # With A arriving at 2 images/s, A stays full; the target waits until it has waited more
    # than the starvation bound (taken at 12 s), then its partial pass fills and runs.
    assert replay(buckets(), [0.0], "target", now, costs, {A: 2.0}) == pytest.approx(13.3)


def test_arrivals_are_counted_once_per_entry(redis_clean):
    scheduler.enqueue("est-test", A, "job-1", 2, time.time())
    scheduler.enqueue("est-test", A, "job-1", 2, time.time())  # a rebuild re-adding it
    scheduler.enqueue("est-test", B, "job-2", 1, time.time())
    rates = scheduler.arrival_rates("est-test")
    window = (scheduler.ARRIVAL_WINDOWS - 1) * scheduler.ARRIVAL_WINDOW
    assert 2 / (window + scheduler.ARRIVAL_WINDOW) <= rates[A] <= 2 / window
    assert rates[A] == pytest.approx(2 * rates[B])


@pytest.mark.django_db(transaction=True)
def test_a_delivered_pass_feeds_its_time_and_the_overhead_to_the_estimate(workers, alice_api):
    from tests.conftest import wait_for_status
    from tests.test_generation import submit

    get_redis().delete(COST_KEY)
    job = wait_for_status(submit(alice_api, seed=5150, prompt="a green square", steps=3)["id"], ("done",))
    shape = scheduler.shape_key(job.model_version, 64, 64, 3, job.guidance_scale, job.scheduler)
    costs = get_redis().hgetall(COST_KEY)
    assert float(costs[f"{shape}#1"]) == pytest.approx(job.batch.gpu_seconds, rel=1e-6)
    overhead = float(costs[OVERHEAD_FIELD])
    total = (job.finished_at - job.started_at).total_seconds()
    assert 0 <= overhead < total
