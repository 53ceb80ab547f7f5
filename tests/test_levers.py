"""Each per-step lever changes the step count or cost it claims (counted on the real tiny
pipelines' modules, not timed), and a refused combination names the setting."""

from __future__ import annotations

import re

import numpy as np
import pytest
from django.test import override_settings

from gpu_tasks.families import ModelConfigError
from gpu_tasks.pipeline import LoadedModel, Row
from gpu_tasks.tiny_pipeline import write_tiny_family

ROWS = [Row("j", 0, "a red circle", "", 1), Row("j", 1, "a blue square", "green", 2)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("lever-models")
    made: dict[str, object] = {}

    def path(family: str):
        if family not in made:
            made[family] = write_tiny_family(root / family, family)
        return made[family]

    return path


def load(path, **overrides) -> LoadedModel:
    with override_settings(**overrides):
        return LoadedModel(path, "cpu")


def denoiser_rows(model: LoadedModel, steps: int = 4, guidance: float = 5.0, variant: str = "",
                  **overrides) -> tuple[int, int]:
    """(denoiser calls, rows through the denoiser) for one pass of ROWS."""
    calls = []
    handle = model.denoiser.register_forward_pre_hook(lambda module, args, kwargs: calls.append(
        (args[0] if args else kwargs.get("hidden_states", kwargs.get("sample"))).shape[0]), with_kwargs=True)
    try:
        with override_settings(**overrides):
            model.generate(ROWS, 64, 64, steps, guidance, variant=variant)
    finally:
        handle.remove()
    return len(calls), sum(calls)


@pytest.mark.parametrize("family", ["sd15", "sdxl", "sd3"])
def test_cfg_cutoff_halves_the_rows_of_the_late_steps(tiny, family):
    model = load(tiny(family), IMAGEGEN_CFG_CUTOFF=0.5)
    on = denoiser_rows(model, IMAGEGEN_CFG_CUTOFF=0.5)
    off = denoiser_rows(model, IMAGEGEN_CFG_CUTOFF=0.0)
    assert off == (4, 4 * 2 * len(ROWS))  # guidance: unconditional and conditional row per image, every step
    assert on == (4, 2 * 2 * len(ROWS) + 2 * len(ROWS))  # two guided steps, then the conditional rows only


def test_cfg_cutoff_keeps_each_row_its_own_prompt(tiny):
    """The cutoff keeps the conditional half of the batch (diffusers' own callbacks keep [-1:],
    the last row only): each image still follows its own prompt, whatever its company."""
    model = load(tiny("sd15"), IMAGEGEN_CFG_CUTOFF=0.5)

    with override_settings(IMAGEGEN_CFG_CUTOFF=0.5):
        together = model.generate(ROWS, 64, 64, 4, 5.0)
        alone = model.generate(ROWS[:1], 64, 64, 4, 5.0)
    assert np.abs(np.asarray(together[0], int) - np.asarray(alone[0], int)).max() <= 3


def test_the_text_encoder_cache_skips_the_encoder_for_a_repeated_prompt(tiny):
    model = load(tiny("sdxl"), IMAGEGEN_TEXT_CACHE_SIZE=16)
    calls = []
    hooks = [encoder.register_forward_hook(lambda *a: calls.append(1)) for encoder in
             (model.pipe.text_encoder, model.pipe.text_encoder_2)]
    try:
        first = model.generate(ROWS, 64, 64, 2, 5.0)
        cold = len(calls)
        second = model.generate(ROWS, 64, 64, 2, 5.0)
        assert cold > 0 and len(calls) == cold  # the repeat ran no text encoder
        model.generate([Row("j", 0, "a red circle", "yellow", 1)], 64, 64, 2, 5.0)
        assert len(calls) > cold  # another negative prompt is another entry
    finally:
        for hook in hooks:
            hook.remove()
    assert model.text_cache is not None and model.text_cache.hits >= len(ROWS)

    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(first, second, strict=True))


def test_first_block_cache_skips_the_remaining_blocks_of_similar_steps(tiny):
    rows = [Row("j", 0, "a red circle", "", 1)]

    def tail_calls(model) -> int:  # the last block's own layers (its hook-wrapped call runs either way)
        calls = []
        hook = model.pipe.transformer.single_transformer_blocks[-1].proj_out.register_forward_hook(lambda *a: calls.append(1))
        try:
            model.generate(rows, 64, 64, 4, 3.5)
        finally:
            hook.remove()
        return len(calls)

    assert tail_calls(load(tiny("flux"))) == 4
    cached = load(tiny("flux"), IMAGEGEN_STEP_CACHE="first-block", IMAGEGEN_STEP_CACHE_THRESHOLD=100.0)
    assert tail_calls(cached) == 1  # the first step computes every block; the rest reuse its residual


