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


def _exact_output(scheduler, x0, noise, timestep):
    """The model output a perfect denoiser gives at this step, and the noisy sample it sees."""
    import torch

    kind = scheduler.config.prediction_type if hasattr(scheduler.config, "prediction_type") else "flow"
    if "FlowMatch" in type(scheduler).__name__:
        sigma = scheduler.sigmas[scheduler.index_for_timestep(timestep)]
        return noise - x0, (1 - sigma) * x0 + sigma * noise
    alpha = scheduler.alphas_cumprod[int(timestep)]
    sample = alpha.sqrt() * x0 + (1 - alpha).sqrt() * noise
    if kind == "v_prediction":
        return alpha.sqrt() * noise - (1 - alpha).sqrt() * x0, sample
    assert kind == "epsilon"
    return noise, torch.as_tensor(sample)


def test_the_clean_estimate_recovers_x0_from_a_perfect_denoiser_for_each_schedule_kind():
    import torch
    from diffusers import DDIMScheduler, DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler

    from gpu_tasks.levers import CleanEstimate

    schedulers = [
        DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, clip_sample=False),
        DPMSolverMultistepScheduler(prediction_type="v_prediction"),  # the shipped model's kind
        DPMSolverMultistepScheduler(),
        FlowMatchEulerDiscreteScheduler(shift=3.0),  # SD3, Flux
    ]
    generator = torch.Generator().manual_seed(0)
    x0 = torch.randn((1, 4, 8, 8), generator=generator)
    noise = torch.randn((1, 4, 8, 8), generator=generator)
    for scheduler in schedulers:
        scheduler.set_timesteps(6)
        timestep = scheduler.timesteps[2]
        with CleanEstimate(scheduler) as estimate:
            for t in scheduler.timesteps[:3]:  # bring multistep schedulers to step 3
                output, sample = _exact_output(scheduler, x0, noise, t)
                scheduler.step(output, t, sample)
        assert t == timestep and estimate.latest is not None, type(scheduler).__name__
        assert torch.allclose(estimate.latest, x0, atol=1e-3), type(scheduler).__name__
        assert "step" not in vars(scheduler)  # the scheduler's own method again
