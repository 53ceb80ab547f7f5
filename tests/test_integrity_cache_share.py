"""Cross-user cache hits without the oracle (issue 28, item 14): under the k-anonymous scope an
entry is shared only once k distinct users asked for it, a cross-user hit is answered like a
fresh job (queued, done no sooner than a fresh job of its shape would be: issue 44 item 8 made it
go the whole way of one, tests/test_cache_privacy.py), and the owner's own repeats stay instant."""

from __future__ import annotations

import pytest

from jobs.media import cache
from jobs.models import GenerationJob
from tests.conftest import client_for, make_user, wait_for_status, wait_until_cached
from tests.test_generation import submit

pytestmark = pytest.mark.django_db(transaction=True)

REQUEST = {"seed": 6262, "steps": 2, "prompt": "a coral hexagon on a mint background"}


def test_a_request_is_shared_only_once_k_users_asked_and_never_faster_than_a_fresh_job(workers, alice_api, bob_api, settings):
    settings.IMAGEGEN_CACHE_SCOPE = "k-anonymous"
    settings.IMAGEGEN_CACHE_SHARE_K = 3
    first = submit(alice_api, **REQUEST)
    first_job = wait_for_status(first["id"], ("done",))
    wait_until_cached(first_job)
    first_image = first_job.images.get()

    second = submit(bob_api, **REQUEST)  # two users asked: under k, never shared
    assert second["status"] == "queued"
    generated = wait_for_status(second["id"], ("done",))
    assert generated.batch_id is not None, "generated for bob"

    carol_api = client_for(make_user("carol"))
    third = submit(carol_api, **REQUEST)  # the third distinct user: shared now, but it looks fresh
    assert third["status"] == "queued", "a cross-user hit answered at once says that others asked"
    held = GenerationJob.objects.get(id=third["id"])
    assert held.cache_reveal_at is not None and held.billable_images == 1, "reserved as a fresh job"
    assert (held.cache_reveal_at - held.created_at).total_seconds() >= cache.reveal_delay(held) * 0.5 > 0
    done = wait_for_status(third["id"], ("done",))
    assert done.batch_id is None, "served from the cache, no GPU"
    assert done.finished_at >= done.cache_reveal_at, "done sooner than a pass of its shape after it started"
    assert (done.finished_at - done.created_at).total_seconds() >= cache.reveal_delay(done) * 0.5
    body = carol_api.get(f"/api/v1/jobs/{third['id']}").json()
    assert body["status"] == "done" and len(body["images"]) == 1
    # Its own file: the cached pixels under its own key (tests/test_cache_privacy.py checks the rest).
    delivered = {first_image.storage_key, generated.images.get().storage_key}  # the shared entry is the latest
    assert done.images.get().storage_key not in delivered and done.images.get().source_key in delivered

    mine = submit(alice_api, **REQUEST)
    assert mine["status"] == "done", "the owner's own repeat stays instant"


def test_a_rare_request_is_never_shared(workers, alice_api, bob_api, settings):
    settings.IMAGEGEN_CACHE_SCOPE = "k-anonymous"
    settings.IMAGEGEN_CACHE_SHARE_K = 2
    rare = {**REQUEST, "prompt": "a coral hexagon on a plum background", "seed": 17}
    wait_until_cached(wait_for_status(submit(alice_api, **rare)["id"], ("done",)))
    settings.IMAGEGEN_CACHE_SHARE_K = 3
    probe = submit(bob_api, **rare)
    assert probe["status"] == "queued"
    assert wait_for_status(probe["id"], ("done",)).batch_id is not None
