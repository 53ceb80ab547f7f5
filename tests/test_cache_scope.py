"""The request-hash cache is not an oracle (issue 18, item 9): by default an entry serves another
user only once k users asked for it (tests/test_integrity_cache_share.py), and then as a fresh job
would (tests/test_cache_privacy.py); IMAGEGEN_CACHE_SCOPE=global-unseeded shares requests without an
explicit seed (the fixed-seed policy's repeats) and keeps seeded ones per user; global shares all."""

from __future__ import annotations

import pytest

from jobs.models import GenerationJob
from tests.conftest import wait_for_status, wait_until_cached
from tests.test_generation import submit

pytestmark = pytest.mark.django_db(transaction=True)


def test_by_default_another_users_seeded_request_is_not_served_from_the_cache(workers, alice_api, bob_api):
    first = submit(alice_api, seed=4243, steps=2, prompt="a teal square on a grey background")
    wait_until_cached(wait_for_status(first["id"], ("done",)))
    probe = submit(bob_api, seed=4243, steps=2, prompt="a teal square on a grey background")
    assert probe["status"] == "queued", "bob learned in one request that alice asked for this (prompt, seed)"
    assert wait_for_status(probe["id"], ("done",)).batch_id is not None  # generated for him
    mine = submit(alice_api, seed=4243, steps=2, prompt="a teal square on a grey background")
    assert mine["status"] == "done"  # her own repeat still hits


def test_global_unseeded_scope_shares_only_requests_without_a_seed(workers, alice_api, bob_api, settings):
    settings.IMAGEGEN_CACHE_SCOPE = "global-unseeded"
    settings.IMAGEGEN_SEED_POLICY = "fixed"
    settings.IMAGEGEN_FIXED_SEED = 12
    unseeded = {"steps": 2, "prompt": "a maroon circle on a cream background"}
    first = alice_api.post("/api/v1/jobs", unseeded, format="json").json()
    wait_until_cached(wait_for_status(first["id"], ("done",)))
    shared = bob_api.post("/api/v1/jobs", unseeded, format="json").json()
    assert shared["status"] == "done" and GenerationJob.objects.get(id=shared["id"]).batch_id is None
    seeded = submit(alice_api, seed=77, steps=2, prompt="a maroon square on a cream background")
    wait_until_cached(wait_for_status(seeded["id"], ("done",)))
    assert submit(bob_api, seed=77, steps=2, prompt="a maroon square on a cream background")["status"] == "queued"
