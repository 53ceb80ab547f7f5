"""Idempotent submits, deadlines and signed webhooks (issue 19), through the real API; webhook
deliveries through the real io worker and reaper, to the test's own loopback receiver, which
verifies each signature."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from imagegen.redis_client import get_redis
from jobs import actions
from jobs.models import GenerationJob, IdempotencyKey, UsageCharge, WebhookDelivery
from jobs.webhooks import delivery as webhooks
from tests.conftest import admitted_to, client_for, wait_for_status

BODY = {"prompt": "a red circle on a blue background", "width": 64, "height": 64, "steps": 2}


# --- idempotency ---

@pytest.mark.django_db
def test_the_same_key_and_body_answer_the_same_job(alice_api, bob_api):
    first = alice_api.post("/api/v1/jobs", BODY, format="json", HTTP_IDEMPOTENCY_KEY="order-1")
    again = alice_api.post("/api/v1/jobs", BODY, format="json", HTTP_IDEMPOTENCY_KEY="order-1")
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert GenerationJob.objects.count() == 1
    # Keys are per user: Bob's "order-1" is his own.
    other = bob_api.post("/api/v1/jobs", BODY, format="json", HTTP_IDEMPOTENCY_KEY="order-1")
    assert other.status_code == 202 and other.json()["id"] != first.json()["id"]
    # The same key with another body: 422 naming the header, and no job.
    changed = alice_api.post("/api/v1/jobs", {**BODY, "steps": 3}, format="json", HTTP_IDEMPOTENCY_KEY="order-1")
    assert changed.status_code == 422
    assert "Idempotency-Key" in changed.json() and "different request body" in changed.json()["detail"]
    assert GenerationJob.objects.count() == 2
    # Past the window the key is forgotten: a new job.
    IdempotencyKey.objects.filter(key="order-1").update(created_at=timezone.now() - timedelta(hours=25))
    later = alice_api.post("/api/v1/jobs", BODY, format="json", HTTP_IDEMPOTENCY_KEY="order-1")
    assert later.status_code == 202 and later.json()["id"] != first.json()["id"]
    # Without the header every request is a new job.
    assert alice_api.post("/api/v1/jobs", BODY, format="json").json()["id"] != later.json()["id"]


@pytest.mark.django_db
def test_a_bad_key_is_a_400_and_a_refused_submit_releases_its_key(alice_api, settings):
    bad = alice_api.post("/api/v1/jobs", BODY, format="json", HTTP_IDEMPOTENCY_KEY="x" * 256)
    assert bad.status_code == 400 and "Idempotency-Key" in bad.json()
    settings.IMAGEGEN_USER_MAX_IN_FLIGHT = 0
    refused = alice_api.post("/api/v1/jobs", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k2")
    assert refused.status_code == 429
    assert not IdempotencyKey.objects.filter(key="k2").exists()
    settings.IMAGEGEN_USER_MAX_IN_FLIGHT = 16
    assert alice_api.post("/api/v1/jobs", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k2").status_code == 202


@pytest.mark.django_db
def test_openai_route_replays_the_same_job(alice, settings):
    settings.IMAGEGEN_OPENAI_WAIT_SECONDS = 0.2  # nothing runs here: each answer is the 504 naming the job
    alice_api = APIClient()
    alice_api.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.auth_token.key}")
    body = {"prompt": BODY["prompt"], "size": "64x64"}
    first = alice_api.post("/v1/images/generations", body, format="json", HTTP_IDEMPOTENCY_KEY="oa-1")
    again = alice_api.post("/v1/images/generations", body, format="json", HTTP_IDEMPOTENCY_KEY="oa-1")
    assert first.status_code == again.status_code == 504
    job = GenerationJob.objects.get()
    assert str(job.id) in first.json()["error"]["message"] and str(job.id) in again.json()["error"]["message"]
    changed = alice_api.post("/v1/images/generations", {**body, "n": 2}, format="json", HTTP_IDEMPOTENCY_KEY="oa-1")
    assert changed.status_code == 422
    assert changed.json()["error"]["param"] == "Idempotency-Key"
    assert GenerationJob.objects.count() == 1


# --- deadlines ---

def _deadline_passes(job_id: str) -> None:
    """The job's deadline is moved into the past and the reaper runs once, here: waiting for a
    short deadline would race the job's own admission (a prompt check slower than the deadline
    on a loaded machine, cancelled before it was admitted)."""
    from jobs.pipeline.tasks import reap

    GenerationJob.objects.filter(id=job_id).update(deadline_at=timezone.now() - timedelta(seconds=1))
    reap()


@pytest.mark.django_db(transaction=True)
def test_a_deadline_cancels_a_queued_job_uncharged(workers, alice_api):
    """In a lane with no GPU worker the job stays queued; once cancel_after has passed the
    reaper cancels it, and it is never charged."""
    with admitted_to("no-gpu-deadline"):
        job = alice_api.post("/api/v1/jobs", {**BODY, "cancel_after": 600}, format="json").json()
    assert job["cancel_after"] == 600 and job["deadline_at"]
    row = GenerationJob.objects.get(id=job["id"])
    assert row.scheduled_at is not None  # admitted to the scheduler (no GPU worker serves this lane)
    assert 599 <= (row.deadline_at - row.created_at).total_seconds() <= 601
    _deadline_passes(job["id"])
    done = wait_for_status(job["id"], ("cancelled",), timeout=120)
    assert done.reason == "deadline passed"
    assert done.started_at is None and done.charged_at is None and not UsageCharge.objects.filter(job_id=done.id).exists()
    shape = actions.shape_of(done)
    # Its bucket entry goes right after the status change commits (the reaper unqueues it next).
    deadline = time.monotonic() + 120
    while get_redis().zrange(f"ig:q:{shape}", 0, -1) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not get_redis().zrange(f"ig:q:{shape}", 0, -1)  # its bucket entry is gone
    assert alice_api.get(f"/api/v1/jobs/{job['id']}").json()["reason"] == "deadline passed"


def test_a_deadline_ends_a_prompt_held_for_review_and_takes_it_off_the_moderators_queue(workers, alice_api):
    """A borderline prompt waits for a moderator before any GPU time: its deadline still holds
    (the reaper cancels it, uncharged), and the moderators' queue no longer lists it."""
    from jobs.actions import review

    job = alice_api.post("/api/v1/jobs", {**BODY, "prompt": "a red heart on a white background", "cancel_after": 600},
                         format="json").json()
    held = wait_for_status(job["id"], ("review",), timeout=120)
    assert held.blocked_stage == "prompt" and review.review_queue().filter(id=held.id).exists()
    _deadline_passes(job["id"])
    done = wait_for_status(job["id"], ("cancelled",), timeout=120)
    assert done.reason == "deadline passed"
    assert done.started_at is None and done.charged_at is None
    assert not review.review_queue().filter(id=done.id).exists()


