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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from django.conf import settings
from PIL import Image

from gpu_tasks.rows import PREVIEW_MAX_SIDE, Row, StepCallback, preview_size  # noqa: F401  (callers import them from here too)

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



class _Stopped(Exception):
    """Raised from a legacy step callback (no interrupt flag in that pipeline) to end the pass."""


class LoadedModel:
    def __init__(self, path: Path, device: str, version: str | None = None):
        import torch
        from diffusers import AutoPipelineForText2Image

        from gpu_tasks import families, levers, preview_net

        if settings.IMAGEGEN_TORCH_THREADS > 0:
            torch.set_num_threads(settings.IMAGEGEN_TORCH_THREADS)
        started = time.monotonic()
        self.path = Path(path)
        self.device = device
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[settings.IMAGEGEN_DTYPE]
        self.pipe = AutoPipelineForText2Image.from_pretrained(str(self.path), local_files_only=True, torch_dtype=dtype)
        self.family = families.detect(self.pipe)
        problems = families.check(self.pipe, self.family, tier_variants(version))
        if problems:
            raise families.ModelConfigError("; ".join(problems))
        self.pipe.set_progress_bar_config(disable=True)
        self.pipe.to(device)
        apply_runtime_levers(self.pipe, self.family)
        self.text_cache = levers.TextEncoderCache.install(self.pipe, version or settings.IMAGEGEN_MODEL_VERSION,
                                                          settings.IMAGEGEN_TEXT_CACHE_SIZE)
        self.preview_map = self._load_preview_map()
        # A learned decoder shipped beside the model wins over the linear map (gpu_tasks/preview_net.py).
        self.preview_net = preview_net.load(self.path, self.family.latent_channels) if settings.IMAGEGEN_PREVIEW_DECODER else None
        if self.preview_net is not None:
            self.preview_net.to(device)
        self.load_seconds = time.monotonic() - started
        log.info("loaded %s pipeline %s on %s in %.1fs", self.family.name, self.path, device, self.load_seconds)

    @property
    def denoiser(self):
        return getattr(self.pipe, self.family.denoiser)

    def _load_preview_map(self) -> dict:
        """The latent-to-RGB map of previews: the model's own fitted one (preview_decoder.json),
        else SD 1.x's well-known one for an SD 1.x model, else one fitted now against this
        model's VAE (every other family, whatever its latent channels)."""
        fitted = self.path / "preview_decoder.json"
        if fitted.exists():
            data = json.loads(fitted.read_text())
        elif self.family.name == "sd15":
            data = _DEFAULT_PREVIEW
        else:
            data = fit_preview_map(self.pipe, self.family)
        weight = np.asarray(data["weight"], dtype=np.float32)
        bias = np.asarray(data["bias"], dtype=np.float32)
        if weight.shape != (3, self.family.latent_channels):
            raise ValueError(f"the preview map has shape {weight.shape}; this {self.family.name} model has "
                             f"{self.family.latent_channels} latent channels")
        minus_one_one = data.get("range") == "minus_one_one"
        return {"weight": weight, "bias": bias, "minus_one_one": minus_one_one}

    def negative_prompt_refusal(self) -> str | None:
        """Why this model, as served, takes no negative prompt (None: it takes one)."""
        if self.family.negative_prompt == "true-cfg" and settings.IMAGEGEN_TRUE_CFG_SCALE <= 1:
            return (f"the served model ({self.family.name}) has distilled guidance and takes no negative prompt "
                    "on this server (IMAGEGEN_TRUE_CFG_SCALE is off)")
        unet = getattr(self.pipe, "unet", None)
        if getattr(getattr(unet, "config", None), "time_cond_proj_dim", None):
            # A guidance-embedded (latent consistency) student: diffusers runs no unconditional
            # branch, so a negative prompt would be silently ignored.
            return "this model has its guidance distilled in (one pass per step) and takes no negative prompt"
        return None

    def capabilities(self) -> dict:
        """What the lane's workers tell the web tier, so a request the model cannot honour is a
        400 at submit instead of a failed job (scheduling.heartbeats)."""
        return {"family": self.family.name, "negative_prompt_refusal": self.negative_prompt_refusal()}

    def refusal(self, row: Row, guidance_scale: float) -> str | None:
        """Why this model cannot make the row as asked (None: it can)."""
        return self.negative_prompt_refusal() if row.negative_prompt else None

    def call_arguments(self, rows: list[Row], width: int, height: int, steps: int, guidance_scale: float) -> dict:
        """The pipeline call for the rows, in the family's own terms."""
        kwargs: dict = {
            "prompt": [row.prompt for row in rows],
            "width": width,
            "height": height,
            "num_inference_steps": steps,
            "guidance_scale": guidance_scale,
            "output_type": "pil",
            **self.family.call_kwargs,
        }
        if self.family.negative_prompt == "cfg" and guidance_scale > 1:
            kwargs["negative_prompt"] = [row.negative_prompt for row in rows]
        elif self.family.negative_prompt == "true-cfg" and settings.IMAGEGEN_TRUE_CFG_SCALE > 1:
            kwargs["negative_prompt"] = [row.negative_prompt for row in rows]
            kwargs["true_cfg_scale"] = settings.IMAGEGEN_TRUE_CFG_SCALE
        return kwargs

    def generate(
        self,
        rows: list[Row],
        width: int,
        height: int,
        steps: int,
        guidance_scale: float,
        on_step: StepCallback | None = None,
        variant: str = "",
    ) -> list[Image.Image] | None:
        """Run the rows as one batch. Returns None when on_step asked to stop. `variant`: the
        levers the batch's jobs asked for (gpu_tasks/levers.py; "": the worker's settings)."""
        import torch

        from gpu_tasks import families, levers

        asked = levers.parse_variant(variant)

        for row in rows:
            why = self.refusal(row, guidance_scale)
            if why:
                raise ValueError(why)
        for component in self.pipe.components.values():  # a pass that raised may have left a step cache behind
            if hasattr(component, "_reset_stateful_cache"):
                component._reset_stateful_cache()
        kwargs = self.call_arguments(rows, width, height, steps, guidance_scale)
        kwargs["generator"] = [torch.Generator(device="cpu").manual_seed(int(row.seed)) for row in rows]
        stopped = False
        estimate = levers.CleanEstimate(self.pipe.scheduler) if settings.IMAGEGEN_PREVIEW_SOURCE == "x0" else None
        cutoff = levers.cfg_cutoff(self.family, steps, guidance_scale, asked.get("cfg_cutoff"))

        def step_end(step_index: int, latents) -> bool:
            nonlocal stopped
            if on_step is None:
                return False
            shown = estimate.latest if estimate is not None and estimate.latest is not None else latents
            if on_step(step_index + 1, steps, _Latents(self, shown, width, height)):
                stopped = True
            return stopped

        if self.family.callback == "on_step_end":
            def callback(pipe, step_index, timestep, callback_kwargs):
                out = cutoff(pipe, step_index, timestep, callback_kwargs) if cutoff is not None else {}
                if step_end(step_index, callback_kwargs["latents"]):
                    pipe._interrupt = True
                return out

            kwargs["callback_on_step_end"] = callback
            kwargs["callback_on_step_end_tensor_inputs"] = families.callback_tensors(self.family, cutoff is not None)
        else:
            def legacy(step_index, timestep, latents):
                if step_end(step_index, latents):
                    raise _Stopped

            kwargs["callback"] = legacy
            kwargs["callback_steps"] = 1
        try:
            with torch.inference_mode(), (estimate if estimate is not None else _nothing()):
                out = self.pipe(**kwargs)
        except _Stopped:
            return None
        if stopped:
            return None
        return list(out.images)

    def can_pause(self) -> bool:
        """Whether a pass may wait at a step boundary while other passes run on this pipeline
        (preemption, gpu_tasks/generate.py). Not with a step cache: its hooks carry state from
        one step to the next, which every pass resets at its start."""
        return settings.IMAGEGEN_STEP_CACHE == "off"

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Inside, the pass whose step callback entered waits at its step boundary and other
        passes run on the same pipeline. The waiting pass keeps its latents, generators and
        embeddings on its own stack; what it keeps on the pipeline is put back on the way out:
        its scheduler (timesteps, step index, a multistep solver's history; the passes inside
        get a fresh one from the same config, as a pass on a just-loaded pipeline would) and
        the call's attributes (`_guidance_scale`, which a CFG cutoff lowers, `_interrupt`,
        `_num_timesteps`, ...)."""
        pipe = self.pipe
        attributes = {k: v for k, v in vars(pipe).items() if k.startswith("_") and not k.startswith("__")}
        scheduler = pipe.scheduler
        pipe.scheduler = type(scheduler).from_config(scheduler.config)
        try:
            yield
        finally:
            pipe.scheduler = scheduler
            for name in [k for k in vars(pipe) if k.startswith("_") and not k.startswith("__") and k not in attributes]:
                delattr(pipe, name)
            vars(pipe).update(attributes)

    def preview_images(self, latents, row_indices: list[int], width: int, height: int) -> list[Image.Image]:
        """Small pictures (at most PREVIEW_MAX_SIDE on the long side) approximating what the rows
        will look like, from the step callback's latents (the model's clean-image estimate when
        IMAGEGEN_PREVIEW_SOURCE=x0), through the model's own learned decoder when it ships one,
        else the linear map. Not sent as they are: the generate stage passes them
        through the image gate first."""
        if isinstance(latents, _Latents):
            latents = latents.spatial()
        if self.preview_net is not None:
            from gpu_tasks.preview_net import decode

            size = preview_size(width, height)
            pictures = [Image.fromarray(p) for p in decode(self.preview_net, latents[list(row_indices)]).numpy()]
            return [p if p.size == size else p.resize(size, Image.Resampling.BILINEAR) for p in pictures]
        out = []
        for row_index in row_indices:
            lat = latents[row_index].detach().float().cpu().numpy()  # (C, h, w)
            rgb = np.einsum("ck,khw->hwc", self.preview_map["weight"], lat) + self.preview_map["bias"]
            if self.preview_map["minus_one_one"]:
                rgb = (rgb + 1.0) / 2.0
            pixels = (np.clip(rgb, 0.0, 1.0) * 255).astype(np.uint8)
            out.append(Image.fromarray(pixels).resize(preview_size(width, height), Image.Resampling.BILINEAR))
        return out


class _Latents:
    """A step's latents as the pipeline holds them (Flux: packed 2x2 patches), unpacked to
    (batch, channels, h, w) only when a preview is made."""

    def __init__(self, model: LoadedModel, tensor, width: int, height: int):
        self.model, self.tensor, self.width, self.height = model, tensor, width, height

    def spatial(self):
        if self.model.family.packed_latents:
            pipe = self.model.pipe
            return pipe._unpack_latents(self.tensor, self.height, self.width, pipe.vae_scale_factor)
        return self.tensor

    def __getitem__(self, index):
        return self.spatial()[index]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def fit_preview_map(pipe, family, samples: int = 4, side: int = 16, seed: int = 0) -> dict:
    """A linear latent-to-RGB map fitted by least squares against the model's own VAE: decode a
    few random latents and regress each decoded pixel (pooled to latent resolution) on its latent."""
    import torch

    vae = pipe.vae
    scale = float(vae.config.scaling_factor or 1.0)
    shift = float(getattr(vae.config, "shift_factor", None) or 0.0)
    factor = int(getattr(pipe, "vae_scale_factor", 8))
    generator = torch.Generator(device="cpu").manual_seed(seed)
    z = torch.randn((samples, family.latent_channels, side, side), generator=generator)
    with torch.inference_mode():
        image = vae.decode((z / scale + shift).to(vae.device, vae.dtype)).sample.float().cpu()
    pooled = torch.nn.functional.avg_pool2d(image, factor)  # (n, 3, side, side), in [-1, 1]
    x = z.permute(0, 2, 3, 1).reshape(-1, family.latent_channels).numpy()
    y = pooled.permute(0, 2, 3, 1).reshape(-1, 3).numpy()
    design = np.concatenate([x, np.ones((x.shape[0], 1), dtype=np.float32)], axis=1)
    solution, *_ = np.linalg.lstsq(design, y, rcond=None)
    return {"weight": solution[:-1].T.tolist(), "bias": solution[-1].tolist(), "range": "minus_one_one"}


def apply_runtime_levers(pipe, family=None) -> None:
    """The per-step cost levers, each a setting (measured on and off by bench/runtime_levers.py);
    families.check has refused those the family cannot take."""
    import torch

    denoiser_name = family.denoiser if family is not None else "unet"
    if settings.IMAGEGEN_ATTENTION == "classic" and denoiser_name == "unet":
        from diffusers.models.attention_processor import AttnProcessor

        pipe.unet.set_attn_processor(AttnProcessor())  # SDPA (the default) off
    if settings.IMAGEGEN_CHANNELS_LAST and denoiser_name == "unet":
        pipe.unet.to(memory_format=torch.channels_last)
        pipe.vae.to(memory_format=torch.channels_last)
    if settings.IMAGEGEN_STEP_CACHE == "first-block":
        from diffusers.hooks import FirstBlockCacheConfig

        getattr(pipe, denoiser_name).enable_cache(FirstBlockCacheConfig(threshold=settings.IMAGEGEN_STEP_CACHE_THRESHOLD))
    if settings.IMAGEGEN_COMPILE:
        setattr(pipe, denoiser_name, torch.compile(getattr(pipe, denoiser_name), mode=settings.IMAGEGEN_COMPILE_MODE,
                                                   fullgraph=False))


def tier_variants(version: str | None) -> dict[str, str]:
    """The lever variants a served version's quality tiers bundle: IMAGEGEN_QUALITY_LEVERS for
    the deployment's own version, its serving.json's `quality_levers` for another."""
    from scheduling import catalogue

    served = catalogue.get(version or settings.IMAGEGEN_MODEL_VERSION)
    if served is None or served.default:
        return dict(settings.IMAGEGEN_QUALITY_LEVERS)
    return dict(served.quality_levers)


def warm_up(model: LoadedModel) -> float:
    """Run every menu shape at batch 1 and at its cap once, so that no request pays for a
    compilation (torch.compile specialises on shapes) or a first-call allocation."""
    from scheduling.scheduler import cap_for

    if getattr(model, "is_video", False):
        from gpu_tasks.video_model import warm_up as warm_up_video

        return warm_up_video(model)  # type: ignore[arg-type]
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
                served = catalogue.served().get(version)
                if served is not None and served.is_video:
                    from gpu_tasks.video_model import VideoModel

                    _loaded[version] = VideoModel(served.path, Path(served.base), served.frames,  # type: ignore[assignment]
                                                  settings.IMAGEGEN_DEVICE,
                                                  served.sizes or settings.IMAGEGEN_SIZE_MENU)
                else:
                    _loaded[version] = LoadedModel(catalogue.path_for(version), settings.IMAGEGEN_DEVICE, version)
        return _loaded[version]
