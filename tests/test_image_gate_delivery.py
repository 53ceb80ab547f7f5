"""Malformed classifier answers end to end: real workers, the real gate, a scripted classifier
(tests/fake_classifiers.Scripted). Before the gate validated answers, a missing label was skipped
and a NaN score compared false with every threshold, so these jobs were delivered."""

from __future__ import annotations

import pytest
from django.test import Client

from jobs.models import GeneratedImage
from tests import fake_classifiers
from tests.conftest import wait_for_status
from tests.test_generation import submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def classifier_mode():
    fake_classifiers.set_mode(None)
    yield fake_classifiers.set_mode
    fake_classifiers.set_mode(None)


@pytest.mark.parametrize("mode", ["nan", "missing", "text"])
def test_a_malformed_classifier_answer_delivers_nothing(workers, alice_api, classifier_mode, mode):
    classifier_mode(mode)
    job = submit(alice_api, steps=2)
    done = wait_for_status(job["id"], timeout=60)
    classifier_mode(None)
    assert done.status == "failed"
    assert "image safety check failed" in done.reason
    assert alice_api.get(f"/api/v1/jobs/{job['id']}").json()["images"] == []
    assert not GeneratedImage.objects.filter(job_id=job["id"], tier="public").exists()
    for image in GeneratedImage.objects.filter(job_id=job["id"]):
        assert Client().get(f"/media/{image.storage_key}").status_code == 404


def test_a_clean_answer_is_still_delivered(workers, alice_api, classifier_mode):
    job = submit(alice_api, steps=2)
    done = wait_for_status(job["id"], timeout=60)
    assert done.status == "done" and done.images.count() == 1