@pytest.mark.django_db(transaction=True)
def test_a_worker_never_claims_a_job_past_its_deadline(alice):
    job = GenerationJob.objects.create(
        owner=alice, prompt="p", width=64, height=64, steps=2, guidance_scale=5.0, seed=1, model_version="v",
        scheduled_at=timezone.now(), deadline_at=timezone.now() - timedelta(seconds=1), billable_images=1,
    )
    assert actions.claim_batch([str(job.id)], None) == []
    assert actions.cancel_past_deadline() == 1
    job.refresh_from_db()
    assert job.status == "cancelled" and job.charged_at is None


@pytest.mark.django_db
def test_bad_cancel_after_and_priority_are_400s_naming_the_field(alice_api):
    for field, value in (("cancel_after", 0), ("cancel_after", "soon"), ("priority", "urgent")):
        response = alice_api.post("/api/v1/jobs", {**BODY, field: value}, format="json")
        assert response.status_code == 400 and field in response.json(), (field, value)


# --- webhooks ---

class Receiver:
    """A loopback HTTP receiver: answers each POST with the next of `plan` (a status code, or
    "hang": hold the request until released), and records what came."""

    def __init__(self, plan):
        self.plan = list(plan)
        self.requests: list[dict] = []
        self.release = threading.Event()
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0))).decode()
                step = receiver.plan.pop(0) if receiver.plan else 200
                with receiver.arrived:
                    receiver.requests.append({"headers": {k.lower(): v for k, v in self.headers.items()},
                                              "body": body, "peer": self.client_address, "answer": step})
                    receiver.arrived.notify_all()
                if step == "hang":
                    receiver.release.wait(60)
                    return
                self.send_response(int(step))
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook?src=test"

    def wait_for(self, n: int, timeout: float = 60.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        with self.arrived:
            while len(self.requests) < n:
                left = deadline - time.monotonic()
                assert left > 0, f"{len(self.requests)} of {n} webhook requests arrived"
                self.arrived.wait(left)
        return self.requests

    def close(self):
        self.release.set()
        self.server.shutdown()


@pytest.fixture
def receiver():
    made = []

    def make(plan=()):
        r = Receiver(plan)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def _delivered(delivery_id, timeout=60.0) -> WebhookDelivery:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = WebhookDelivery.objects.get(id=delivery_id)
        if row.delivered_at is not None:
            return row
        time.sleep(0.1)
    raise AssertionError(f"webhook {delivery_id} not delivered: {WebhookDelivery.objects.get(id=delivery_id).log}")


@pytest.mark.django_db(transaction=True)
def test_a_done_job_is_posted_signed_and_retried_after_a_receiver_failure(workers, alice_api, receiver):
    hook = receiver(plan=[500, 200])
    secret = alice_api.get("/api/v1/account").json()["webhook_secret"]
    assert secret.startswith("whsec_")
    job = alice_api.post("/api/v1/jobs", {**BODY, "webhook_url": hook.url}, format="json").json()
    assert job["webhook_url"] == hook.url
    wait_for_status(job["id"], ("done",), timeout=90)
    first, second = hook.wait_for(2)
    for request in (first, second):
        assert webhooks.verify(secret, request["headers"], request["body"]), request["headers"]
        assert not webhooks.verify(secret, request["headers"], request["body"] + " ")
    assert first["headers"]["webhook-id"] == second["headers"]["webhook-id"]  # one message, two attempts
    payload = json.loads(second["body"])
    assert payload["id"] == job["id"] and payload["status"] == "done" and len(payload["images"]) == 1
    row = _delivered(WebhookDelivery.objects.get(job_id=job["id"]).id)
    assert row.attempts == 2 and [a["status"] for a in row.log] == [500, 200]
    assert row.message_id == first["headers"]["webhook-id"]


@pytest.mark.django_db(transaction=True)
def test_rotating_the_secret_signs_with_the_new_one(alice_api):
    old = alice_api.get("/api/v1/account").json()["webhook_secret"]
    new = alice_api.post("/api/v1/account/webhook-secret").json()["webhook_secret"]
    assert new != old and alice_api.get("/api/v1/account").json()["webhook_secret"] == new
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(int(time.time()))}
    headers["webhook-signature"] = webhooks.sign(new, "msg_1", int(headers["webhook-timestamp"]), "{}")
    assert webhooks.verify(new, headers, "{}") and not webhooks.verify(old, headers, "{}")


