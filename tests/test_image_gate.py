"""The image gate's loaders, each with a checkpoint that the test writes on disk, and its
fail-closed rules (no classifier process needed: judge() is called directly)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from safety import image_gate

SHIPPED = Path(__file__).resolve().parent.parent / "models" / "shapes-classifier-v1"


@pytest.fixture(autouse=True)
def fresh_loader_cache():
    image_gate._loaded.clear()
    yield
    image_gate._loaded.clear()


def shape_image(kind: str) -> Image.Image:
    image = Image.new("RGB", (64, 64), (20, 40, 200))
    draw = ImageDraw.Draw(image)
    if kind == "circle":
        draw.ellipse((16, 16, 48, 48), fill=(220, 30, 30))
    else:  # a five-pointed star
        import math

        points = []
        for i in range(10):
            r = 24 if i % 2 == 0 else 10
            a = math.pi / 2 + i * math.pi / 5
            points.append((32 + r * math.cos(a), 32 - r * math.sin(a)))
        draw.polygon(points, fill=(240, 220, 20))
    return image


@pytest.mark.skipif(not (SHIPPED / "config.json").exists(), reason="the shipped classifier is not in models/")
def test_the_shipped_classifier_blocks_a_star_and_allows_a_circle(settings):
    settings.IMAGEGEN_IMAGE_CLASSIFIER = f"shapes:{SHIPPED}"
    star, circle = image_gate.judge([shape_image("star"), shape_image("circle")])
    assert star.decision == "block" and star.category == "demo_forbidden"
    assert circle.decision == "allow"
    assert "shapes-classifier-v1" in star.version


def test_a_transformers_image_classifier_checkpoint_loads_and_scores(settings, tmp_path):
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=64, num_labels=3, id2label={0: "star", 1: "circle", 2: "heart"},
                       label2id={"star": 0, "circle": 1, "heart": 2})
    ViTForImageClassification(config).save_pretrained(tmp_path)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    settings.IMAGEGEN_IMAGE_CLASSIFIER = f"hf:{tmp_path}"
    judgements = image_gate.judge([shape_image("star"), shape_image("circle")])
    assert len(judgements) == 2 and all(j.decision in ("allow", "review", "block") for j in judgements)
    assert all(j.version.startswith("hf:") for j in judgements)
    scores = image_gate.get_classifier().scores([shape_image("star")])[0]
    assert set(scores) == {"star", "circle", "heart"} and abs(sum(scores.values()) - 1) < 1e-5


def test_the_stable_diffusion_safety_checker_loads_and_never_reads_missing_as_safe(settings, tmp_path):
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig, CLIPImageProcessor

    config = CLIPConfig(
        text_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        projection_dim=8,
    )
    StableDiffusionSafetyChecker(config).save_pretrained(tmp_path / "safety_checker")
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(tmp_path / "feature_extractor")
    settings.IMAGEGEN_IMAGE_CLASSIFIER = f"sd-safety:{tmp_path}"
    judgements = image_gate.judge([shape_image("circle")])
    assert len(judgements) == 1 and judgements[0].version.startswith("sd-safety:")
    scores = image_gate.get_classifier().scores([shape_image("circle")])
    assert scores[0]["nsfw"] in (0.0, 1.0)


@pytest.mark.parametrize("spec", ["", "shapes:/no/such/dir", "hf:/no/such/dir", "what:ever"])
def test_an_unset_or_broken_classifier_setting_fails_closed(settings, spec):
    settings.IMAGEGEN_IMAGE_CLASSIFIER = spec
    with pytest.raises(image_gate.ImageGateError):
        image_gate.judge([shape_image("circle")])


def test_none_is_an_explicit_opt_out_and_every_verdict_says_unchecked(settings):
    settings.IMAGEGEN_IMAGE_CLASSIFIER = "none"
    [judgement] = image_gate.judge([shape_image("star")])
    assert judgement.decision == "allow" and judgement.category == "unchecked" and "unchecked" in judgement.reason
