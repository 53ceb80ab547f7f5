"""The Django admin deletes nothing by rows (issue 43, item 5): its own delete skips the storage
and CDN clean-up, so jobs, images and batches cannot be deleted there; a job is deleted through
jobs.actions.delete_job (an admin action), as its owner's delete is. A moderator's rejection is
said as the moderator's, not as the check that held the job."""

from __future__ import annotations

import pytest

from jobs.media.storage import public_storage
from jobs.models import Batch, GeneratedImage, GenerationJob
from tests.test_security import make_image, make_job

pytestmark = pytest.mark.django_db


def changelist_actions(client, url: str) -> list[str]:
    response = client.get(url)
    assert response.status_code == 200
    form = response.context["action_form"]  # None where no action is left
    return [choice[0] for choice in form.fields["action"].choices] if form is not None else []


def test_the_admins_row_delete_is_off_for_jobs_images_and_batches(admin_client, alice):
    job = make_job(alice)
    image = make_image(job, "public")
    batch = Batch.objects.create(model_version="tiny-random", width=64, height=64, steps=2, guidance_scale=5.0,
                                 size=1, cap=4)
    for url, obj in (("/admin/jobs/generationjob/", job), ("/admin/jobs/generatedimage/", image),
                     ("/admin/jobs/batch/", batch)):
        assert "delete_selected" not in changelist_actions(admin_client, url)
        assert admin_client.post(f"{url}{obj.pk}/delete/", {"post": "yes"}).status_code == 403
    assert GenerationJob.objects.filter(id=job.id).exists() and GeneratedImage.objects.filter(id=image.id).exists()
    assert Batch.objects.filter(id=batch.id).exists()


def test_the_admins_job_delete_goes_through_the_action_and_takes_the_public_bytes_down(admin_client, alice):
    job = make_job(alice)
    image = make_image(job, "public")
    assert public_storage().exists(image.storage_key)
    response = admin_client.post("/admin/jobs/generationjob/", {
        "action": "delete_through_the_service", "_selected_action": [str(job.id)], "index": 0,
    })
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.deleted_at is not None  # gone from the owner's view; the safety record stays
    assert not public_storage().exists(image.storage_key)


def test_a_moderators_rejection_of_a_held_prompt_is_the_moderators(alice, moderator):
    from jobs.actions import reject

    job = make_job(alice, status="review", blocked_stage="prompt", reason="a borderline shape")
    reject(job, moderator, "not on this service")
    job.refresh_from_db()
    assert (job.status, job.blocked_stage, job.reason) == ("blocked", "human", "not on this service")
