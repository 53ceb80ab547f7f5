"""Several classifiers at once (the worst decision wins) and the reasons a person is shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from safety import image_gate

POLICY = Path(__file__).resolve().parent.parent / "safety" / "policy.json"
CANNED = "python:tests.test_image_gate_failclosed:Canned:"


@pytest.fixture(autouse=True)
def fresh_loader_cache():
    image_gate._loaded.clear()
    yield
    image_gate._loaded.clear()


def image() -> Image.Image:
    return Image.new("RGB", (64, 64), (30, 60, 220))


@pytest.mark.parametrize("first, second, decision, category, by", [
    ("good-clean", "good-star", "block", "demo_forbidden", "canned-good-star"),
    ("good-star", "good-clean", "block", "demo_forbidden", "canned-good-star"),
    ("good-heart", "good-star", "block", "demo_forbidden", "canned-good-star"),
    ("good-heart", "good-clean", "review", "demo_borderline", "canned-good-heart"),
    ("good-clean", "good-clean", "allow", "", None),
])
def test_the_worst_decision_of_several_classifiers_wins(settings, first, second, decision, category, by):
    settings.IMAGEGEN_IMAGE_CLASSIFIER = f"{CANNED}{first},{CANNED}{second}"
    [j] = image_gate.judge([image()])
    assert (j.decision, j.category) == (decision, category)
    assert j.version.startswith(f"canned-{first},canned-{second}+")
    if by:
        assert by in j.reason


def test_one_malformed_opinion_fails_the_whole_gate(settings):
    settings.IMAGEGEN_IMAGE_CLASSIFIER = f"{CANNED}good-clean,{CANNED}nan"
    with pytest.raises(image_gate.ImageGateError, match="canned-nan"):
        image_gate.judge([image()])


def test_check_classifier_names_every_classifier_in_force(settings):
    settings.IMAGEGEN_IMAGE_CLASSIFIER = f"{CANNED}good-clean, {CANNED}good-star"
    assert image_gate.check_classifier() == ["canned-good-clean", "canned-good-star"]
    settings.IMAGEGEN_IMAGE_CLASSIFIER = "none"
    assert image_gate.check_classifier() == ["none"]


def test_a_judgement_carries_the_policy_sentence_for_a_person(settings):
    settings.IMAGEGEN_IMAGE_CLASSIFIER = f"{CANNED}good-star"
    [star] = image_gate.judge([image()])
    assert star.user_reason == "This image looks like a star, which this demo's policy does not allow."
    assert "demo_forbidden" not in star.user_reason and "demo_forbidden" in star.reason
    settings.IMAGEGEN_IMAGE_CLASSIFIER = f"{CANNED}good-heart"
    [heart] = image_gate.judge([image()])
    assert heart.user_reason.startswith("This image looks like a heart") and "moderator" in heart.user_reason


def test_a_category_without_its_own_sentence_falls_back_to_its_description(settings, tmp_path):
    policy = json.loads(POLICY.read_text())
    policy["image"]["labels"]["star"]["category"] = "graphic_violence"  # no image.categories entry
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy))
    settings.IMAGEGEN_SAFETY_POLICY = str(path)
    settings.IMAGEGEN_IMAGE_CLASSIFIER = f"{CANNED}good-star"
    [j] = image_gate.judge([image()])
    assert j.user_reason == "This image appears to show graphic violence or gore, which this service's policy does not allow."


def test_the_shipped_policy_has_a_sentence_for_every_image_category():
    from safety.image_policy import DECISIONS, load_image_policy

    policy = load_image_policy(POLICY)
    written = json.loads(POLICY.read_text())["image"]["categories"]
    for rules in [policy.default, *policy.classifiers.values()]:
        for rule in rules.values():
            reachable = ["block"] if rule.review >= rule.block else [d for d in DECISIONS if d == "review" or rule.block <= 1.0]
            for decision in reachable:
                assert decision in written[rule.category]["user_reason"], (rule.category, decision)