@pytest.mark.parametrize(("family", "overrides", "named"), [
    ("pixart", {"IMAGEGEN_CFG_CUTOFF": 0.5}, "IMAGEGEN_CFG_CUTOFF=0.5 cannot be honoured by a pixart model"),
    ("sd15", {"IMAGEGEN_STEP_CACHE": "first-block"}, "IMAGEGEN_STEP_CACHE=first-block cannot be honoured"),
    ("sd3", {"IMAGEGEN_TRUE_CFG_SCALE": 2.0}, "IMAGEGEN_TRUE_CFG_SCALE=2.0 is for distilled-guidance"),
    ("flux", {"IMAGEGEN_ATTENTION": "classic"}, "IMAGEGEN_ATTENTION=classic"),
    ("sd15", {"IMAGEGEN_MODEL_FAMILY": "flux"}, "IMAGEGEN_MODEL_FAMILY=flux but IMAGEGEN_MODEL_PATH holds a sd15"),
    ("sd15", {"IMAGEGEN_QUALITY_LEVERS": {"high": "warp=2"}}, "the high tier's levers 'warp=2': unknown lever"),
])
def test_a_setting_the_family_cannot_honour_is_refused_at_load(tiny, family, overrides, named):
    with pytest.raises(ModelConfigError, match=re.escape(named)):
        load(tiny(family), **overrides)


def test_quality_tiers_take_their_steps_from_the_served_models_setting(settings):
    from jobs.api.openai.compat import steps_for

    settings.IMAGEGEN_QUALITY_STEPS = {"low": 4, "medium": 12, "high": 30}
    assert [steps_for(q) for q in ("low", "medium", "standard", "high", "hd")] == [4, 12, 12, 30, 30]
    settings.IMAGEGEN_MAX_STEPS = 20
    assert steps_for("high") == 20  # still clipped to the server's limits


def test_a_variant_names_its_levers_and_nothing_else():
    from gpu_tasks.levers import parse_variant

    assert parse_variant("") == {} and parse_variant("cfg-cutoff=0.5") == {"cfg_cutoff": 0.5}
    for bad, why in (("cfg-cutoff=1.5", "0 (off) <= it < 1"), ("cfg-cutoff=half", "takes a number"),
                     ("warp=2", "unknown lever"), ("cfg-cutoff", "unknown lever")):
        with pytest.raises(ValueError, match=re.escape(why)):
            parse_variant(bad)


def test_a_jobs_variant_stops_cfg_for_its_pass_alone(tiny):
    """The lever a tier bundles runs per pass: the same model without the setting halves the late
    steps' rows for a pass whose variant asks, and no other. On a family without a cutoff (Flux:
    no CFG to stop) the tier's cutoff does not apply: the model loads and the pass is unchanged."""
    model = load(tiny("sd15"), IMAGEGEN_QUALITY_LEVERS={"low": "cfg-cutoff=0.5"})
    assert denoiser_rows(model, variant="cfg-cutoff=0.5") == (4, 2 * 2 * len(ROWS) + 2 * len(ROWS))
    assert denoiser_rows(model) == (4, 4 * 2 * len(ROWS))
    flux = load(tiny("flux"), IMAGEGEN_QUALITY_LEVERS={"low": "cfg-cutoff=0.5"})
    rows = [Row("j", 0, "a red circle", "", 1)]
    assert np.array_equal(np.asarray(flux.generate(rows, 64, 64, 2, 5.0, variant="cfg-cutoff=0.5")[0]),
                          np.asarray(flux.generate(rows, 64, 64, 2, 5.0)[0]))


def test_quality_tiers_bundle_the_levers_of_the_model_they_run_on(settings):
    from jobs.api.openai.compat import native_fields, variant_for
    from jobs.api.serializers import JobCreateSerializer

    settings.IMAGEGEN_QUALITY_LEVERS = {"low": "cfg-cutoff=0.5"}
    settings.IMAGEGEN_QUALITY_MODELS = {}
    assert [variant_for(q) for q in ("low", "medium", "high", "auto", None)] == ["cfg-cutoff=0.5", "", "", "", ""]
    for quality, variant in (("low", "cfg-cutoff=0.5"), ("high", "")):
        native = JobCreateSerializer(data={"prompt": "p", **native_fields({"quality": quality})})
        assert native.is_valid(), native.errors
        assert native.validated_data.get("variant", "") == variant


