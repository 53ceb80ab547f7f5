"""A video model on a GPU lane: a motion module in the AnimateDiff way (diffusers' MotionAdapter and
AnimateDiffPipeline) over the frozen image model it animates (models/shapes-v2-motion over
models/shapes-v2; docs/video_model.md). It answers the generate stage as LoadedModel does: one
pass for a batch of rows, a step callback with cancel and progress, previews; each row's output is
its clip's frames side by side in one picture (a strip), which the hand-off writes to quarantine as
the row's file, the image gate judges frame by frame and publish packages as an MP4, a poster and
HLS (jobs/media/video.py).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, cast

from django.conf import settings
from PIL import Image

from gpu_tasks.rows import Row, StepCallback, preview_size
from jobs.media.video import strip_of

log = logging.getLogger(__name__)


class VideoModel:
    """A served video model, loaded from its folder (the motion adapter, its tokenizer and text
    encoder) and its base image model's (UNet, VAE, scheduler)."""

    is_video = True

    def __init__(self, path: Path, base: Path, frames: int, device: str, sizes=((64, 64),)):
        import torch
        from diffusers import (
            AnimateDiffPipeline,
            AutoencoderKL,
            DPMSolverMultistepScheduler,
            MotionAdapter,
            UNet2DConditionModel,
        )
        from transformers import CLIPTextModel, CLIPTokenizer

        from gpu_tasks import preview_net

        if settings.IMAGEGEN_TORCH_THREADS > 0:
            torch.set_num_threads(settings.IMAGEGEN_TORCH_THREADS)
        started = time.monotonic()
        self.path, self.base, self.frames, self.device = Path(path), Path(base), frames, device
        self.sizes = tuple(sizes)  # the menu sizes it draws (its serving.json `sizes`)
        if not (self.base / "unet").is_dir():
            raise FileNotFoundError(f"the video model {self.path} animates {self.base}, which is not on disk")
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[settings.IMAGEGEN_DTYPE]
        self.pipe: Any = cast(Any, AnimateDiffPipeline)(
            vae=AutoencoderKL.from_pretrained(self.base, subfolder="vae", torch_dtype=dtype),
            text_encoder=CLIPTextModel.from_pretrained(self.path, subfolder="text_encoder", torch_dtype=dtype),
            tokenizer=CLIPTokenizer.from_pretrained(self.path, subfolder="tokenizer"),
            unet=UNet2DConditionModel.from_pretrained(self.base, subfolder="unet", torch_dtype=dtype),
            motion_adapter=MotionAdapter.from_pretrained(self.path, torch_dtype=dtype),
            scheduler=DPMSolverMultistepScheduler.from_pretrained(self.base, subfolder="scheduler"),
        )
        self.pipe.set_progress_bar_config(disable=True)
        from gpu_tasks import motion_text

        motion_text.attach(self.pipe.unet, self.path, dtype)  # the caption to the temporal layers, where it ships
        self.pipe.to(device)
        self.preview_net = preview_net.load(self.base, 4) if settings.IMAGEGEN_PREVIEW_DECODER else None
        if self.preview_net is not None:
            self.preview_net.to(device)
        self.load_seconds = time.monotonic() - started
        log.info("loaded the video model %s over %s on %s in %.1fs", self.path, self.base, device, self.load_seconds)

    def negative_prompt_refusal(self) -> str | None:
        return None

    def capabilities(self) -> dict:
        return {"family": "animatediff", "frames": self.frames, "negative_prompt_refusal": None}

    def refusal(self, row: Row, guidance_scale: float) -> str | None:
        return None

    def can_pause(self) -> bool:
        return False  # a clip's pass is not preempted (gpu_tasks/generate.py): its steps are 16 frames' each

    def generate(self, rows: list[Row], width: int, height: int, steps: int, guidance_scale: float,
                 on_step: StepCallback | None = None, variant: str = "") -> list[Image.Image] | None:
        """One pass for the rows' clips; each row's strip of frames, or None when on_step stopped it."""
        import torch

        stopped = False

        def callback(pipe, step_index, timestep, callback_kwargs):
            nonlocal stopped
            if on_step is not None and on_step(step_index + 1, steps, callback_kwargs["latents"]):
                stopped = True
                pipe._interrupt = True
            return {}

        kwargs: dict = {
            "prompt": [row.prompt for row in rows],
            "num_frames": self.frames,
            "width": width,
            "height": height,
            "num_inference_steps": steps,
            "guidance_scale": guidance_scale,
            "generator": [torch.Generator(device="cpu").manual_seed(int(row.seed)) for row in rows],
            "output_type": "pil",
            "callback_on_step_end": callback,
            "callback_on_step_end_tensor_inputs": ["latents"],
        }
        if guidance_scale > 1:
            kwargs["negative_prompt"] = [row.negative_prompt for row in rows]
        with torch.inference_mode():
            out = self.pipe(**kwargs)
        if stopped:
            return None
        return [strip_of(list(clip)) for clip in out.frames]

    def preview_images(self, latents, row_indices: list[int], width: int, height: int) -> list[Image.Image]:
        """Each row's middle frame, small, from the step's latents (batch, channels, frames, h, w):
        through the base model's learned preview decoder where it ships one, else the VAE's mean
        colour map. Gated by the generate stage like any preview."""
        middle = latents[list(row_indices), :, self.frames // 2]
        size = preview_size(width, height)
        if self.preview_net is not None:
            from gpu_tasks.preview_net import decode

            pictures = [Image.fromarray(p) for p in decode(self.preview_net, middle).numpy()]
        else:
            import torch

            with torch.inference_mode():
                vae = self.pipe.vae
                decoded = vae.decode(middle.to(vae.dtype) / vae.config.scaling_factor).sample.float().cpu()
            pixels = ((decoded.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
            pictures = [Image.fromarray(p) for p in pixels]
        return [p if p.size == size else p.resize(size, Image.Resampling.BILINEAR) for p in pictures]


def warm_up(model: VideoModel) -> float:
    """One two-step clip at each of the model's sizes, so no request pays a first-call allocation."""
    started = time.monotonic()
    for width, height in model.sizes:
        model.generate([Row("warm-up", 0, "warm up", "", 0)], width, height, 2, 1.0)
    return time.monotonic() - started
