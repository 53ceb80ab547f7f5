"""NudeNet's real ONNX detector (from the optional `nudenet` wheel, in requirements-dev.txt) through
the gate, on images this test draws: alone, and as a second opinion beside the shapes classifier."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFilter

from safety import image_gate

SHAPES = Path(__file__).resolve().parent.parent / "models" / "shapes-classifier-v3"


@pytest.fixture(autouse=True)
def fresh_loader_cache():
    image_gate._loaded.clear()
    yield
    image_gate._loaded.clear()


def drawn_chest() -> Image.Image:
    """A crude bare chest drawn with ellipses: NudeNet 320n scores FEMALE_BREAST_EXPOSED about 0.53."""
    im = Image.new("RGB", (320, 320), (200, 200, 210))
    d = ImageDraw.Draw(im)
    d.rectangle((60, 0, 260, 320), fill=(230, 180, 150))
    for cx in (115, 205):
        d.ellipse((cx - 55, 120, cx + 55, 230), fill=(235, 185, 155))
        d.ellipse((cx - 12, 170, cx + 12, 194), fill=(170, 100, 90))
        d.ellipse((cx - 5, 177, cx + 5, 187), fill=(150, 80, 75))
    return im.filter(ImageFilter.GaussianBlur(6))


def shape(kind: str, size=(64, 64)) -> Image.Image:
    im = Image.new("RGB", size, (20, 40, 200))
    d = ImageDraw.Draw(im)
    cx, cy = size[0] / 2, size[1] / 2
    if kind == "circle":
        d.ellipse((cx - 16, cy - 16, cx + 16, cy + 16), fill=(220, 30, 30))
    else:
        pts = []
        for i in range(10):
            r = 24 if i % 2 == 0 else 10
            a = math.pi / 2 + i * math.pi / 5
            pts.append((cx + r * math.cos(a), cy - r * math.sin(a)))
        d.polygon(pts, fill=(240, 220, 20))
    return im


def test_the_bundled_detector_loads_offline_and_its_policy_section_matches_its_labels(settings):
    settings.IMAGEGEN_IMAGE_CLASSIFIER = "nudenet"
    [version] = image_gate.check_classifier()
    assert version.startswith("nudenet-3.4.2:320n")
    [clf] = image_gate.get_classifiers()
    assert len(clf.labels) == 18 and "FEMALE_GENITALIA_EXPOSED" in clf.labels
    assert clf.licence.startswith("AGPL-3.0")  # what the ONNX file itself says (the wheel's metadata says MIT)


def test_a_drawn_bare_chest_is_held_as_nudity_and_plain_shapes_pass(settings):
    settings.IMAGEGEN_IMAGE_CLASSIFIER = "nudenet"
    chest, circle, wide = image_gate.judge([drawn_chest(), shape("circle"), shape("circle", (96, 64))])
    assert chest.decision == "review" and chest.category == "nudity"
    assert chest.user_reason == "This image appears to show nudity; it is held until a moderator has checked it."
    assert "FEMALE_BREAST_EXPOSED" in chest.reason
    assert circle.decision == "allow" and wide.decision == "allow"


def test_more_images_than_one_detector_batch_get_one_answer_each(settings):
    settings.IMAGEGEN_IMAGE_CLASSIFIER = "nudenet"
    images = [shape("circle")] * 5 + [drawn_chest()] + [shape("circle")] * 4  # 10 > the batch of 8
    judgements = image_gate.judge(images)
    assert [j.decision for j in judgements] == ["allow"] * 5 + ["review"] + ["allow"] * 4


@pytest.mark.skipif(not (SHAPES / "config.json").exists(), reason="the shipped classifier is not in models/")
def test_beside_the_shapes_classifier_the_worst_of_both_decides(settings):
    settings.IMAGEGEN_IMAGE_CLASSIFIER = f"shapes:{SHAPES},nudenet"
    star, chest, circle = image_gate.judge([shape("star"), drawn_chest(), shape("circle")])
    assert star.decision == "block" and star.category == "demo_forbidden"  # the shapes classifier's call
    assert chest.decision in ("review", "block")  # NudeNet holds it; the shapes classifier may add its own
    assert circle.decision == "allow"
    assert star.version.startswith(f"{SHAPES.name},nudenet-3.4.2:320n+")


def test_the_policy_maps_exposed_genitals_to_a_block_and_covered_parts_to_nothing():
    from safety.image_policy import load_image_policy

    rules = load_image_policy(Path(__file__).resolve().parent.parent / "safety" / "policy.json").classifiers["nudenet"]
    for label in ("FEMALE_GENITALIA_EXPOSED", "MALE_GENITALIA_EXPOSED", "ANUS_EXPOSED"):
        assert rules[label].category == "sexual_explicit" and rules[label].block <= 1.0
    for label in ("FEMALE_BREAST_EXPOSED", "BUTTOCKS_EXPOSED"):
        assert rules[label].category == "nudity" and rules[label].block > 1.0
    assert not any(label.endswith("_COVERED") or label.startswith("FACE_") for label in rules)
