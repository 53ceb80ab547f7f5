"""bench/geometry.py, the evaluation's geometric judge of shape kind (issue 34): right on the
dataset's own renderings, and a soft blob is no star. No model needed; a few seconds."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import geometry  # noqa: E402


def test_ground_truth_renderings_are_judged_right_at_least_95_percent_per_kind():
    items = geometry.ground_truth_items(150)
    res = geometry.validate([g for g, _ in items], [im for _, im in items])
    assert min(res["per_kind"].values()) >= 0.95, res
    assert 0.5 <= res["median_solidity"]["star"] <= 0.7 and res["median_solidity"]["circle"] >= 0.93


def test_a_blurred_star_is_not_a_star():
    gt, im = next(it for it in geometry.ground_truth_items(40) if it[0].shapes[0].kind == "star")
    assert geometry.measure(np.asarray(im))["kind"] == "star"
    blob = im.filter(ImageFilter.GaussianBlur(3))
    assert geometry.measure(np.asarray(blob))["kind"] != "star"


def test_a_plain_background_has_no_kind():
    assert geometry.measure(np.full((64, 64, 3), 30, np.uint8))["kind"] == "none"
    assert geometry.judge_kinds([Image.new("RGB", (64, 64), (30, 60, 220))]) == ["none"]
