"""Per-step levers a serving layer owns, and the clean-image estimate previews decode.

- CFG cutoff (IMAGEGEN_CFG_CUTOFF): classifier-free guidance for the first fraction of the
  steps, then the conditional branch only, so each late step costs one denoiser row per image
  instead of two. diffusers' SDCFGCutoffCallback and its SDXL/SD3 variants keep `[-1:]` of the
  embeddings, the last row only, which is right at batch 1 and wrong for a batch; this keeps the
  conditional half of every tensor those callbacks name, so it holds for any batch.
- Variants: the levers one job asks for, carried by the job and its batch (the `scheduler` field,
  part of the shape and cache keys, so a pass never mixes variants): "cfg-cutoff=0.5". A
  quality tier bundles them (IMAGEGEN_QUALITY_LEVERS); "" is the worker's own settings.
- Text-encoder cache (IMAGEGEN_TEXT_CACHE_SIZE): the pipeline's encode_prompt, row by row,
  memoised on (model version, prompt, negative prompt, the call's other arguments), so a
  repeated prompt does not run the text encoders again.
- CleanEstimate: the scheduler's estimate of the clean latents (x0) at each step, from the step
  itself (pred_original_sample, a DPM-Solver's converted output) or from the model output and
  the step's noise level (alpha for DDPM-style schedules, sigma for flow matching and Euler).
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections import OrderedDict

from django.conf import settings

# --- variants ------------------------------------------------------------------------------

VARIANT_LEVERS = {"cfg-cutoff": "cfg_cutoff"}


def parse_variant(variant: str) -> dict:
    """The levers a variant names, {"cfg_cutoff": 0.5}; ValueError for anything else."""
    levers: dict = {}
    for part in filter(None, (p.strip() for p in (variant or "").split("+"))):
        name, _, value = part.partition("=")
        if name not in VARIANT_LEVERS or not value:
            raise ValueError(f"unknown lever {part!r} (known: {', '.join(f'{k}=<value>' for k in VARIANT_LEVERS)})")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"lever {name} takes a number, not {value!r}") from None
        if name == "cfg-cutoff" and not 0 <= number < 1:
            raise ValueError(f"cfg-cutoff={value}: a fraction of the steps, 0 (off) <= it < 1")
        levers[VARIANT_LEVERS[name]] = number
    return levers


# --- CFG cutoff ---------------------------------------------------------------------------


def cfg_steps(steps: int, guidance_scale: float, cutoff: float | None = None) -> int:
    """How many of the steps run classifier-free guidance (the rest run the conditional branch)."""
    cutoff = settings.IMAGEGEN_CFG_CUTOFF if cutoff is None else cutoff
    if guidance_scale <= 1:
        return 0
    if cutoff <= 0:
        return steps
    return max(1, min(steps, round(steps * cutoff)))


def cfg_cutoff(family, steps: int, guidance_scale: float, cutoff: float | None = None):
    """The step-end callback part that stops CFG after cfg_steps(...) steps, or None (off).
    `cutoff`: the job's variant's (None: IMAGEGEN_CFG_CUTOFF, which the load check refuses for a
    family without a cutoff). A tier's cutoff on such a family (Flux has no CFG to stop) is
    not applicable: the pass runs without it."""
    cutoff = settings.IMAGEGEN_CFG_CUTOFF if cutoff is None else cutoff
    if cutoff <= 0 or guidance_scale <= 1 or family.cfg_cutoff is None:
        return None
    import diffusers.callbacks

    names = list(getattr(diffusers.callbacks, family.cfg_cutoff).tensor_inputs)
    last_cfg_step = cfg_steps(steps, guidance_scale, cutoff) - 1
    if last_cfg_step >= steps - 1:
        return None

    def cut(pipe, step_index, timestep, callback_kwargs) -> dict:
        if step_index != last_cfg_step:
            return {}
        out = {}
        for name in names:
            tensor = callback_kwargs[name]
            out[name] = tensor[tensor.shape[0] // 2:]  # [unconditional rows; conditional rows]
        pipe._guidance_scale = 0.0  # do_classifier_free_guidance is False from the next step on
        return out

    return cut


# --- text-encoder output cache ----------------------------------------------------------------


def _is_prompt_argument(name: str) -> bool:
    return (name.startswith("prompt") or name.startswith("negative_prompt")) and not (
        name.endswith("embeds") or name.endswith("mask")
    )


class TextEncoderCache:
    """Wraps pipe.encode_prompt; see the module docstring."""

    def __init__(self, pipe, version: str, size: int):
        self.version, self.size = version, size
        self.hits = self.misses = 0
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._original = pipe.encode_prompt
        self._signature = inspect.signature(self._original)

    @classmethod
    def install(cls, pipe, version: str, size: int) -> TextEncoderCache | None:
        if size <= 0 or not hasattr(pipe, "encode_prompt"):
            return None
        cache = cls(pipe, version, size)
        pipe.encode_prompt = cache.encode_prompt
        return cache

    def encode_prompt(self, *args, **kwargs):
        import torch

        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        prompts = arguments.get("prompt")
        precomputed = any(value is not None for name, value in arguments.items()
                          if name.endswith("embeds") or name.endswith("mask"))
        if not isinstance(prompts, list) or precomputed:
            return self._original(*args, **kwargs)
        prompt_names = [name for name in arguments if _is_prompt_argument(name)]
        others = tuple(sorted((name, repr(value)) for name, value in arguments.items()
                              if name not in prompt_names and name != "device"))
        per_image = int(arguments.get("num_images_per_prompt") or 1)
        rows = []
        for i in range(len(prompts)):
            row_args = dict(arguments)
            for name in prompt_names:
                value = arguments[name]
                if isinstance(value, list):
                    row_args[name] = [value[i]]
            key = (self.version, tuple((name, repr(row_args[name])) for name in prompt_names), others)
            with self._lock:
                found = self._entries.get(key)
                if found is not None:
                    self._entries.move_to_end(key)
                    self.hits += 1
            if found is None:
                found = self._original(**row_args)
                with self._lock:
                    self.misses += 1
                    self._entries[key] = found
                    while len(self._entries) > self.size:
                        self._entries.popitem(last=False)
            rows.append(found)
        joined = []
        for parts in zip(*rows, strict=True):
            if parts[0] is None:
                joined.append(None)
            elif isinstance(parts[0], torch.Tensor) and parts[0].shape[0] == per_image:
                joined.append(torch.cat(parts, dim=0))
            else:  # not per row (Flux's text position ids)
                joined.append(parts[0])
        return tuple(joined)


# --- the clean-image estimate (previews) ------------------------------------------------------


class CleanEstimate:
    """While entered, the scheduler's step records its x0 estimate in `latest`."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.latest = None

    def __enter__(self):
        original = self.scheduler.step

        # wraps: the pipeline reads the step's signature to pass `generator` (an ancestral
        # sampler's per-row noise) and `eta`; a bare (*args, **kwargs) hid them.
        @functools.wraps(original)
        def step(model_output, timestep, sample, *args, **kwargs):
            before = _x0_from_noise_level(self.scheduler, model_output, timestep, sample)
            out = original(model_output, timestep, sample, *args, **kwargs)
            after = _x0_from_step(self.scheduler, out, sample)
            self.latest = after if after is not None else before
            return out

        self.scheduler.step = step
        return self

    def __exit__(self, *exc):
        del self.scheduler.step  # the class's own method again
        return False


