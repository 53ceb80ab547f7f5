"""Every malformed classifier answer fails closed, and a policy the classifier cannot answer is a
configuration error found when the classifier loads (judge() is called directly: the gate is the
real one, the classifier a canned answer defined here)."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from safety import image_gate

POLICY = Path(__file__).resolve().parent.parent / "safety" / "policy.json"

# name -> what the classifier answers for every image (labels: star, heart, as the default section)
ANSWERS = {
    "good-star": {"star": 0.95, "heart": 0.01},
    "good-heart": {"star": 0.01, "heart": 0.8},
    "good-clean": {"star": 0.01, "heart": 0.02},
    "missing-star": {"heart": 0.01},
    "nan": {"star": math.nan, "heart": 0.0},
    "inf": {"star": 0.0, "heart": math.inf},
    "minus-inf": {"star": -math.inf, "heart": 0.0},
    "text": {"star": "0.95", "heart": 0.0},
    "null": {"star": None, "heart": 0.0},
    "bool": {"star": True, "heart": 0.0},
    "above-one": {"star": 1.5, "heart": 0.0},
    "negative": {"star": -0.2, "heart": 0.0},
    "numpy-float": {"star": np.float32(0.97), "heart": np.float64(0.0)},
}


class Canned:
    """python:tests.test_image_gate_failclosed:Canned:<answer>[/<count>] -- one canned dict per image
    (or <count> dicts whatever the number of images); `labels` come from the answer's name."""

    def __init__(self, answer: str, count: int | None):
        self.answer, self.count = answer, count
        self.version = f"canned-{answer}"
        self.labels = ("star", "heart")

    @classmethod
    def from_spec(cls, arg: str) -> Canned:
        answer, _, count = arg.partition("/")
        return cls(answer, int(count) if count else None)

    def scores(self, images):
        if self.answer == "not-a-list":
            return {"star": 0.0, "heart": 0.0}
        if self.answer == "not-dicts":
            return [[0.0, 0.0] for _ in images]
        n = len(images) if self.count is None else self.count
        return [dict(ANSWERS[self.answer]) for _ in range(n)]


class OnlyStars(Canned):
    """Declares (and returns) the label 'star' only: the default policy also judges 'heart'."""

    def __init__(self, answer: str, count: int | None):
        super().__init__(answer, count)
        self.labels = ("star",)

    def scores(self, images):
        return [{"star": 0.0} for _ in images]


class NoLabels:
    version = "no-labels"

    @classmethod
    def from_spec(cls, arg):
        return cls()

    def scores(self, images):
        return [{"star": 0.0, "heart": 0.0} for _ in images]


@pytest.fixture(autouse=True)
def fresh_loader_cache():
    image_gate._loaded.clear()
    yield
    image_gate._loaded.clear()


def canned(settings, answer: str) -> None:
    settings.IMAGEGEN_IMAGE_CLASSIFIER = f"python:tests.test_image_gate_failclosed:Canned:{answer}"


def image() -> Image.Image:
    return Image.new("RGB", (64, 64), (30, 60, 220))


@pytest.mark.parametrize("answer", ["missing-star", "nan", "inf", "minus-inf", "text", "null", "bool",
                                    "above-one", "negative", "not-a-list", "not-dicts"])
def test_a_malformed_answer_is_a_gate_error_not_an_allow(settings, answer):
    canned(settings, answer)
    with pytest.raises(image_gate.ImageGateError):
        image_gate.judge([image(), image()])


@pytest.mark.parametrize("count", [0, 1, 3])
def test_a_wrong_number_of_answers_is_a_gate_error(settings, count):
    canned(settings, f"good-clean/{count}")
    with pytest.raises(image_gate.ImageGateError, match="2 images"):
        image_gate.judge([image(), image()])


def test_the_error_names_the_label_and_the_image(settings):
    canned(settings, "nan")
    with pytest.raises(image_gate.ImageGateError, match=r"'star' on image 0 .*nan"):
        image_gate.judge([image()])
    canned(settings, "missing-star")
    with pytest.raises(image_gate.ImageGateError, match=r"no score for the policy label 'star'"):
        image_gate.judge([image()])


def test_well_formed_answers_still_decide(settings):
    canned(settings, "good-star")
    [star] = image_gate.judge([image()])
    assert star.decision == "block" and star.category == "demo_forbidden" and star.score == pytest.approx(0.95)
    canned(settings, "good-heart")
    [heart] = image_gate.judge([image()])
    assert heart.decision == "review" and heart.category == "demo_borderline"
    canned(settings, "good-clean")
    [clean] = image_gate.judge([image()])
    assert clean.decision == "allow" and clean.user_reason == ""
    canned(settings, "numpy-float")
    [np_star] = image_gate.judge([image()])
    assert np_star.decision == "block"


