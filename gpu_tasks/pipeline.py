"""Loading the served text-to-image pipeline and running one batch through it.

The pipeline is loaded once per worker process from disk (local files only). A batch is one
pipeline call in which every row has its own prompt, negative prompt and seeded generator, so
an image does not depend on the company it keeps in the batch.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from django.conf import settings
from PIL import Image

log = logging.getLogger(__name__)

# Stable Diffusion's well-known approximate latent-to-RGB map, used when a model ships no
# fitted preview decoder. Rows: R, G, B; columns: the 4 latent channels; output in [-1, 1].
_DEFAULT_PREVIEW = {
    "weight": [
        [0.298, 0.187, -0.158, -0.184],
        [0.207, 0.286, 0.189, -0.271],
        [0.208, 0.173, 0.264, -0.473],
    ],
    "bias": [0.0, 0.0, 0.0],
    "range": "minus_one_one",
}

PREVIEW_MAX_SIDE = 128


@dataclass(frozen=True)
class Row:
    """One image to make: which job and index it belongs to, and its inputs."""

    job_id: str
    index: int
    prompt: str
    negative_prompt: str
    seed: int


def preview_size(width: int, height: int) -> tuple[int, int]:
    scale = min(PREVIEW_MAX_SIDE, max(width, height)) / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


StepCallback = Callable[[int, int, "object"], bool]  # (step, total, latents) -> stop?


class LoadedModel:
    def __init__(self, path: Path, device: str):
        import torch
        from diffusers import AutoPipelineForText2Image

        if settings.IMAGEGEN_TORCH_THREADS > 0:
            torch.set_num_threads(settings.IMAGEGEN_TORCH_THREADS)
        started = time.monotonic()
        self.path = Path(path)
        self.device = device
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[settings.IMAGEGEN_DTYPE]
        self.pipe = AutoPipelineForText2Image.from_pretrained(str(self.path), local_files_only=True, torch_dtype=dtype)
        self.pipe.set_progress_bar_config(disable=True)
        self.pipe.to(device)
        apply_runtime_levers(self.pipe)
        self.preview_map = self._load_preview_map()
        self.load_seconds = time.monotonic() - started
        log.info("loaded pipeline %s on %s in %.1fs", self.path, device, self.load_seconds)

    def _load_preview_map(self) -> dict:
        fitted = self.path / "preview_decoder.json"
        data = json.loads(fitted.read_text()) if fitted.exists() else _DEFAULT_PREVIEW
        weight = np.asarray(data["weight"], dtype=np.float32)
        bias = np.asarray(data["bias"], dtype=np.float32)
        minus_one_one = data.get("range") == "minus_one_one"
        return {"weight": weight, "bias": bias, "minus_one_one": minus_one_one}

    def generate(
        self,
        rows: list[Row],
        width: int,
        height: int,
        steps: int,
        guidance_scale: float,
        on_step: StepCallback | None = None,
    ) -> list[Image.Image] | None:
        """Run the rows as one batch. Returns None when on_step asked to stop."""
        import torch

        generators = [torch.Generator(device="cpu").manual_seed(int(row.seed)) for row in rows]
        stopped = False

        def callback(pipe, step_index, timestep, kwargs):
            nonlocal stopped
            if on_step is not None and on_step(step_index + 1, steps, kwargs["latents"]):
                stopped = True
                pipe._interrupt = True
            return {}

        with torch.inference_mode():
            out = self.pipe(
                prompt=[row.prompt for row in rows],
                negative_prompt=[row.negative_prompt for row in rows] if guidance_scale > 1 else None,
                width=width,
                height=height,
                num_inference_steps=steps,
                guidance_scale=guidance_scale,
                generator=generators,
                output_type="pil",
                callback_on_step_end=callback,
                callback_on_step_end_tensor_inputs=["latents"],
            )
        if stopped:
            return None
        return list(out.images)

    def preview_images(self, latents, row_indices: list[int], width: int, height: int) -> list[Image.Image]:
        """Small pictures (at most PREVIEW_MAX_SIDE on the long side) approximating what the rows
        will look like, from the step callback's latents. Not sent as they are: the generate
        stage passes them through the image gate first."""
        out = []
        for row_index in row_indices:
            lat = latents[row_index].detach().float().cpu().numpy()  # (4, h, w)
            rgb = np.einsum("ck,khw->hwc", self.preview_map["weight"], lat) + self.preview_map["bias"]
            if self.preview_map["minus_one_one"]:
                rgb = (rgb + 1.0) / 2.0
            pixels = (np.clip(rgb, 0.0, 1.0) * 255).astype(np.uint8)
            out.append(Image.fromarray(pixels).resize(preview_size(width, height), Image.Resampling.BILINEAR))
        return out


def apply_runtime_levers(pipe) -> None:
    """The per-step cost levers, each a setting (measured on and off by bench/runtime_levers.py)."""
    import torch

    if settings.IMAGEGEN_ATTENTION == "classic":
        from diffusers.models.attention_processor import AttnProcessor

        pipe.unet.set_attn_processor(AttnProcessor())  # SDPA (the default) off
    if settings.IMAGEGEN_CHANNELS_LAST:
        pipe.unet.to(memory_format=torch.channels_last)
        pipe.vae.to(memory_format=torch.channels_last)
    if settings.IMAGEGEN_COMPILE:
        pipe.unet = torch.compile(pipe.unet, mode=settings.IMAGEGEN_COMPILE_MODE, fullgraph=False)


def warm_up(model: LoadedModel) -> float:
    """Run every menu shape at batch 1 and at its cap once, so that no request pays for a
    compilation (torch.compile specialises on shapes) or a first-call allocation."""
    from scheduling.scheduler import cap_for

    started = time.monotonic()
    for width, height in settings.IMAGEGEN_SIZE_MENU:
        if width % 8 or height % 8:
            continue
        for batch in sorted({1, cap_for(width, height)}):
            rows = [Row("warm-up", i, "warm up", "", i) for i in range(batch)]
            model.generate(rows, width, height, 2, settings.IMAGEGEN_DEFAULT_GUIDANCE)
    return time.monotonic() - started


_loaded: dict[str, LoadedModel] = {}
_lock = threading.Lock()


def get_model(version: str | None = None) -> LoadedModel:
    """The process's pipeline for a served model version (None: the deployment's own), loaded
    on first use from the catalogue's path (the simulated accelerator when configured). A
    worker consuming two lanes holds both models."""
    from scheduling import catalogue

    version = version or settings.IMAGEGEN_MODEL_VERSION
    with _lock:
        if version not in _loaded:
            if settings.IMAGEGEN_ACCELERATOR == "simulated":
                from gpu_tasks.simulated import SimulatedModel

                _loaded[version] = SimulatedModel()  # type: ignore[assignment]
            else:
                path = settings.IMAGEGEN_MODEL_PATH if version == settings.IMAGEGEN_MODEL_VERSION else catalogue.path_for(version)
                _loaded[version] = LoadedModel(path, settings.IMAGEGEN_DEVICE)
        return _loaded[version]