def _index(scheduler, timestep) -> int:
    index = getattr(scheduler, "step_index", None)
    return int(index) if index is not None else int(scheduler.index_for_timestep(timestep))


def _x0_from_noise_level(scheduler, model_output, timestep, sample):
    config = scheduler.config
    prediction = getattr(config, "prediction_type", "epsilon")
    if "FlowMatch" in type(scheduler).__name__:
        sigma = scheduler.sigmas[_index(scheduler, timestep)].to(sample.device, sample.dtype)
        return sample - sigma * model_output  # x_t = (1 - sigma) x0 + sigma noise, velocity = noise - x0
    if float(getattr(scheduler, "init_noise_sigma", 1.0)) != 1.0 and hasattr(scheduler, "sigmas"):
        if prediction != "epsilon":
            return None
        sigma = scheduler.sigmas[_index(scheduler, timestep)].to(sample.device, sample.dtype)
        return sample - sigma * model_output  # x = x0 + sigma noise (Euler-style schedules)
    alphas = getattr(scheduler, "alphas_cumprod", None)
    if alphas is None:
        return None
    alpha = alphas[int(timestep)].to(sample.device, sample.dtype)
    if prediction == "epsilon":
        return (sample - (1 - alpha).sqrt() * model_output) / alpha.sqrt()
    if prediction == "v_prediction":
        return alpha.sqrt() * sample - (1 - alpha).sqrt() * model_output
    if prediction == "sample":
        return model_output
    return None


def _x0_from_step(scheduler, out, sample):
    import torch

    if isinstance(out, tuple):
        if len(out) > 1 and isinstance(out[1], torch.Tensor) and out[1].shape == sample.shape:
            return out[1]
    elif getattr(out, "pred_original_sample", None) is not None:
        return out.pred_original_sample
    config = scheduler.config
    outputs = getattr(scheduler, "model_outputs", None)
    converts_to_x0 = "++" in str(getattr(config, "algorithm_type", "")) or bool(getattr(config, "predict_x0", False))
    if outputs and converts_to_x0 and outputs[-1] is not None and outputs[-1].shape == sample.shape:
        return outputs[-1]
    return None
