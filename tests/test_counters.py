"""Counters only go up (issue 18, item 7): imagegen_jobs_total and
imagegen_safety_decisions_total are counted when jobs change status and verdicts are recorded,
not computed from rows, so deleting jobs never makes them fall."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for_status
from tests.test_generation import submit
from tests.test_metrics_ops import scrape

pytestmark = pytest.mark.django_db(transaction=True)


def series(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_job_and_verdict_counters_never_fall_when_jobs_are_deleted(workers, alice_api):
    done = submit(alice_api, steps=2, seed=4711, prompt="a counted green circle")
    blocked = submit(alice_api, steps=2, seed=4712, prompt="a pile of bloody gore and severed limbs")
    wait_for_status(done["id"], ("done",))
    wait_for_status(blocked["id"], ("blocked",))
    before = scrape()
    jobs, verdicts = series(before, "imagegen_jobs_total"), series(before, "imagegen_safety_decisions_total")
    assert jobs.get('imagegen_jobs_total{status="done",version="tiny-random"}', 0) >= 1, jobs
    assert jobs.get('imagegen_jobs_total{status="blocked",version="tiny-random"}', 0) >= 1, jobs
    assert any('decision="block"' in k and 'stage="prompt"' in k for k in verdicts), verdicts
    for job in (done, blocked):
        assert alice_api.delete(f"/api/v1/jobs/{job['id']}").status_code == 204
    after = scrape()
    for name, was in (("imagegen_jobs_total", jobs), ("imagegen_safety_decisions_total", verdicts)):
        now = series(after, name)
        fell = {k: (v, now.get(k, 0.0)) for k, v in was.items() if now.get(k, 0.0) < v}
        assert not fell, f"{name} fell after a DELETE: {fell}"