@pytest.mark.django_db(transaction=True)
def test_a_delivery_survives_a_sigkill_of_the_worker_sending_it(workers, reaper, start_worker, alice, receiver):
    """The attempt's worker is killed while the receiver holds its request: the outbox row stays
    undelivered, and once the attempt's lease ends the reaper sends it
    again through the webhooks queue."""
    hook = receiver(plan=["hang", 200])
    api = client_for(alice)
    victim = start_worker("webhooks-victim", "webhooks-victim")
    with admitted_to("no-gpu-webhook"):
        job = api.post("/api/v1/jobs", {**BODY, "webhook_url": hook.url}, format="json").json()
    with override_settings(QUEUE_WEBHOOKS="webhooks-victim"):  # the first attempt goes to the victim
        assert api.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    hanging = hook.wait_for(1, timeout=30)[0]
    row = WebhookDelivery.objects.get(job_id=job["id"])
    assert row.attempts == 1 and row.delivered_at is None
    victim.kill()
    hook.release.set()
    row = _delivered(row.id, timeout=60)
    resent = hook.wait_for(2)[1]
    assert resent["headers"]["webhook-id"] == hanging["headers"]["webhook-id"]
    assert webhooks.verify(webhooks.secret_for(alice), resent["headers"], resent["body"])
    assert json.loads(resent["body"])["status"] == "cancelled"
    assert row.attempts == 2 and row.log[-1]["status"] == 200


