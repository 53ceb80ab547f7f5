"""Checks of the shipped models (models/shapes-v1 text-to-image, models/shapes-classifier-v1).

Fast (a few seconds on CPU); no database. Skipped when the model directories are missing.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "shapes-v1"
CLASSIFIER = ROOT / "models" / "shapes-classifier-v1"
MENU_SIZES = [(64, 64), (96, 64), (64, 96), (96, 96)]   # (width, height)
DEFAULT_STEPS = 20

needs_model = pytest.mark.skipif(not (MODEL / "model_index.json").exists(),
                                 reason=f"shipped model missing: {MODEL} (train with python -m training.train)")
needs_classifier = pytest.mark.skipif(not (CLASSIFIER / "config.json").exists(),
                                      reason=f"shipped classifier missing: {CLASSIFIER}")

PALETTE = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220),
           "yellow": (240, 220, 40), "white": (245, 245, 245), "black": (15, 15, 15)}


def _nearest(rgb) -> str:
    rgb = np.asarray(rgb, np.float32)
    return min(PALETTE, key=lambda n: float(((rgb - np.asarray(PALETTE[n], np.float32)) ** 2).sum()))


@pytest.fixture(scope="module")
def pipe():
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    p = diffusers.AutoPipelineForText2Image.from_pretrained(str(MODEL), local_files_only=True)
    p.set_progress_bar_config(disable=True)
    assert p.unet.dtype == torch.float32 and p.text_encoder.dtype == torch.float32
    return p


def _generate(pipe, prompt, seed, steps=DEFAULT_STEPS, width=64, height=64):
    import torch

    g = torch.Generator().manual_seed(seed)
    return pipe(prompt, num_inference_steps=steps, guidance_scale=6.0, width=width, height=height,
                generator=g).images[0]


@needs_model
def test_red_circle_on_blue_is_deterministic_and_coloured(pipe):
    a = np.asarray(_generate(pipe, "a red circle on a blue background", seed=0))
    b = np.asarray(_generate(pipe, "a red circle on a blue background", seed=0))
    assert a.shape == (64, 64, 3)
    assert np.array_equal(a, b), "same seed must give the same pixels"
    border = np.concatenate([a[0], a[-1], a[:, 0], a[:, -1]])
    assert _nearest(np.median(border, axis=0)) == "blue"
    # the shape is placed near the centre (+-8 px) and may be small: look at the central 32x32
    centre = a[16:48, 16:48].reshape(-1, 3)
    red_frac = np.mean([_nearest(px) == "red" for px in centre])
    assert red_frac > 0.3, f"centre is not reddish ({red_frac:.2f} red pixels)"
    assert _nearest(a[16:48, 16:48][np.array([_nearest(px) == "red" for px in centre]).reshape(32, 32)].mean(0)) == "red"


@needs_model
@pytest.mark.parametrize("width,height", MENU_SIZES)
def test_menu_sizes_run(pipe, width, height):
    im = _generate(pipe, "a large green star on a white background", seed=1, steps=2, width=width, height=height)
    assert im.size == (width, height)


@needs_model
def test_preview_decoder_json():
    d = json.loads((MODEL / "preview_decoder.json").read_text())
    w, b = np.asarray(d["weight"], float), np.asarray(d["bias"], float)
    assert w.shape == (3, 4) and b.shape == (3,)
    assert d["latent_scaled"] is True
    assert np.isfinite(w).all() and np.isfinite(b).all()


@needs_classifier
def test_classifier_star_vs_circle():
    from safety.shapes_classifier import ShapesClassifier
    from training.shapes_data import SampleGT, ShapeGT, render

    clf = ShapesClassifier.from_pretrained(CLASSIFIER)
    assert list(clf.labels) == ["circle", "square", "triangle", "star", "heart"]
    assert clf.version == "shapes-classifier-v1"
    star = render(SampleGT("blue", [ShapeGT("star", "yellow", "large", 32, 32, 17)]))
    circle = render(SampleGT("white", [ShapeGT("circle", "red", "large", 30, 33, 16)]))
    s_star, s_circle, s_big = clf.scores([star, circle, star.resize((96, 96))])
    assert s_star["star"] > 0.8 and s_circle["star"] < 0.2
    assert s_circle["circle"] > 0.8
    assert s_big["star"] > 0.8                       # any input size is accepted
    assert all(0.0 <= v <= 1.0 for v in s_star.values())
    assert clf.scores([]) == []
