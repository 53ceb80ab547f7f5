"""The safety record: the request-hash cache serves only what the configured gate allowed, and
the record of a decision (verdicts, quarantined evidence, an appeal) outlives the owner's delete
until retention purges it."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from jobs.models import GeneratedImage, GenerationJob
from safety.models import SafetyVerdict
from tests.conftest import admitted_to, forget_cache, wait_for_status, wait_until_cached
from tests.test_tokens import production_signing_credentials

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.django_db(transaction=True)


def submit(api, prompt: str, seed: int, **extra) -> str:
    response = api.post("/api/v1/jobs", {"prompt": prompt, "width": 64, "height": 64, "steps": 3, "seed": seed, **extra},
                        format="json")
    assert response.status_code == 202, response.content
    return response.json()["id"]


# --- the cache serves only what this gate allowed ---


def test_the_cache_key_names_the_gate_that_judged_the_image():
    from jobs.media.cache import request_key

    job = GenerationJob(prompt="a red circle", negative_prompt="", width=64, height=64, steps=3, guidance_scale=5.0,
                        seed=1, model_version="v", owner_id=1)
    assert request_key(job, 0, classifier="shapes:abc") != request_key(job, 0, classifier="shapes:def")
    assert request_key(job, 0) == request_key(job, 0, classifier=__import__("safety.gate_identity").gate_identity.gate_identity())


def test_an_image_made_with_no_classifier_is_never_served_from_the_cache(workers, start_worker, alice_api):
    """A lane whose classify worker runs with IMAGEGEN_IMAGE_CLASSIFIER=none delivers unchecked
    images; the same request afterwards, with the session's classifier on, is generated again."""
    lane = "uncheckedlane"
    worker = start_worker("gpu-unchecked", f"{settings.QUEUE_GPU_PREFIX}{lane},classify-unchecked",
                          IMAGEGEN_MODEL_NAME=lane, IMAGEGEN_QUEUE_CLASSIFY="classify-unchecked",
                          IMAGEGEN_IMAGE_CLASSIFIER="none")
    forget_cache()
    with admitted_to(lane):
        first = wait_for_status(submit(alice_api, "a blue square on a red background", 4242), ("done",))
    verdict = SafetyVerdict.objects.get(job=first, stage="image")
    assert verdict.category == "unchecked" and verdict.classifier == "none"
    second = wait_for_status(submit(alice_api, "a blue square on a red background", 4242), ("done",))
    assert second.batch_id is not None  # generated, not a cache hit
    assert second.images.get().storage_key != first.images.get().storage_key
    worker.stop()


def test_an_allowed_image_is_served_from_the_cache_to_the_same_gate(workers, alice_api):
    forget_cache()
    first = wait_for_status(submit(alice_api, "a green circle on a white background", 4343), ("done",))
    wait_until_cached(first)
    second = alice_api.post("/api/v1/jobs", {"prompt": "a green circle on a white background", "width": 64, "height": 64,
                                             "steps": 3, "seed": 4343}, format="json").json()
    assert second["status"] == "done"  # at once, from the cache
    assert GenerationJob.objects.get(id=second["id"]).images.get().source_key == first.images.get().storage_key


def test_production_refuses_to_deliver_unchecked_images_without_a_second_setting(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "imagegen.settings", "IMAGEGEN_EMBEDDED": "false",
           "DJANGO_SECRET_KEY": "x" * 50, "IMAGEGEN_IMAGE_CLASSIFIER": "none", "IMAGEGEN_VAR_DIR": str(tmp_path),
           **production_signing_credentials(tmp_path)}
    refused = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "IMAGEGEN_ALLOW_UNCHECKED_DELIVERY" in refused.stderr
    accepted = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT,
                              env={**env, "IMAGEGEN_ALLOW_UNCHECKED_DELIVERY": "true"}, capture_output=True, text=True)
    assert accepted.returncode == 0, accepted.stderr[-2000:]


# --- the record outlives the owner's delete ---


