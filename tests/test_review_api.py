"""The moderation API (issue 45, item 2): `GET /api/v1/review` lists the open cases, oldest first,
each with its job, its verdicts and its images' staff URLs; `POST /api/v1/review/{job_id}/decision`
approves or rejects one with a note. Moderators only (staff with `safety.review_content`); a
decision goes through jobs.actions.review, the same action as the admin's buttons, so a case is
decided once (a second decision is a 409) and the job moves through the stage table the same way
whichever door it came through. In process (a Django test client), no workers: after the
decision the job waits where the stage table put it."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.core.files.base import ContentFile
from django.test import Client
from django.utils import timezone
from PIL import Image
from rest_framework.test import APIClient

from jobs.access.tokens import issue
from jobs.media.storage import new_image_key, public_storage, quarantine_storage
from jobs.models import FIRST_STAGE, GeneratedImage, GenerationJob
from safety.models import SafetyVerdict
from tests.conftest import client_for, make_user

pytestmark = pytest.mark.django_db


def png_bytes(size: int = 64) -> bytes:
    """A real PNG (a checkerboard: what pixelated upscaling keeps sharp)."""
    image = Image.new("RGB", (size, size), "white")
    for y in range(size):
        for x in range(size):
            if (x // 8 + y // 8) % 2:
                image.putpixel((x, y), (200, 30, 30))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def make_case(owner, status: str, minutes_ago: float, **extra) -> GenerationJob:
    job = GenerationJob.objects.create(
        owner=owner, prompt=extra.pop("prompt", "a pink heart"), width=64, height=64, steps=2, guidance_scale=5.0,
        seed=7, model_version="tiny-random", stage=extra.pop("stage", FIRST_STAGE[status]), progress_total=2, **extra)
    GenerationJob.objects.filter(id=job.id).update(created_at=timezone.now() - timedelta(minutes=minutes_ago))
    job.refresh_from_db()
    return job


def quarantined_image(job, index: int = 0) -> GeneratedImage:
    data = png_bytes()
    key = quarantine_storage().save(new_image_key(), ContentFile(data))
    return GeneratedImage.objects.create(job=job, index=index, seed=job.seed + index, storage_key=key, width=64,
                                         height=64, byte_size=len(data), sha256="0" * 64, tier="quarantine")


def held_image_case(owner, minutes_ago: float = 10) -> GenerationJob:
    job = make_case(owner, "review", minutes_ago, blocked_stage="image", reason="This image looks like a heart")
    image = quarantined_image(job)
    SafetyVerdict.objects.create(job=job, image=image, image_index=0, stage="image", decision="review",
                                 category="demo_borderline", score=0.8, reason="heart 0.80")
    return job


def held_prompt_case(owner, minutes_ago: float = 5) -> GenerationJob:
    job = make_case(owner, "review", minutes_ago, stage="review", blocked_stage="prompt", reason="held: a heart")
    SafetyVerdict.objects.create(job=job, stage="prompt", decision="review", category="demo_borderline", score=0.6)
    return job


def appealed_prompt_block(owner, minutes_ago: float = 20) -> GenerationJob:
    job = make_case(owner, "blocked", minutes_ago, blocked_stage="prompt", reason="a star",
                    appealed_at=timezone.now(), appeal_note="it is a plain shape", finished_at=timezone.now())
    SafetyVerdict.objects.create(job=job, stage="prompt", decision="block", category="demo_forbidden", score=0.9)
    return job


def give_review_permission(user) -> None:
    user.user_permissions.add(Permission.objects.get(codename="review_content", content_type__app_label="safety"))


@pytest.fixture
def owner():
    return make_user("alice")


@pytest.fixture
def mod():
    user = make_user("mod", is_staff=True)
    give_review_permission(user)
    return user


@pytest.fixture
def mod_api(mod):
    return client_for(mod)


def decide(api, job, decision, note="", **extra):
    return api.post(f"/api/v1/review/{job.id}/decision", {"decision": decision, "note": note, **extra}, format="json")


# --- who may ------------------------------------------------------------------------------


def test_a_user_who_is_not_staff_gets_403_on_the_list_and_on_a_decision(owner):
    case = held_image_case(owner)
    api = client_for(owner)
    assert api.get("/api/v1/review").status_code == 403
    response = decide(api, case, "approve")
    assert response.status_code == 403 and "detail" in response.json()
    assert GenerationJob.objects.get(id=case.id).status == "review"


def test_staff_without_the_review_permission_gets_403(owner):
    case = held_image_case(owner)
    api = client_for(make_user("operator", is_staff=True))
    assert api.get("/api/v1/review").status_code == 403
    assert decide(api, case, "reject", "no").status_code == 403
    assert GenerationJob.objects.get(id=case.id).status == "review"


def test_the_permission_without_staff_is_not_enough(owner):
    user = make_user("former", is_staff=False)
    give_review_permission(user)
    assert client_for(user).get("/api/v1/review").status_code == 403


def test_no_credentials_is_401():
    assert APIClient().get("/api/v1/review").status_code == 401


def test_a_moderators_full_scope_token_works_as_bearer_and_a_jobs_scope_token_does_not(owner, mod):
    held_image_case(owner)
    full = APIClient()
    full.credentials(HTTP_AUTHORIZATION=f"Bearer {issue(mod, name='moderation tool', scope='full')}")
    assert full.get("/api/v1/review").status_code == 200
    jobs_only = APIClient()
    jobs_only.credentials(HTTP_AUTHORIZATION=f"Token {issue(mod, name='jobs', scope='jobs')}")
    response = jobs_only.get("/api/v1/review")
    assert response.status_code == 403 and "scope" in response.json()["detail"]


# --- the list -------------------------------------------------------------------------------


def test_the_list_has_the_open_cases_oldest_first_with_job_verdicts_and_staff_image_urls(owner, mod, mod_api):
    appeal = appealed_prompt_block(owner, minutes_ago=30)
    image_case = held_image_case(owner, minutes_ago=20)
    prompt_case = held_prompt_case(owner, minutes_ago=10)
    make_case(owner, "done", 40)  # not a case
    make_case(owner, "blocked", 50, blocked_stage="prompt", reason="gore")  # blocked, never appealed
    make_case(owner, "blocked", 60, blocked_stage="prompt", appealed_at=timezone.now(), appeal_outcome="upheld")

    response = mod_api.get("/api/v1/review")
    assert response.status_code == 200, response.content
    cases = response.json()["results"]
    assert [c["id"] for c in cases] == [str(appeal.id), str(image_case.id), str(prompt_case.id)]
    assert [c["kind"] for c in cases] == ["appeal", "held", "held"]

    first = cases[0]
    assert first["job"]["id"] == str(appeal.id) and first["job"]["status"] == "blocked"
    assert first["job"]["appeal"]["note"] == "it is a plain shape"
    assert first["owner"] == "alice"
    assert first["decision_url"].endswith(f"/api/v1/review/{appeal.id}/decision")
    assert [(v["stage"], v["decision"], v["category"]) for v in first["verdicts"]] == [("prompt", "block", "demo_forbidden")]

    held = cases[1]
    [verdict] = held["verdicts"]
    assert verdict["stage"] == "image" and verdict["score"] == pytest.approx(0.8) and verdict["image_index"] == 0
    [image] = held["images"]
    assert image["tier"] == "quarantine" and image["index"] == 0
    assert image["url"] == f"http://testserver/staff/images/{image['id']}"
    assert held["job"]["images"] == []  # the job JSON lists delivered images only: held ones are staff-only

    # The tool fetches the private bytes with the same token; the owner cannot.
    got = mod_api.get(image["url"])
    assert got.status_code == 200 and b"".join(got.streaming_content)[:8] == b"\x89PNG\r\n\x1a\n"
    assert client_for(owner).get(image["url"]).status_code == 404


# --- decisions ------------------------------------------------------------------------------


def test_approving_held_images_delivers_them_with_the_moderators_note(owner, mod, mod_api):
    case = held_image_case(owner)
    response = decide(mod_api, case, "approve", "a heart is fine")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["outcome"] == "approved" and body["job"]["status"] == "done"
    job = GenerationJob.objects.get(id=case.id)
    assert job.stage == "done" and job.images.get().tier == "public"
    assert public_storage().exists(job.images.get().storage_key)
    human = SafetyVerdict.objects.get(job=job, stage="human")
    assert (human.decision, human.reviewer, human.notes) == ("allow", mod, "a heart is fine")
    assert [c["id"] for c in mod_api.get("/api/v1/review").json()["results"]] == []


def test_rejecting_with_a_note_blocks_the_job_in_the_moderators_words(owner, mod, mod_api):
    case = held_image_case(owner)
    response = decide(mod_api, case, "reject", "The heart is drawn as an anatomical organ.")
    assert response.status_code == 200, response.content
    assert response.json()["outcome"] == "rejected"
    job = GenerationJob.objects.get(id=case.id)
    assert (job.status, job.blocked_stage, job.reason) == ("blocked", "human", "The heart is drawn as an anatomical organ.")
    assert job.images.get().tier == "quarantine"  # the bytes stay private
    assert SafetyVerdict.objects.get(job=job, stage="human").notes == "The heart is drawn as an anatomical organ."


def test_an_appeal_is_overturned_or_upheld(owner, mod_api):
    overturned, upheld = appealed_prompt_block(owner), appealed_prompt_block(owner)
    assert decide(mod_api, overturned, "approve", "a plain shape").json()["outcome"] == "overturned"
    assert decide(mod_api, upheld, "reject", "it is a star").json()["outcome"] == "upheld"
    overturned.refresh_from_db()
    upheld.refresh_from_db()
    assert overturned.appeal_outcome == "overturned" and overturned.status == "queued"
    assert upheld.appeal_outcome == "upheld" and upheld.status == "blocked" and "it is a star" in upheld.reason


def test_a_second_decision_is_a_409_and_moves_nothing(owner, mod, mod_api):
    case = held_image_case(owner)
    assert decide(mod_api, case, "approve", "fine").status_code == 200
    for decision in ("approve", "reject"):
        again = decide(mod_api, case, decision, "changed my mind")
        assert again.status_code == 409, again.content
        assert again.json()["status"] == "done" and again.json()["detail"]
    assert GenerationJob.objects.get(id=case.id).status == "done"
    assert SafetyVerdict.objects.filter(job=case, stage="human").count() == 1  # one decision, one verdict


def test_a_job_that_is_not_a_case_is_a_409_and_an_unknown_id_a_404(owner, mod_api):
    done = make_case(owner, "done", 1)
    assert decide(mod_api, done, "approve").status_code == 409
    response = mod_api.post("/api/v1/review/00000000-0000-0000-0000-000000000000/decision",
                            {"decision": "approve"}, format="json")
    assert response.status_code == 404 and "detail" in response.json()


@pytest.mark.parametrize(("body", "field"), [
    ({"decision": "maybe"}, "decision"),
    ({}, "decision"),
    ({"decision": ["approve"]}, "decision"),
    ({"decision": "approve", "note": "x" * 1001}, "note"),
    ({"decision": "approve", "note": 5}, "note"),
    ({"decision": "reject", "note": "  "}, "note"),  # a rejection reaches the user in the moderator's words
    ({"decision": "approve", "verdict": "allow"}, "verdict"),  # an unknown field
])
def test_a_bad_body_is_a_400_naming_the_field_and_decides_nothing(owner, mod_api, body, field):
    case = held_image_case(owner)
    response = mod_api.post(f"/api/v1/review/{case.id}/decision", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert all(isinstance(m, str) and m for m in response.json()[field])
    assert GenerationJob.objects.get(id=case.id).status == "review"


def test_a_body_that_is_not_an_object_is_a_400(owner, mod_api):
    case = held_image_case(owner)
    response = mod_api.post(f"/api/v1/review/{case.id}/decision", ["approve"], format="json")
    assert response.status_code == 400
    assert GenerationJob.objects.get(id=case.id).status == "review"


def test_the_api_and_the_admin_button_move_a_held_prompt_the_same_way(owner, mod, mod_api):
    """Both doors go through jobs.actions.review: the same stage, the same verdict rows."""
    by_api, by_admin = held_prompt_case(owner), held_prompt_case(owner)
    assert decide(mod_api, by_api, "approve", "fine").status_code == 200
    admin = Client()
    admin.force_login(mod)
    page = admin.post(f"/admin/safety/reviewcase/{by_admin.id}/change/", {"note": "fine", "_approve": "Approve"})
    assert page.status_code == 302, page.content[:2000]
    by_api.refresh_from_db()
    by_admin.refresh_from_db()
    assert by_api.stage == by_admin.stage == "waiting_gpu"
    assert (by_api.blocked_stage, by_api.reason) == (by_admin.blocked_stage, by_admin.reason) == ("", "")

    def human(job):
        return list(SafetyVerdict.objects.filter(job=job, stage="human").values_list("decision", "reviewer", "notes", "reason"))

    assert human(by_api) == human(by_admin) == [("allow", mod.id, "fine", "prompt approved by a moderator")]
    # Decided through one door, the other answers that it is decided.
    assert decide(mod_api, by_admin, "reject", "no").status_code == 409
    page = admin.post(f"/admin/safety/reviewcase/{by_api.id}/change/", {"note": "no", "_reject": "Reject"}, follow=True)
    assert "not open" in page.content.decode()
    assert SafetyVerdict.objects.filter(job__in=[by_api, by_admin], stage="human").count() == 2


# --- the schema -------------------------------------------------------------------------------


def test_the_schema_documents_both_operations():
    schema = APIClient().get("/api/schema/", {"format": "json"}).json()
    listing = schema["paths"]["/api/v1/review"]["get"]
    decision = schema["paths"]["/api/v1/review/{job_id}/decision"]["post"]
    assert {"200", "401", "403"} <= set(listing["responses"])
    assert {"200", "400", "401", "403", "404", "409"} <= set(decision["responses"])
    body = decision["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    request = schema["components"]["schemas"][body]
    assert set(request["properties"]) == {"decision", "note"}
    decision_field = request["properties"]["decision"]
    decision_field = decision_field.get("allOf", [decision_field])[0]
    if "$ref" in decision_field:  # an enum component
        decision_field = schema["components"]["schemas"][decision_field["$ref"].rsplit("/", 1)[-1]]
    assert decision_field["enum"] == ["approve", "reject"]
    case = schema["components"]["schemas"]["ReviewCase"]["properties"]
    assert {"id", "kind", "job", "verdicts", "images", "owner", "decision_url"} <= set(case)


# --- an appeal overturned, then blocked again -------------------------------------------------


def test_an_overturned_appeal_blocked_again_is_open_again_and_its_moderator_is_told(owner, mod, mod_api):
    """The moderator let the prompt through; the image check then blocked the image. The user's
    appeal is open again (the job JSON says pending, the reason says why) and the case is back in
    the queue, marked; the moderator who overturned it sees it on the admin index."""
    from jobs.actions.lifecycle import move

    case = appealed_prompt_block(owner)
    assert decide(mod_api, case, "approve", "a plain shape").json()["outcome"] == "overturned"
    # Generated; the publish stage blocks it on the image gate's verdict (the same move and
    # status change finish_batch makes).
    GenerationJob.objects.filter(id=case.id).update(stage="publish", status="running")
    quarantined_image(case)
    assert move(case.id, "publish", "blocked", blocked_stage="image", reason="This image looks like a star.")

    job = client_for(owner).get(f"/api/v1/jobs/{case.id}").json()
    assert job["status"] == "blocked" and job["appeal"]["status"] == "pending"
    assert job["reason"].startswith("This image looks like a star.") and "appeal" in job["reason"]
    [listed] = mod_api.get("/api/v1/review").json()["results"]
    assert listed["id"] == str(case.id) and listed["kind"] == "reopened_appeal"
    assert [(v["stage"], v["reviewer"], v["notes"]) for v in listed["verdicts"]] == [
        ("prompt", None, ""), ("human", "mod", "a plain shape")]
    assert listed["images"] and listed["images"][0]["tier"] == "quarantine"

    admin = Client()
    admin.force_login(mod)
    index = admin.get("/admin/").content.decode()
    assert 'data-open-cases="1"' in index
    assert "An appeal you overturned was blocked again" in index and f"/admin/safety/reviewcase/{case.id}/change/" in index
    other = make_user("mod2", is_staff=True)
    give_review_permission(other)
    admin.force_login(other)
    index = admin.get("/admin/").content.decode()
    assert 'data-open-cases="1"' in index and "An appeal you overturned" not in index

    # Decided again, once: approving now delivers the images.
    assert decide(mod_api, case, "approve", "the image is a plain shape too").json()["outcome"] == "overturned"
    case.refresh_from_db()
    assert (case.status, case.appeal_outcome) == ("done", "overturned") and case.images.get().tier == "public"
    assert decide(mod_api, case, "reject", "no").status_code == 409


def test_a_job_blocked_again_after_an_overturn_announces_each_terminal_status_to_its_webhook(owner, mod, mod_api):
    """The webhook hears every terminal status a job reaches, in order: blocked, then (the appeal
    overturned, the image blocked) blocked again, then (approved) done. The outbox once kept one
    row per (job, status), so the second block was never announced."""
    from jobs.actions.lifecycle import move
    from jobs.models import WebhookDelivery

    case = appealed_prompt_block(owner)
    GenerationJob.objects.filter(id=case.id).update(webhook_url="https://hooks.example/imagegen")
    WebhookDelivery.objects.create(job=case, status="blocked", url="https://hooks.example/imagegen", body="{}")
    decide(mod_api, case, "approve", "a plain shape")
    GenerationJob.objects.filter(id=case.id).update(stage="publish", status="running")
    quarantined_image(case)
    assert move(case.id, "publish", "blocked", blocked_stage="image", reason="This image looks like a star.")
    # The same status written again (a duplicate run of the same move) announces nothing new.
    from jobs.webhooks.delivery import record_terminal

    record_terminal(job_ids=[case.id])
    decide(mod_api, case, "approve", "the image is a plain shape too")
    announced = list(WebhookDelivery.objects.filter(job=case).order_by("announcement").values_list("status", flat=True))
    assert announced == ["blocked", "blocked", "done"]


def test_a_moderators_own_rejection_after_an_overturn_does_not_reopen_the_appeal(owner, mod, mod_api):
    case = appealed_prompt_block(owner)
    decide(mod_api, case, "approve", "a plain shape")
    GenerationJob.objects.filter(id=case.id).update(stage="review", status="review", blocked_stage="image")
    quarantined_image(case)
    assert decide(mod_api, case, "reject", "the image is not").json()["outcome"] == "rejected"
    case.refresh_from_db()
    assert (case.status, case.appeal_outcome, case.reason) == ("blocked", "overturned", "the image is not")
    assert mod_api.get("/api/v1/review").json()["results"] == []


def test_the_admin_index_shows_how_many_cases_are_open(owner, mod):
    held_image_case(owner)
    held_prompt_case(owner)
    appealed_prompt_block(owner)
    admin = Client()
    admin.force_login(mod)
    index = admin.get("/admin/").content.decode()
    assert 'data-open-cases="3"' in index and "3 open cases" in index


@pytest.mark.django_db(transaction=True)
def test_through_the_pipeline_the_user_hears_of_the_second_block_and_the_case_is_back(
    workers, alice, alice_api, moderator, classifier_mode, settings,
):
    """End to end: a prompt blocked, appealed, overturned through the API; the GPU makes the image,
    the image gate blocks it; the user's status event says the appeal goes on, the moderator's
    queue has the case again."""
    from tests.conftest import admitted_to, watch_job

    lane = settings.IMAGEGEN_MODEL_NAME
    classifier_mode('json:{"star": 0.95}')  # the image gate blocks every image
    with admitted_to(lane, held=True):  # generated only once the watcher below listens
        response = alice_api.post("/api/v1/jobs", {"prompt": "a yellow star", "width": 64, "height": 64, "seed": 3},
                                  format="json")
        assert response.status_code == 202, response.content
        job = GenerationJob.objects.get(id=response.json()["id"])
        assert job.status == "blocked" and job.blocked_stage == "prompt"
        assert alice_api.post(f"/api/v1/jobs/{job.id}/appeal", {"note": "a plain shape"}, format="json").status_code == 202
        assert decide(client_for(moderator), job, "approve", "a harmless shape").json()["outcome"] == "overturned"
    events = watch_job(str(job.id), wake_lane=lane, timeout=120)
    final = events[-1]
    assert (final["type"], final["status"]) == ("status", "blocked"), events
    assert "appeal" in final["reason"] and "moderator" in final["reason"]
    assert alice_api.get(f"/api/v1/jobs/{job.id}").json()["appeal"]["status"] == "pending"
    [case] = client_for(moderator).get("/api/v1/review").json()["results"]
    assert case["id"] == str(job.id) and case["kind"] == "reopened_appeal" and case["job"]["blocked_stage"] == "image"


def test_the_hand_written_reopen_changes_the_rows_the_orm_definition_names(owner):
    """reopen_appeals_blocked_again runs on every status change as one hand-written UPDATE; the
    ORM's `blocked_again` is its definition."""
    from jobs.actions.notify import BLOCKED_AGAIN, reopen_appeals_blocked_again
    from jobs.actions.review import blocked_again

    now = timezone.now()
    appealed = {"appealed_at": now, "finished_at": now}
    jobs = [
        make_case(owner, "blocked", 1, blocked_stage="image", reason="star", appeal_outcome="overturned", **appealed),
        make_case(owner, "blocked", 1, blocked_stage="rewrite", reason="r", appeal_outcome="overturned", **appealed),
        make_case(owner, "blocked", 1, blocked_stage="human", reason="mod", appeal_outcome="overturned", **appealed),
        make_case(owner, "blocked", 1, blocked_stage="image", reason="u", appeal_outcome="upheld", **appealed),
        make_case(owner, "blocked", 1, blocked_stage="prompt", reason="p", **appealed),
        make_case(owner, "done", 1, appeal_outcome="overturned", **appealed),
        make_case(owner, "queued", 1, stage="waiting_gpu", appeal_outcome="overturned", appealed_at=now),
        make_case(owner, "blocked", 1, blocked_stage="image", reason="elsewhere", appeal_outcome="overturned", **appealed),
    ]
    asked = [str(job.id) for job in jobs[:-1]]  # the last one's status did not change: not asked about
    expected = set(blocked_again(asked).values_list("id", flat=True))
    assert expected == {jobs[0].id, jobs[1].id}
    before = {job.id: job.reason for job in jobs}
    assert reopen_appeals_blocked_again(asked) == len(expected)
    for job in GenerationJob.objects.filter(id__in=[j.id for j in jobs]):
        if job.id in expected:
            assert (job.appeal_outcome, job.reason) == ("", before[job.id] + BLOCKED_AGAIN)
        else:
            assert job.reason == before[job.id], job.blocked_stage
    assert GenerationJob.objects.get(id=jobs[-1].id).appeal_outcome == "overturned"
    assert reopen_appeals_blocked_again([]) == 0
