"""More than one served model: a job names its model (native API and the OpenAI route), runs on
that model's own lane and records its version; the model's serving profile gives its default
steps; GET /v1/models lists every version; the forecast prices each; the page offers the choice."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import numpy as np
import pytest
from django.core.management import call_command

from gpu_tasks.tiny_pipeline import write_tiny_pipeline
from scheduling import catalogue
from scheduling.lanes import gpu_queue, lane_of
from tests.conftest import forget_cache, wait_for_status
from tests.test_generation import pixels, submit

pytestmark = pytest.mark.django_db(transaction=True)
FAST = "tiny-fast"


@pytest.fixture
def fast_model(settings):
    """A second served version (other weights) with a serving profile of few steps."""
    path = Path(settings.VAR_DIR) / "models" / FAST
    if not (path / "model_index.json").exists():
        write_tiny_pipeline(path, seed=2)
    (path / "serving.json").write_text(json.dumps({
        "default_steps": 2, "max_steps": 6, "guidance_scale": 1.5, "label": "fast",
        "quality_steps": {"low": 1, "medium": 2, "high": 4}, "batch_caps": {"64x64": 2}, "fill_wait": 0.05,
    }))
    settings.IMAGEGEN_EXTRA_MODELS = {FAST: str(path)}
    return path


def test_the_catalogue_lists_the_default_first_and_the_extra_version_with_its_profile(fast_model, settings):
    served = catalogue.served()
    assert list(served) == [settings.IMAGEGEN_MODEL_VERSION, FAST]
    fast = served[FAST]
    assert (fast.default_steps, fast.max_steps, fast.guidance_scale, fast.default) == (2, 6, 1.5, False)
    assert catalogue.version_of_lane(lane_of(FAST)) == FAST
    assert catalogue.version_of_lane(lane_of(settings.IMAGEGEN_MODEL_VERSION)) == settings.IMAGEGEN_MODEL_VERSION
    out = StringIO()
    call_command("served_models", "--queues", stdout=out)
    assert out.getvalue().strip() == f"{settings.QUEUE_GPU},{gpu_queue(lane_of(FAST))}"


def test_the_second_models_batch_caps_and_fill_wait_apply_to_its_lane_only(fast_model, settings, redis_client):
    from scheduling import scheduler

    default_version = settings.IMAGEGEN_MODEL_VERSION
    assert scheduler.cap_for(64, 64, FAST) == 2 and scheduler.cap_for(96, 96, FAST) == settings.IMAGEGEN_BATCH_CAP
    assert scheduler.cap_for(64, 64, default_version) == settings.IMAGEGEN_BATCH_CAP
    assert scheduler.fill_wait_for(FAST) == 0.05 and scheduler.fill_wait_for(default_version) == settings.IMAGEGEN_FILL_WAIT
    lane = lane_of(FAST)
    fast_shape = scheduler.shape_key(FAST, 64, 64, 2, 1.5, "")
    default_shape = scheduler.shape_key(default_version, 64, 64, 2, 1.5, "")
    for i in range(3):  # the Lua take reads the same per-version caps
        scheduler.enqueue(lane, fast_shape, f"fast-{i}", 1, owner="u")
        scheduler.enqueue("caps-default-lane", default_shape, f"default-{i}", 1, owner="u")
    assert scheduler.take(lane).images == 2
    assert scheduler.take("caps-default-lane").images == 3
    assert scheduler.take(lane).images == 1 and scheduler.take(lane) is None  # drained: no stray entries


def test_an_unknown_model_or_too_many_steps_for_it_is_a_400_naming_the_field(fast_model, alice_api):
    r = alice_api.post("/api/v1/jobs", {"prompt": "a red circle", "model": "nope"}, format="json")
    assert r.status_code == 400 and "model" in r.json(), r.content
    assert FAST in json.dumps(r.json())
    r = alice_api.post("/api/v1/jobs", {"prompt": "a red circle", "model": FAST, "steps": 7}, format="json")
    assert r.status_code == 400 and "steps" in r.json(), r.content


def test_a_job_naming_the_second_model_runs_on_its_lane_at_its_steps_and_records_its_version(
        fast_model, workers, start_worker, alice_api, settings):
    lane = lane_of(FAST)
    # One GPU worker for both lanes, as `make run` starts it on a small machine.
    both = start_worker("gpu-both", f"{settings.QUEUE_GPU},{gpu_queue(lane)}", IMAGEGEN_EXTRA_MODELS=f"{FAST}={fast_model}")
    try:
        r = alice_api.post("/api/v1/jobs", {"prompt": "a green square", "width": 64, "height": 64, "seed": 99, "model": FAST},
                           format="json")
        assert r.status_code == 202, r.content
        fast = r.json()
        assert fast["model"] == FAST and fast["steps"] == 2 and fast["guidance_scale"] == 1.5
        done = wait_for_status(fast["id"], ("done",))
        assert done.model_version == FAST and done.batch.lane == lane and done.batch.cap == 2
        assert done.batch.worker.endswith(f":{both.proc.pid}"), "only the worker consuming the lane ran it"
        forget_cache(done)  # made again, not served from the cache
        again = wait_for_status(submit(alice_api, seed=99, prompt="a green square", steps=2, guidance_scale=1.5,
                                       model=FAST)["id"], ("done",))
        assert again.id != done.id
        default = wait_for_status(submit(alice_api, seed=99, prompt="a green square", steps=2, guidance_scale=1.5)["id"],
                                  ("done",))
        assert default.model_version == settings.IMAGEGEN_MODEL_VERSION and default.batch.lane == settings.IMAGEGEN_MODEL_NAME
        assert np.array_equal(pixels(done.id)[0], pixels(again.id)[0]), "deterministic on its own model"
        assert not np.array_equal(pixels(done.id)[0], pixels(default.id)[0]), "two models, two outputs"
        queue = alice_api.get("/api/v1/queue").json()["models"]
        assert [m["version"] for m in queue] == [settings.IMAGEGEN_MODEL_VERSION, FAST]
        assert queue[1]["model"] == lane and queue[1]["active_workers"] >= 1 and queue[1]["default_steps"] == 2
    finally:
        both.stop()  # the session's other tests count on one GPU worker for the default lane


def test_openai_models_list_both_and_a_quality_tier_can_pick_the_fast_model(fast_model, alice, settings):
    from rest_framework.test import APIClient

    from jobs.api.openai import compat as openai_compat

    alice_api = APIClient()
    alice_api.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.auth_token.key}")

    listed = alice_api.get("/v1/models").json()["data"]
    assert [m["id"] for m in listed] == [settings.IMAGEGEN_MODEL_VERSION, FAST]
    assert alice_api.get(f"/v1/models/{FAST}").json()["id"] == FAST
    assert alice_api.get("/v1/models/nope").status_code == 404
    settings.IMAGEGEN_QUALITY_MODELS = {"low": FAST}
    from jobs.api.serializers import JobCreateSerializer

    def job(**openai_attrs) -> dict:  # the native job data an OpenAI request becomes
        native = JobCreateSerializer(data={"prompt": "a red circle", **openai_compat.native_fields(openai_attrs)})
        assert native.is_valid(), native.errors
        return native.validated_data

    assert job(quality="low")["model"] == FAST
    assert job(quality="low")["steps"] == 2  # the fast model's default
    assert job(quality="high", model=FAST)["steps"] == 4  # its own tiers
    assert job(quality="high")["model"] == ""  # the default model
    r = alice_api.post("/v1/images/generations", {"prompt": "a red circle", "model": "nope"}, format="json")
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


def test_the_forecast_prices_each_served_version_at_its_own_steps(fast_model, settings):
    out = StringIO()
    call_command("forecast", "--images-per-day", "10000", "--gpu-hour-price", "2", "--step-ms", "10", "--json", stdout=out)
    models = {m["version"]: m for m in json.loads(out.getvalue())["models"]}
    assert set(models) == {settings.IMAGEGEN_MODEL_VERSION, FAST}
    assert models[FAST]["steps"] == 2
    ratio = models[FAST]["gpu_seconds_per_image"] / models[settings.IMAGEGEN_MODEL_VERSION]["gpu_seconds_per_image"]
    assert ratio == pytest.approx(2 / settings.IMAGEGEN_DEFAULT_STEPS)


def test_the_page_offers_the_model_choice_with_each_models_steps(fast_model, alice, client):
    client.force_login(alice)
    page = client.get("/").content.decode()
    assert 'id="model"' in page and f'value="{FAST}" data-steps="2" data-min-steps="1" data-max-steps="6"' in page


def test_measure_batch_caps_writes_the_versions_serving_profile(fast_model, settings):
    out = StringIO()
    call_command("measure_batch_caps", "--model-version", FAST, "--batches", "1,2", "--images", "2", "--sizes", "64x64",
                 "--write-serving", stdout=out)
    profile = json.loads((fast_model / "serving.json").read_text())
    assert set(profile["batch_caps"]) == {"64x64"} and profile["batch_caps"]["64x64"] in (1, 2)
    assert profile["default_steps"] == 2, "the rest of the profile is kept"
    assert "steps=2" in out.getvalue(), "measured at the model's own default steps"



SHIPPED = Path(__file__).resolve().parents[1] / "models"
STUDENT = "shapes-v1-lcm"


def test_the_shipped_deployment_serves_v2_by_default_and_keeps_v1_and_both_students():
    """Issue 34: shapes-v2 is the default; shapes-v1 stays served (its old jobs regenerate) and so
    does its distilled student; v2's student, at 4 steps, is the OpenAI "low" tier; no canary once
    promoted."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("IMAGEGEN_MODEL_PATH", "IMAGEGEN_MODEL_VERSION")}
    out = subprocess.run([sys.executable, "manage.py", "served_models"], cwd=SHIPPED.parent, env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    rows = {line.split()[0]: line for line in out if line.strip()}
    assert out[0].startswith("shapes-v2 ") and "gpu.shapes " in out[0] and out[0].rstrip().endswith("/models/shapes-v2")
    assert "gpu.shapes@shapes-v1 " in rows["shapes-v1"]
    assert f"gpu.shapes@{STUDENT}" in rows[STUDENT] and "steps   1" in rows[STUDENT]
    assert "gpu.shapes@shapes-v2-lcm" in rows["shapes-v2-lcm"] and "steps   4" in rows["shapes-v2-lcm"]
    shown = subprocess.run([sys.executable, "manage.py", "shell", "-c", "from django.conf import settings as s; "
                            "print(s.IMAGEGEN_QUALITY_MODELS['low'], s.IMAGEGEN_CANARY_VERSION or '-', bool(s.IMAGEGEN_REWRITER_PATH))"],
                           cwd=SHIPPED.parent, env=env, capture_output=True, text=True, timeout=120, check=True)
    assert shown.stdout.splitlines()[-1].split() == ["shapes-v2-lcm", "-", "True"]
    # Rolling back: v1 as the default, v2 still served beside it.
    back = subprocess.run([sys.executable, "manage.py", "served_models"], cwd=SHIPPED.parent,
                          env={**env, "IMAGEGEN_MODEL_PATH": str(SHIPPED / "shapes-v1")},
                          capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    assert back[0].startswith("shapes-v1 ") and "gpu.shapes " in back[0] and any(line.startswith("shapes-v2 ") for line in back)


def test_a_job_naming_the_student_runs_on_its_lane_in_one_step_and_a_negative_prompt_is_refused(
        workers, start_worker, alice_api, settings):
    path = SHIPPED / STUDENT
    settings.IMAGEGEN_EXTRA_MODELS = {STUDENT: str(path)}
    lane = lane_of(STUDENT)
    r = alice_api.post("/api/v1/jobs", {"prompt": "a red circle", "model": STUDENT, "negative_prompt": "blue"},
                       format="json")
    assert r.status_code == 400 and "negative_prompt" in r.json(), r.content
    worker = start_worker("gpu-student", gpu_queue(lane), IMAGEGEN_EXTRA_MODELS=f"{STUDENT}={path}")
    try:
        body = {"prompt": "a red circle on a blue background", "width": 64, "height": 64, "seed": 4, "model": STUDENT}
        first = wait_for_status(alice_api.post("/api/v1/jobs", body, format="json").json()["id"], ("done",))
        assert first.model_version == STUDENT and first.steps == 1 and first.batch.lane == lane
        assert first.batch.cap == catalogue.get(STUDENT).batch_caps["64x64"]
        forget_cache(first)
        again = wait_for_status(alice_api.post("/api/v1/jobs", body, format="json").json()["id"], ("done",))
        assert np.array_equal(pixels(first.id)[0], pixels(again.id)[0]), "deterministic"
        picture = pixels(first.id)[0].reshape(-1, 3).astype(int)
        assert picture.std(axis=0).max() > 10, "a picture, not a flat field"
    finally:
        worker.stop()


def test_an_allow_degrade_job_is_lowered_to_its_models_own_degrade_steps(fast_model, workers, start_worker, alice_api,
                                                                         settings):
    """A model's serving.json `degrade_steps` (shapes-v2: 12, where it still draws every kind; at
    the deployment's 8 it does not) wins over IMAGEGEN_DEGRADE_STEPS for jobs on that model."""
    from imagegen.redis_client import get_redis
    from scheduling import scheduler
    from scheduling.costs import COST_KEY

    profile = json.loads((fast_model / "serving.json").read_text())
    (fast_model / "serving.json").write_text(json.dumps({**profile, "degrade_steps": 3}))
    catalogue._catalogue.cache_clear()  # the profile changed on disk: read it again
    assert catalogue.get(FAST).degrade_steps == 3
    worker = start_worker("gpu-fast-degrade", gpu_queue(lane_of(FAST)), IMAGEGEN_EXTRA_MODELS=f"{FAST}={fast_model}")
    settings.IMAGEGEN_MAX_QUEUE_WAIT, settings.IMAGEGEN_DEGRADE_STEPS = 10, 1
    r = get_redis()
    r.delete(COST_KEY)
    try:
        r.hset(COST_KEY, scheduler.shape_key(FAST, 64, 64, 6, 1.5, ""), 100.0)  # measured: slow at 6 steps
        r.hset(COST_KEY, scheduler.shape_key(FAST, 64, 64, 3, 1.5, ""), 0.05)
        body = {"prompt": "a red circle", "steps": 6, "model": FAST, "width": 64, "height": 64, "allow_degrade": True}
        job = alice_api.post("/api/v1/jobs", body, format="json").json()
        assert (job["degraded"], job["requested_steps"], job["steps"]) == (True, 6, 3), json.dumps(job)
        assert wait_for_status(job["id"], ("done",)).batch.steps == 3
    finally:
        r.delete(COST_KEY)
        worker.stop()
        (fast_model / "serving.json").write_text(json.dumps(profile))
        catalogue._catalogue.cache_clear()


def test_fewer_steps_than_a_models_floor_is_a_400_naming_the_floor_and_its_student(fast_model, alice_api, settings,
                                                                                  stay_queued):
    """A model's serving.json `min_steps` (shapes-v2: 12; below it the image gate read its blobs as
    stars and hearts) refuses fewer steps with a 400 that names the floor and the few-step
    student to ask for instead; a tier's, the default and the degraded steps never go below it."""
    from jobs.api.openai.compat import steps_for
    from jobs.pipeline.submit import _degrade_steps

    profile = json.loads((fast_model / "serving.json").read_text())
    (fast_model / "serving.json").write_text(json.dumps({
        **profile, "min_steps": 4, "max_steps": 12, "quality_steps": {"low": 1, "medium": 2, "high": 8},
        "student": settings.IMAGEGEN_MODEL_VERSION}))
    settings.IMAGEGEN_DEGRADE_STEPS = 2  # the deployment's: below this model's floor
    catalogue._catalogue.cache_clear()
    try:
        fast = catalogue.get(FAST)
        assert (fast.min_steps, fast.default_steps, _degrade_steps(FAST)) == (4, 4, 4)  # raised to the floor
        assert fast.as_json()["min_steps"] == 4
        assert [steps_for(tier, FAST) for tier in ("low", "medium", "high")] == [4, 4, 8]
        refused = alice_api.post("/api/v1/jobs", {"prompt": "a red circle", "model": FAST, "steps": 3}, format="json")
        assert refused.status_code == 400, refused.content
        [said] = refused.json()["steps"]
        assert "from 4 steps" in said and f'"model": "{settings.IMAGEGEN_MODEL_VERSION}"' in said, said
        taken = alice_api.post("/api/v1/jobs", {"prompt": "a red circle", "model": FAST, "steps": 4}, format="json")
        assert taken.status_code == 202 and taken.json()["steps"] == 4, taken.content
        unasked = alice_api.post("/api/v1/jobs", {"prompt": "a red circle", "model": FAST}, format="json")
        assert unasked.status_code == 202 and unasked.json()["steps"] == 4, unasked.content
    finally:
        (fast_model / "serving.json").write_text(json.dumps(profile))
        catalogue._catalogue.cache_clear()


def test_the_default_model_declares_its_floor_and_its_student(settings):
    root = Path(__file__).resolve().parents[1] / "models"
    settings.IMAGEGEN_EXTRA_MODELS = {"shapes-v2": str(root / "shapes-v2"), "shapes-v2-lcm": str(root / "shapes-v2-lcm")}
    v2 = catalogue.get("shapes-v2")
    assert (v2.min_steps, v2.student, v2.degrade_steps) == (12, "shapes-v2-lcm", 12)
    assert '"model": "shapes-v2-lcm", 4 steps' in v2.below_floor()
    assert catalogue.get("shapes-v2-lcm").min_steps == 1
