"""The rewrite stage through real workers: a free-form prompt goes through the shipped rewriter
(models/rewriter-v2) on its own queue, is checked again, drawn, and reported on both APIs; a
rewrite the gate refuses costs no image GPU time; the cache hits only with the same rewriter;
a rewriter killed mid-pass loses nothing."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from django.conf import settings
from PIL import Image

from tests.conftest import admitted_to, wait_for_status, wait_until_cached
from tests.live_server import start_daphne, stop_daphne

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.django_db(transaction=True)

FREE_FORM = "a vermilion pebble against a cerulean sky"
DRAWN = "a red circle on a blue background"


def submit(api, prompt: str, **extra) -> dict:
    body = {"prompt": prompt, "width": 64, "height": 64, "steps": 2, "seed": 7, "rewrite": "on", **extra}
    response = api.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 202, response.content
    return response.json()


def stored_bytes(image) -> bytes:
    from jobs.media.storage import public_storage

    with public_storage().open(image.storage_key, "rb") as fh:
        return fh.read()


def test_a_free_form_prompt_is_rewritten_checked_again_and_drawn(workers, alice_api):
    from jobs.models import GenerationJob

    job_id = submit(alice_api, FREE_FORM, seed=3101)["id"]
    canonical_id = submit(alice_api, DRAWN, seed=3102)["id"]
    wait_for_status(job_id, ("done",))
    wait_for_status(canonical_id, ("done",))

    body = alice_api.get(f"/api/v1/jobs/{job_id}").json()
    assert body["prompt"] == FREE_FORM  # the user's own, as written
    assert body["revised_prompt"] == DRAWN and body["rewrite"] is True
    assert body["rewriter"].startswith("rewriter-v2@")
    job = GenerationJob.objects.get(id=job_id)
    assert job.drawn_prompt == DRAWN and job.rewrite_attempts == 1
    gates = dict(job.verdicts.filter(stage__in=("prompt", "rewrite")).values_list("stage", "decision"))
    assert gates == {"prompt": "allow", "rewrite": "allow"}  # checked twice: as written, and as drawn
    with Image.open(io.BytesIO(stored_bytes(job.images.get()))) as im:
        assert im.info["parameters"].split("\n")[0] == DRAWN, im.info  # what was drawn, as A1111 tools read it

    # A prompt already in the grammar is drawn as written, and needs no second check.
    canonical = GenerationJob.objects.get(id=canonical_id)
    assert canonical.revised_prompt == DRAWN and canonical.drawn_prompt == DRAWN
    assert not canonical.verdicts.filter(stage="rewrite").exists()
    with Image.open(io.BytesIO(stored_bytes(canonical.images.get()))) as im:
        assert im.info["parameters"].split("\n")[0] == DRAWN

    # Off: the stage is skipped, nothing is reported as revised.
    off = submit(alice_api, FREE_FORM, seed=3103, rewrite="off")
    assert off["rewrite"] is False and off["revised_prompt"] is None and off["rewriter"] is None
    done = wait_for_status(off["id"], ("done",))
    assert done.drawn_prompt == FREE_FORM and done.rewritten_at is None


def test_a_rewrite_the_gate_refuses_is_blocked_at_the_second_check_and_costs_no_gpu_time(workers, alice_api):
    """The default policy blocks stars; the user wrote "étoile", which the first check lets
    through, and the rewriter translated it into the grammar's "star"."""
    from jobs.models import Batch, GenerationJob, UsageCharge

    batches = Batch.objects.count()
    job_id = submit(alice_api, "une étoile jaune sur fond bleu", seed=3201)["id"]
    job = wait_for_status(job_id, ("blocked",))
    assert job.blocked_stage == "rewrite"
    assert job.revised_prompt == "a yellow star on a blue background"
    assert job.reason.startswith("the rewritten prompt:"), job.reason
    gates = dict(job.verdicts.filter(stage__in=("prompt", "rewrite")).values_list("stage", "decision"))
    assert gates == {"prompt": "allow", "rewrite": "block"}
    job = GenerationJob.objects.get(id=job_id)
    assert job.batch_id is None and job.started_at is None and job.charged_at is None and job.scheduled_at is None
    assert not UsageCharge.objects.filter(job_id=job_id).exists()
    assert Batch.objects.count() == batches  # no pass ran for it
    body = alice_api.get(f"/api/v1/jobs/{job_id}").json()
    assert body["blocked_stage"] == "rewrite" and body["revised_prompt"] == "a yellow star on a blue background"