@pytest.mark.django_db
def test_webhook_urls_are_checked(alice_api, settings):
    for url, why in (("ftp://example.com/x", "https"), ("http://example.com/x", "https"), ("https://", "host"),
                     ("https://user:pw@127.0.0.1/x", "password")):
        response = alice_api.post("/api/v1/jobs", {**BODY, "webhook_url": url}, format="json")
        assert response.status_code == 400 and why in response.json()["webhook_url"][0], (url, response.json())
    settings.EMBEDDED = False  # production: private and loopback targets are refused, http too
    for url in ("https://127.0.0.1/x", "https://10.1.2.3/x", "https://[::1]/x", "http://127.0.0.1/x"):
        response = alice_api.post("/api/v1/jobs", {**BODY, "webhook_url": url}, format="json")
        assert response.status_code == 400 and "webhook_url" in response.json(), url
    with pytest.raises(webhooks.WebhookURLError):
        webhooks.validate_url("https://169.254.169.254/latest/meta-data")


@pytest.mark.django_db(transaction=True)
def test_redirects_are_not_followed_and_count_as_failures(alice, receiver):
    hook = receiver(plan=[302])
    job = GenerationJob.objects.create(owner=alice, prompt="p", width=64, height=64, steps=2, guidance_scale=5.0,
                                       seed=1, model_version="v", webhook_url=hook.url)
    row = WebhookDelivery.objects.create(job=job, status="cancelled", url=hook.url, body="{}")
    assert webhooks.deliver(str(row.id)) == "retry"
    row.refresh_from_db()
    assert row.delivered_at is None and "redirects are not followed" in row.last_error and row.last_status_code == 302
    # Operators see each delivery's attempts in the admin.
    from django.contrib.auth import get_user_model
    from django.test import Client

    staff = get_user_model().objects.create_superuser("ops", password="ops-pw")
    admin = Client()
    admin.force_login(staff)
    listing = admin.get("/admin/jobs/webhookdelivery/")
    assert listing.status_code == 200 and hook.url.encode() in listing.content
    detail = admin.get(f"/admin/jobs/webhookdelivery/{row.id}/change/")
    assert detail.status_code == 200 and b"redirects are not followed" in detail.content


# --- priority tiers: prices and limits; weights ---

def test_the_forecast_prices_both_tiers():
    from scheduling.forecast import Inputs, forecast

    r = forecast(Inputs(images_per_day=50_000_000, gpu_hour_price=2, steps=30, step_seconds_batch1=0.040,
                        step_seconds_best=0.020, best_batch=8, utilization=0.5))
    # interactive: 1.2 GPU-s at batch 1 over a half-busy fleet; batch: 0.6 GPU-s in full passes at 90%.
    assert r["price_per_image"]["interactive"] == pytest.approx(1.2 / 3600 * 2 / 0.5)
    assert r["price_per_image"]["batch"] == pytest.approx(0.6 / 3600 * 2 / 0.9)


@pytest.mark.django_db
def test_batch_jobs_have_their_own_in_flight_limit_and_quota(alice_api, settings, stay_queued):
    settings.IMAGEGEN_USER_MAX_IN_FLIGHT = 1
    settings.IMAGEGEN_USER_MAX_BATCH_IN_FLIGHT = 2
    settings.IMAGEGEN_USER_MAX_BATCH_IMAGES_PER_DAY = 3
    assert alice_api.post("/api/v1/jobs", BODY, format="json").status_code == 202
    refused = alice_api.post("/api/v1/jobs", BODY, format="json")
    assert refused.status_code == 429 and refused.json()["limit"] == "jobs_in_flight"
    batch = {**BODY, "priority": "batch", "count": 2}
    assert alice_api.post("/api/v1/jobs", batch, format="json").status_code == 202  # its own limits
    over = alice_api.post("/api/v1/jobs", batch, format="json")
    assert over.status_code == 429 and over.json()["limit"] == "images_per_day" and "batch" in over.json()["detail"]
    account = alice_api.get("/api/v1/account").json()
    assert account["interactive"]["jobs_in_flight"] == 1 and account["batch"]["images_today"] == 2


def test_user_weights_are_read_and_checked(monkeypatch):
    from imagegen.env import ImproperlyConfiguredEnv, env_weights

    monkeypatch.setenv("IMAGEGEN_USER_WEIGHTS", "alice=4, bulk-bot=0.5")
    assert env_weights("IMAGEGEN_USER_WEIGHTS") == {"alice": 4.0, "bulk-bot": 0.5}
    for bad in ("alice", "alice=0", "alice=x", "=2"):
        monkeypatch.setenv("IMAGEGEN_USER_WEIGHTS", bad)
        with pytest.raises(ImproperlyConfiguredEnv):
            env_weights("IMAGEGEN_USER_WEIGHTS")