@pytest.mark.django_db(transaction=True)
def test_an_openai_request_of_a_tier_with_levers_runs_with_them_in_the_worker(workers, settings, alice):
    """Through the real worker: the tier's job records its variant, runs in a batch of that
    variant, and its pixels are those of the pass with the cutoff (the same seed in this
    process, one thread like the worker), not those without it."""
    import base64
    import io

    from PIL import Image
    from rest_framework.test import APIClient

    from jobs.media.encoding import read_parameters
    from jobs.models import GenerationJob

    settings.IMAGEGEN_QUALITY_LEVERS = {"low": "cfg-cutoff=0.5"}
    settings.IMAGEGEN_QUALITY_MODELS = {}
    settings.IMAGEGEN_QUALITY_STEPS = {"low": 4, "medium": 8, "high": 12}
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.auth_token.key}")
    prompt = "a red circle on a blue background, tier levers"
    response = client.post("/v1/images/generations", {"prompt": prompt, "size": "64x64", "quality": "low",
                                                      "response_format": "b64_json"}, format="json")
    assert response.status_code == 200, response.content
    job = GenerationJob.objects.get(owner=alice, prompt=prompt)
    assert (job.scheduler, job.steps, job.status) == ("cfg-cutoff=0.5", 4, "done")
    assert job.batch.scheduler == "cfg-cutoff=0.5"
    data = base64.b64decode(response.json()["data"][0]["b64_json"])
    assert read_parameters(data)["Levers"] == "cfg-cutoff=0.5"  # the file says how it was made
    made = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    model = LoadedModel(settings.IMAGEGEN_MODEL_PATH, "cpu")
    assert job.steering == "a star and a heart"  # the policy's steering, as the worker gave it (safety/image_policy.py)
    row = [Row("here", 0, prompt, job.steering, job.seed)]
    with_cutoff = np.asarray(model.generate(row, 64, 64, 4, job.guidance_scale, variant="cfg-cutoff=0.5")[0])
    without = np.asarray(model.generate(row, 64, 64, 4, job.guidance_scale)[0])
    assert not np.array_equal(with_cutoff, without)
    assert np.abs(made.astype(int) - with_cutoff.astype(int)).max() < np.abs(made.astype(int) - without.astype(int)).max()
    assert np.abs(made.astype(int) - with_cutoff.astype(int)).max() <= 1


@pytest.mark.django_db(transaction=True)
def test_the_native_api_takes_a_quality_tier_too(settings, alice_api):
    """`quality` on POST /api/v1/jobs: the tier's steps unless the request gives its own, its
    levers either way; an unknown tier is a 400 naming the field."""
    from jobs.models import GenerationJob

    settings.IMAGEGEN_QUALITY_LEVERS = {"low": "cfg-cutoff=0.5"}
    settings.IMAGEGEN_QUALITY_MODELS = {}
    settings.IMAGEGEN_QUALITY_STEPS = {"low": 6, "medium": 12, "high": 24}
    body = {"prompt": "a red circle on a blue background", "width": 64, "height": 64}
    made = {}
    for name, extra in (("low", {"quality": "low"}), ("low-own-steps", {"quality": "low", "steps": 3}),
                        ("high", {"quality": "high"}), ("none", {})):
        response = alice_api.post("/api/v1/jobs", {**body, **extra}, format="json")
        assert response.status_code == 202, response.content
        made[name] = GenerationJob.objects.get(id=response.json()["id"])
    assert (made["low"].steps, made["low"].scheduler) == (6, "cfg-cutoff=0.5")
    assert (made["low-own-steps"].steps, made["low-own-steps"].scheduler) == (3, "cfg-cutoff=0.5")
    assert (made["high"].steps, made["high"].scheduler) == (24, "")
    assert (made["none"].steps, made["none"].scheduler) == (settings.IMAGEGEN_DEFAULT_STEPS, "")
    response = alice_api.post("/api/v1/jobs", {**body, "quality": "ultra"}, format="json")
    assert response.status_code == 400 and "quality" in response.json(), response.content