def test_deleting_a_blocked_job_keeps_its_verdicts_and_its_quarantined_evidence(workers, alice_api, classifier_mode,
                                                                                 moderator_client):
    from jobs.media.storage import quarantine_storage

    classifier_mode('json:{"star": 0.99}')
    job = wait_for_status(submit(alice_api, "a yellow circle on a black background", 4444), ("blocked",))
    image = job.images.get()
    assert alice_api.delete(f"/api/v1/jobs/{job.id}").status_code == 204
    assert alice_api.get(f"/api/v1/jobs/{job.id}").status_code == 404
    assert str(job.id) not in [j["id"] for j in alice_api.get("/api/v1/jobs").json()["results"]]
    assert SafetyVerdict.objects.filter(job_id=job.id, stage="image", decision="block").exists()
    assert GeneratedImage.objects.filter(id=image.id, tier="quarantine").exists()
    assert quarantine_storage().exists(image.storage_key)
    assert moderator_client.get(f"/staff/images/{image.id}").status_code == 200  # evidence for moderators


def test_a_pending_appeal_is_not_withdrawn_by_the_owners_delete(workers, alice_api, moderator_client):
    from jobs.actions import review_queue

    job_id = submit(alice_api, "a pile of bloody gore and severed limbs", 4545)
    wait_for_status(job_id, ("blocked",))
    assert alice_api.post(f"/api/v1/jobs/{job_id}/appeal", {"note": "it is a costume"}, format="json").status_code == 202
    assert alice_api.delete(f"/api/v1/jobs/{job_id}").status_code == 204
    assert review_queue().filter(id=job_id).exists()
    moderator_client.post("/admin/safety/reviewcase/", {"action": "reject_selected", "_selected_action": [job_id],
                                                 "notes": "not a costume", "index": 0})
    assert GenerationJob.objects.get(id=job_id).appeal_outcome == "upheld"


def test_retention_purges_a_deleted_job_once_its_record_period_is_over(workers, alice_api, classifier_mode, settings):
    from jobs.media.storage import quarantine_storage
    from jobs.pipeline.retention import apply_retention

    classifier_mode('json:{"star": 0.99}')
    job = wait_for_status(submit(alice_api, "a white circle on a red background", 4646), ("blocked",))
    key = job.images.get().storage_key
    alice_api.delete(f"/api/v1/jobs/{job.id}")
    assert apply_retention()["deleted_records_purged"] == 0  # within the record period
    GenerationJob.objects.filter(id=job.id).update(deleted_at=timezone.now() - timedelta(days=settings.IMAGEGEN_SAFETY_RECORD_DAYS + 1))
    assert apply_retention()["deleted_records_purged"] == 1
    assert not GenerationJob.objects.filter(id=job.id).exists()
    assert not SafetyVerdict.objects.filter(job_id=job.id).exists()
    assert not quarantine_storage().exists(key)


def test_overturning_an_appeal_on_a_taken_down_image_restores_it(workers, alice_api, moderator_client):
    from jobs.media.storage import public_storage

    job = wait_for_status(submit(alice_api, "a red square on a green background", 4747), ("done",))
    image = job.images.get()
    response = moderator_client.post("/admin/jobs/generatedimage/", {"action": "reject_delivered", "_selected_action": [str(image.id)],
                                                              "notes": "looks wrong", "index": 0})
    assert response.status_code == 302
    taken = GenerationJob.objects.get(id=job.id)
    assert taken.status == "blocked" and taken.blocked_stage == "human"
    assert not public_storage().exists(image.storage_key)
    assert alice_api.post(f"/api/v1/jobs/{job.id}/appeal", {"note": "it is a square"}, format="json").status_code == 202
    moderator_client.post("/admin/safety/reviewcase/", {"action": "approve_selected", "_selected_action": [str(job.id)],
                                                 "notes": "fine after all", "index": 0})
    restored = GenerationJob.objects.get(id=job.id)
    assert restored.status == "done" and restored.appeal_outcome == "overturned", restored.reason
    image.refresh_from_db()
    assert image.tier == "public" and public_storage().exists(image.storage_key)
    body = alice_api.get(f"/api/v1/jobs/{job.id}").json()
    assert body["status"] == "done" and body["images"][0]["url"]


def test_a_blocked_image_says_why_in_words_a_person_understands(workers, alice_api, classifier_mode):
    classifier_mode('json:{"star": 0.99}')
    job = wait_for_status(submit(alice_api, "a pink circle on a blue background", 4848), ("blocked",))
    body = alice_api.get(f"/api/v1/jobs/{job.id}").json()
    assert body["reason"] == "This image looks like a star, which this demo's policy does not allow."
    assert "demo_forbidden" not in body["reason"]
    verdict = SafetyVerdict.objects.get(job=job, stage="image")
    assert "0.99" in verdict.notes  # the classifier's detail stays for moderators
