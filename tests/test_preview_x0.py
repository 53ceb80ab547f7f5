"""Previews decode the scheduler's clean-image estimate (x0), so halfway through the steps a
preview already resembles the final image; the noisy latents do not (bench/preview_error.py
reports the figures at 25/50/75%)."""

from __future__ import annotations

import numpy as np
from django.test import override_settings
from PIL import Image

from gpu_tasks.pipeline import LoadedModel, Row
from gpu_tasks.tiny_pipeline import SHIPPED_MODEL

ROWS = [Row("j", 0, "a red circle on a blue background", "", 5), Row("j", 1, "a yellow square on a black background", "", 6)]


def halfway_error(model: LoadedModel, source: str, steps: int = 10) -> float:
    shown = {}

    def on_step(step, total, latents):
        if step == steps // 2:
            shown["previews"] = model.preview_images(latents, [0, 1], 64, 64)
        return False

    with override_settings(IMAGEGEN_PREVIEW_SOURCE=source):
        finals = model.generate(ROWS, 64, 64, steps, 5.0, on_step)
    return float(np.mean([np.abs(np.asarray(p, np.float32) - np.asarray(f.convert("RGB").resize(p.size, Image.Resampling.BILINEAR), np.float32)).mean()
                          for p, f in zip(shown["previews"], finals, strict=True)]))


def test_halfway_previews_of_the_shipped_model_resemble_the_final_image():
    model = LoadedModel(SHIPPED_MODEL, "cpu")
    noisy, clean = halfway_error(model, "latents"), halfway_error(model, "x0")
    assert clean < 0.6 * noisy, (clean, noisy)
