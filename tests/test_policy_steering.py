"""The policy's steering (safety/image_policy.py, "steer"; issue 34, item 5): a model that takes a
negative prompt is steered away from what the image gate refuses, unless the prompt check found
that category in the prompt; the image file records what the model was given."""

from __future__ import annotations

import json

import pytest

from jobs.media.encoding import read_parameters
from safety.image_policy import ImagePolicyError, parse_image_policy
from tests.conftest import wait_for_status
from tests.test_generation import submit
from tests.test_output_formats import fetch

pytestmark = pytest.mark.django_db(transaction=True)

CATEGORIES = [{"name": "demo_forbidden"}, {"name": "demo_borderline"}]


def _policy(steer: dict) -> dict:
    return {"version": "t-1", "categories": CATEGORIES,
            "image": {"labels": {"star": {"category": "demo_forbidden", "review": 0.5, "block": 0.6}}, "steer": steer}}


def test_the_negative_prompt_is_the_steering_of_every_category_not_asked_for_then_the_users_own():
    policy = parse_image_policy(_policy({"demo_forbidden": "a star", "demo_borderline": "a heart"}))
    assert policy.negative_prompt("") == "a star and a heart"
    assert policy.negative_prompt("blurry") == "a star and a heart and blurry"
    assert policy.negative_prompt("blurry", {"demo_borderline"}) == "a star and blurry", "a heart the prompt asked for"
    assert policy.negative_prompt("", {"demo_forbidden", "demo_borderline"}) == ""
    assert parse_image_policy(_policy({})).negative_prompt("x") == "x"


@pytest.mark.parametrize("steer, says", [({"no_such": "a star"}, "image.steer['no_such']: unknown category"),
                                         ({"demo_forbidden": ""}, "steer")])
def test_a_malformed_steer_names_where(steer, says):
    with pytest.raises(ImagePolicyError) as err:
        parse_image_policy(_policy(steer))
    assert says in str(err.value)


def test_the_shipped_policy_steers_the_demo_shapes():
    from django.conf import settings

    steer = json.loads(open(settings.IMAGEGEN_SAFETY_POLICY).read())["image"]["steer"]
    assert steer == {"demo_forbidden": "a star", "demo_borderline": "a heart"}


def test_the_gpu_worker_steers_a_model_that_takes_a_negative_prompt_and_not_one_that_takes_none(alice, tiny_model):
    from gpu_tasks.generate import _steered
    from gpu_tasks.pipeline import Row, get_model
    from jobs.models import GenerationJob
    from safety.models import SafetyVerdict

    plain, heart = (GenerationJob.objects.create(owner=alice, prompt=p, width=64, height=64, steps=2, guidance_scale=5,
                                                 seed=1, model_version="v") for p in ("a zebra", "a red heart"))
    SafetyVerdict.objects.create(job=plain, stage="prompt", decision="allow", category="", policy_version="p")
    SafetyVerdict.objects.create(job=heart, stage="prompt", decision="review", category="demo_borderline",
                                 policy_version="p")
    rows = [Row(str(plain.id), 0, "a zebra", "", 1), Row(str(heart.id), 0, "a red heart", "dark", 2)]
    model = get_model()  # the tiny pipeline: classifier-free guidance, takes a negative prompt
    assert model.negative_prompt_refusal() is None
    steered = _steered(model, None, rows, [plain, heart])
    assert [r.negative_prompt for r in steered] == ["a star and a heart", "a star and dark"]
    assert [(r.prompt, r.seed) for r in steered] == [(r.prompt, r.seed) for r in rows]

    # The shipped guidance-distilled student takes no negative prompt, so none is added; nor to a
    # model whose serving.json opts out (shapes-v1).
    from pathlib import Path

    from gpu_tasks.pipeline import LoadedModel
    from scheduling.catalogue import _served_model

    models = Path(__file__).resolve().parents[1] / "models"
    student = LoadedModel(models / "shapes-v1-lcm", "cpu", version="shapes-v1-lcm")
    assert student.negative_prompt_refusal() is not None
    assert _steered(student, None, rows, [plain, heart]) == rows
    assert _steered(model, _served_model("shapes-v1", models / "shapes-v1", False), rows, [plain, heart]) == rows

    # What each pass was given is recorded on its job; a job that carries one (a regeneration:
    # its original's, "" for a job made before steering existed) gets exactly that.
    plain.refresh_from_db()
    heart.refresh_from_db()
    assert (plain.steering, heart.steering) == ("a star and a heart", "a star")
    old = GenerationJob.objects.create(owner=alice, prompt="a zebra", width=64, height=64, steps=2, guidance_scale=5,
                                       seed=1, model_version="v", steering="")
    SafetyVerdict.objects.create(job=old, stage="prompt", decision="allow", category="", policy_version="p")
    [again] = _steered(model, None, [Row(str(old.id), 0, "a zebra", "dark", 1)], [old])
    assert again.negative_prompt == "dark"


def test_a_regeneration_carries_its_originals_steering(alice):
    from jobs.models import GeneratedImage, GenerationJob
    from jobs.pipeline.regenerate import regeneration_request

    def image_of(steering):
        job = GenerationJob.objects.create(owner=alice, prompt="a zebra", width=64, height=64, steps=2,
                                           guidance_scale=5, seed=1, model_version="v", steering=steering)
        return GeneratedImage.objects.create(job=job, index=0, seed=1, storage_key=f"i/{job.id}.png", width=64,
                                             height=64, byte_size=1, sha256="0" * 64)

    assert regeneration_request(image_of("a star and a heart"))["steering"] == "a star and a heart"
    assert regeneration_request(image_of(None))["steering"] == "", "made before steering: regenerated without"


def test_a_delivered_image_records_the_negative_prompt_the_model_was_given_and_the_users_own(workers, alice_api):
    job = submit(alice_api, prompt="a green square on a white background", negative_prompt="blurry", seed=77,
                 guidance_scale=4.5)
    wait_for_status(job["id"], ("done",))
    [entry] = alice_api.get(f"/api/v1/jobs/{job['id']}").json()["images"]
    data, _ = fetch(entry["url"])
    params = read_parameters(data)
    assert params["negative_prompt"] == "a star and a heart and blurry"
    assert alice_api.get(f"/api/v1/jobs/{job['id']}").json()["negative_prompt"] == "blurry", "the job shows the user's"


def test_a_model_whose_profile_says_so_is_not_steered():
    """shapes-v1's serving.json says "steer": false (steered, it delivered no more ordinary prompts
    and fewer plain shapes: bench/results/image_gate_eval_v1_20_*.json); v2 and its student keep
    the default, as the default version or beside it."""
    from pathlib import Path

    from scheduling.catalogue import _served_model

    models = Path(__file__).resolve().parents[1] / "models"
    for default in (False, True):
        assert _served_model("shapes-v1", models / "shapes-v1", default).steer is False
        assert _served_model("shapes-v2", models / "shapes-v2", default).steer is True