def test_a_policy_label_the_classifier_cannot_produce_refuses_to_load(settings):
    settings.IMAGEGEN_IMAGE_CLASSIFIER = "python:tests.test_image_gate_failclosed:OnlyStars:x"
    with pytest.raises(image_gate.ImageGateError, match=r"cannot produce the label\(s\) \['heart'\]"):
        image_gate.check_classifier()
    with pytest.raises(image_gate.ImageGateError, match="heart"):
        image_gate.judge([image()])


def test_a_python_classifier_must_declare_its_labels(settings):
    settings.IMAGEGEN_IMAGE_CLASSIFIER = "python:tests.test_image_gate_failclosed:NoLabels"
    with pytest.raises(image_gate.ImageGateError, match="must declare `labels`"):
        image_gate.check_classifier()


def test_an_hf_model_whose_label_names_differ_from_the_policy_is_a_configuration_error(settings, tmp_path):
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    # A plausible operator mistake: an NSFW model whose labels are not the ones the policy names.
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=64, num_labels=2, id2label={0: "normal", 1: "nsfw"},
                       label2id={"normal": 0, "nsfw": 1})
    ViTForImageClassification(config).save_pretrained(tmp_path)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    settings.IMAGEGEN_IMAGE_CLASSIFIER = f"hf:{tmp_path}"
    with pytest.raises(image_gate.ImageGateError, match=r"cannot produce .*'heart', 'star'.*produces \['normal', 'nsfw'\]"):
        image_gate.check_classifier()
    with pytest.raises(image_gate.ImageGateError):
        image_gate.judge([image()])

    # The same model with its own policy section is usable.
    policy = json.loads(POLICY.read_text())
    policy["image"].setdefault("classifiers", {})[f"hf:{tmp_path.name}"] = {
        "labels": {"nsfw": {"category": "sexual_explicit", "review": 0.5, "block": 0.8}}}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy))
    settings.IMAGEGEN_SAFETY_POLICY = str(path)
    assert image_gate.check_classifier() == [f"hf:{tmp_path.name}"]
    [judgement] = image_gate.judge([image()])
    assert judgement.decision in ("allow", "review", "block")


@pytest.mark.parametrize("setting", [",", "none,python:tests.test_image_gate_failclosed:Canned:good-clean",
                                     "python:tests.test_image_gate_failclosed:Canned:good-clean,"])
def test_a_malformed_classifier_list_fails_closed(settings, setting):
    settings.IMAGEGEN_IMAGE_CLASSIFIER = setting
    with pytest.raises(image_gate.ImageGateError):
        image_gate.judge([image()])


@pytest.mark.parametrize("breakage", [
    {"star": {"category": "demo_forbidden", "review": "high", "block": 0.6}},
    {"star": {"category": "no_such_category", "review": 0.3, "block": 0.6}},
    {"star": {"category": "demo_forbidden", "review": 0.7, "block": 0.6}},
    {"star": {"category": "demo_forbidden", "review": float("nan"), "block": 0.6}},
])
def test_a_malformed_image_policy_fails_closed(settings, tmp_path, breakage):
    policy = json.loads(POLICY.read_text())
    policy["image"]["labels"] = breakage
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy))  # json.dumps writes NaN, which json.loads reads back
    settings.IMAGEGEN_SAFETY_POLICY = str(path)
    canned(settings, "good-clean")
    with pytest.raises(image_gate.ImageGateError, match="image"):
        image_gate.check_classifier()
    with pytest.raises(image_gate.ImageGateError):
        image_gate.judge([image()])


def test_a_policy_that_judges_no_label_of_the_classifier_refuses_to_load(settings, tmp_path):
    policy = json.loads(POLICY.read_text())
    policy["image"]["labels"] = {}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy))
    settings.IMAGEGEN_SAFETY_POLICY = str(path)
    canned(settings, "good-star")
    with pytest.raises(image_gate.ImageGateError, match="judges no label"):
        image_gate.check_classifier()


_RELEASE = threading.Event()


class Hangs(Canned):
    """python:tests.test_image_gate_failclosed:Hangs:x -- answers only once the test releases it."""

    def scores(self, images):
        _RELEASE.wait(60)
        return super().scores(images)


def test_a_classifier_that_hangs_fails_closed_once_the_timeout_passes(settings):
    """A hang is a gate error after IMAGEGEN_CLASSIFIER_TIMEOUT, tried once (the run cannot be
    stopped, so it is not tried again beside itself): the batch fails closed. (Through workers the
    other failures are shown in tests/test_safety_gates.py; a hang is shown here, where the
    timeout can be short without racing a real classifier on a loaded machine.)"""
    settings.IMAGEGEN_IMAGE_CLASSIFIER = "python:tests.test_image_gate_failclosed:Hangs:good-clean"
    settings.IMAGEGEN_CLASSIFIER_TIMEOUT = 0.5
    _RELEASE.clear()
    try:
        with pytest.raises(image_gate.ImageGateError, match="did not answer within 0.5s"):
            image_gate.judge([Image.new("RGB", (8, 8))])
    finally:
        _RELEASE.set()  # the gate's one thread finishes the hung run before the next test's