def test_the_cache_hits_only_with_the_same_rewriter(workers, alice_api, settings, tmp_path):
    first = submit(alice_api, FREE_FORM, seed=3301)
    delivered = wait_for_status(first["id"], ("done",))
    wait_until_cached(delivered)

    again = submit(alice_api, FREE_FORM, seed=3301)
    assert again["status"] == "done" and again["revised_prompt"] == DRAWN  # the same rewrite, from the cache
    assert submit(alice_api, FREE_FORM, seed=3301, rewrite="off")["status"] == "queued"  # not rewritten: another key

    other = tmp_path / "rewriter-v2"  # another version of the rewriter: one file differs
    shutil.copytree(settings.IMAGEGEN_REWRITER_PATH, other)
    config = other / "config.json"
    config.write_text(config.read_text() + "\n")
    settings.IMAGEGEN_REWRITER_PATH = str(other)
    probe = submit(alice_api, FREE_FORM, seed=3301)
    assert probe["status"] == "queued", "an image rewritten by another rewriter version was served from the cache"


def test_the_openai_route_rewrites_by_the_server_default_and_reports_revised_prompt(workers, worker_env, alice):
    server = start_daphne({**worker_env, "IMAGEGEN_REWRITE_DEFAULT": "on"}, Path(settings.VAR_DIR),
                          name="daphne-rewrite", collectstatic=False)
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=alice.auth_token.key, max_retries=0, timeout=90)
        result = client.images.generate(prompt="a ball the colour of grass on cream", size="64x64", n=1,
                                        response_format="url")
        assert result.data[0].revised_prompt == "a green circle on a white background"
        assert httpx.get(result.data[0].url, timeout=10).status_code == 200
        canonical = client.images.generate(prompt=DRAWN, size="64x64", n=1, response_format="b64_json")
        assert canonical.data[0].revised_prompt == DRAWN  # drawn as written
    finally:
        stop_daphne(server)


def test_rewrite_is_validated():
    from rest_framework.test import APIClient

    from tests.conftest import make_user

    api = APIClient()
    api.force_authenticate(make_user("rewrite-validation"))
    bad = api.post("/api/v1/jobs", {"prompt": DRAWN, "rewrite": "sometimes"}, format="json")
    assert bad.status_code == 400 and "rewrite" in bad.json(), bad.content
    from django.test import override_settings

    with override_settings(IMAGEGEN_REWRITER_PATH=""):
        none = api.post("/api/v1/jobs", {"prompt": DRAWN, "rewrite": "on"}, format="json")
    assert none.status_code == 400, none.content
    assert "no prompt rewriter" in str(none.json()["rewrite"])


_DIE_MID_PASS = r"""
import sys, time
import django
django.setup()
from gpu_tasks import rewrite_stage

class Stuck:
    version = "stuck"
    def rewrite(self, prompts):
        print("CLAIMED", flush=True)
        time.sleep(600)

rewrite_stage.rewriter = lambda: Stuck()
rewrite_stage.run(sys.argv[1])
"""


def test_a_rewriter_killed_mid_pass_loses_nothing(workers, worker_env, alice_api, settings, request):
    """A worker claims the job and is SIGKILLed inside its forward pass: the lease runs out, the
    reaper re-sends a rewrite token for the job still in `rewrite`, which wakes another
    rewriter, whose run counts the second attempt; the job is drawn with its rewritten prompt.
    The reaper starts once the doomed worker holds the job (before, its re-send,
    IMAGEGEN_PROMPT_CHECK_RESEND_SECONDS after the submit, could hand the job to the session's
    rewriter while the doomed process was still starting on a loaded machine)."""
    from jobs.models import GenerationJob

    queue = settings.QUEUE_REWRITE
    settings.QUEUE_REWRITE = "rewrite-nobody"  # the first wake goes nowhere: the doomed process claims it
    with admitted_to(settings.IMAGEGEN_MODEL_NAME):
        job_id = submit(alice_api, FREE_FORM, seed=3401)["id"]
    doomed = subprocess.Popen([sys.executable, "-c", _DIE_MID_PASS, job_id], cwd=ROOT, env=worker_env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        line = ""
        deadline = time.monotonic() + 180
        while "CLAIMED" not in line and time.monotonic() < deadline and doomed.poll() is None:
            line = doomed.stdout.readline()
        assert "CLAIMED" in line, doomed.stdout.read() if doomed.poll() is not None else line
        job = GenerationJob.objects.get(id=job_id)
        assert job.rewrite_attempts == 1 and job.rewrite_lease_expires_at is not None
    finally:
        if doomed.poll() is None:
            os.killpg(doomed.pid, signal.SIGKILL)  # inside its forward pass, as a lost host would
        doomed.wait(timeout=10)
    settings.QUEUE_REWRITE = queue  # the reaper's re-send goes to the session's rewriter
    request.getfixturevalue("reaper")
    resend = settings.IMAGEGEN_PROMPT_CHECK_RESEND_SECONDS + settings.IMAGEGEN_LEASE_SECONDS
    done = wait_for_status(job_id, ("done",), timeout=resend + 180)
    assert done.rewrite_attempts == 2 and done.drawn_prompt == DRAWN and done.reason == ""
    assert done.images.count() == 1


def test_a_rewrite_interrupted_past_the_attempts_fails_naming_the_stage(alice):
    from datetime import timedelta

    from django.utils import timezone

    from jobs import actions
    from jobs.models import GenerationJob
    from safety.models import SafetyVerdict

    job = GenerationJob.objects.create(
        owner=alice, prompt=FREE_FORM, width=64, height=64, steps=2, guidance_scale=5.0, seed=1, model_version="m",
        rewrite=True, rewrite_attempts=settings.IMAGEGEN_MAX_ATTEMPTS, stage="rewrite",
        rewrite_lease_expires_at=timezone.now() - timedelta(seconds=1),
    )
    SafetyVerdict.objects.create(job=job, stage="prompt", decision="allow")  # what moved it to `rewrite`
    assert actions.claim_rewrites(str(job.id), 16) == []
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.reason == f"rewriting the prompt was interrupted {settings.IMAGEGEN_MAX_ATTEMPTS} times; nothing was generated"


def test_the_rewriters_cost_enters_the_estimate_and_the_forecast(workers, redis_client):
    from django.core.management import call_command

    from jobs.admission import control
    from scheduling import costs, scheduler
    from scheduling.forecast import Inputs, forecast

    redis_client.hdel(costs.COST_KEY, costs.REWRITE_PASS_FIELD, costs.REWRITE_PROMPT_FIELD)
    assert costs.rewrite_seconds(costs.costs()) == settings.IMAGEGEN_PRIOR_REWRITE_SECONDS  # before any pass
    costs.record_rewrite_cost(16, 0.032)
    assert costs.rewrite_seconds(costs.costs()) == pytest.approx(0.032)
    assert costs.recent_rewrite_seconds(max_age=0) == pytest.approx(0.032)  # what a submit reads
    def shape(steps: int) -> str:
        return scheduler.shape_key(settings.IMAGEGEN_MODEL_VERSION, 64, 64, steps, 5.0, "")

    plain = control.admit_or_degrade(shape, 1, 2, False)[1]
    rewritten = control.admit_or_degrade(shape, 1, 2, False, rewrite=True)[1]
    assert plain.eta_seconds is not None, "a live GPU worker gives an estimate"
    assert rewritten.eta_seconds - plain.eta_seconds == pytest.approx(0.032, abs=0.02)

    r = forecast(Inputs(images_per_day=1e6, gpu_hour_price=2, steps=20, step_seconds_batch1=0.01,
                        step_seconds_best=0.005, best_batch=8, rewrite_seconds_per_prompt=0.002, rewrite_share=0.5))
    assert r["rewrite"]["without"] == pytest.approx(0.1) and r["rewrite"]["with"] == pytest.approx(0.101)

    import io as _io
    import json

    out = _io.StringIO()
    call_command("forecast", "--images-per-day", "1000000", "--gpu-hour-price", "2", "--step-ms", "5",
                 "--rewrite-ms", "2", "--json", stdout=out)
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert result["rewrite"]["seconds_per_prompt"] == pytest.approx(0.002)
    assert result["rewrite"]["with"] > result["rewrite"]["without"]


def test_the_page_has_the_rewrite_switch_ticked_as_the_server_default(alice, settings):
    from django.test import Client

    client = Client()
    client.force_login(alice)
    page = client.get("/").content.decode()
    switch = page[page.index('id="rewrite"'):].split(">", 1)[0]
    assert "checked" not in switch  # the tests' server default is off
    settings.IMAGEGEN_REWRITE_DEFAULT = "on"
    page = client.get("/").content.decode()
    assert "checked" in page[page.index('id="rewrite"'):].split(">", 1)[0]
    settings.IMAGEGEN_REWRITER_PATH = ""
    assert 'id="rewrite"' not in client.get("/").content.decode()  # no rewriter: no switch


def test_a_rewrite_run_never_takes_a_job_whose_own_prompt_was_not_allowed(alice):
    """The rewrite claim takes only jobs in its stage, which only the gate's allow or a
    moderator's approval of the prompt as the user wrote it moves them to: not one still waiting
    for its check, nor one whose block verdict a batch drain recorded but has not yet applied
    (both still in `prompt`)."""
    from jobs import actions
    from jobs.models import GenerationJob
    from safety.models import SafetyVerdict

    def job(prompt: str, **extra) -> GenerationJob:
        return GenerationJob.objects.create(owner=alice, prompt=prompt, width=64, height=64, steps=2,
                                            guidance_scale=5.0, seed=1, model_version="m", rewrite=True, **extra)

    unchecked = job("a yellow star on a blue background")
    drained = job("a yellow star on a blue background")
    SafetyVerdict.objects.create(job=drained, stage="prompt", decision="block", category="star")
    allowed = job(FREE_FORM, stage="rewrite")
    SafetyVerdict.objects.create(job=allowed, stage="prompt", decision="allow")
    approved = job("a heart of lava", stage="rewrite")
    SafetyVerdict.objects.create(job=approved, stage="prompt", decision="review", category="heart")
    SafetyVerdict.objects.create(job=approved, stage="human", decision="allow")

    claimed = {j.id for j in actions.claim_rewrites(str(unchecked.id), 16)}
    assert claimed == {allowed.id, approved.id}
    for untouched in (unchecked, drained):
        untouched.refresh_from_db()
        assert untouched.rewrite_attempts == 0 and untouched.rewrite_lease_expires_at is None


def test_a_rewrite_woken_by_another_job_leaves_an_unchecked_prompt_alone(workers, alice_api, bob_api, monkeypatch):
    """Through real workers: bob's disallowed prompt waits for its check (its message not yet
    delivered, as when the prompt checks are backed up) when alice's job wakes a rewriter. The
    rewriter must not take bob's job: an unchanged rewrite would send it to generation with no
    verdict on what bob wrote."""
    from jobs.models import GenerationJob
    from jobs.pipeline import stages

    original = stages.send
    monkeypatch.setattr(stages, "send", lambda stage, *args, countdown=None: stage != "prompt" and original(
        stage, *args, countdown=countdown))
    star = submit(bob_api, "a yellow star on a blue background", seed=3501)["id"]
    monkeypatch.setattr(stages, "send", original)
    alices = submit(alice_api, FREE_FORM, seed=3502)["id"]
    wait_for_status(alices, ("done",))

    job = GenerationJob.objects.get(id=star)
    assert job.rewritten_at is None and job.rewrite_attempts == 0, "a rewrite took a job whose prompt was never checked"
    assert job.scheduled_at is None and job.batch_id is None and not job.images.exists()
    stages_seen = set(job.verdicts.values_list("stage", flat=True))
    assert stages_seen <= {"prompt"}, stages_seen  # at most its own check (a re-send by the reaper)
    if job.status != "queued":
        assert job.status == "blocked" and job.blocked_stage == "prompt", (job.status, job.blocked_stage)


def test_an_approved_prompt_is_not_asked_about_again_at_its_rewrite_so_a_job_asks_at_most_twice(
    workers, alice_api, moderator, classifier_mode,
):
    """A free-form heart prompt is held at its check and a moderator approves it; the rewriter
    writes it in the shapes' words, which the gate holds for the same category: the question
    the moderator answered, so the job goes on to generation. Its images, held by the image
    gate, are the second and last question (it asked three times before: prompt, rewrite, image)."""
    from jobs.actions import approve
    from safety.models import SafetyVerdict

    job_id = submit(alice_api, "a crimson heart against a snowy background", seed=3601)["id"]
    held = wait_for_status(job_id, ("review",))
    assert held.blocked_stage == "prompt", held.reason
    classifier_mode('json:{"heart": 0.8}')  # the image gate holds every image
    approve(held, moderator, "a heart shape is fine")
    again = wait_for_status(job_id, ("review",))
    assert again.blocked_stage == "image", (again.blocked_stage, again.reason)
    assert again.revised_prompt == "a red heart on a white background"
    rewrite_verdict = SafetyVerdict.objects.get(job_id=job_id, stage="rewrite")
    assert rewrite_verdict.decision == "review"  # the gate's own answer stays on record
    classifier_mode(None)
    approve(again, moderator, "fine")
    done = wait_for_status(job_id, ("done",))
    human = SafetyVerdict.objects.filter(job_id=job_id, stage="human")
    assert human.filter(image__isnull=True).count() == 1 and human.filter(image__isnull=False).count() == done.count


def test_a_rewrite_raising_a_category_the_moderator_did_not_see_is_asked_about(alice, moderator):
    """The approval carries only to what the moderator saw: a rewrite held for another category
    waits for a moderator again (the gate called directly, on a job placed just after its
    rewrite)."""
    from django.utils import timezone

    from jobs.models import GenerationJob
    from jobs.pipeline import prompt_gate
    from safety.models import SafetyVerdict

    job = GenerationJob.objects.create(
        owner=alice, prompt="a crimson heart against a snowy background", width=64, height=64, steps=2,
        guidance_scale=5.0, seed=1, model_version="tiny-random", stage="rewrite_check", rewrite=True,
        revised_prompt="a red heart on a white background", rewritten_at=timezone.now(),
        prompt_checked_at=timezone.now(),
    )
    SafetyVerdict.objects.create(job=job, stage="prompt", decision="review", category="another_category")
    SafetyVerdict.objects.create(job=job, stage="human", decision="allow", reviewer=moderator)
    assert prompt_gate.gate_prompt(str(job.id)) == "review"
    job.refresh_from_db()
    assert (job.status, job.blocked_stage) == ("review", "rewrite")
