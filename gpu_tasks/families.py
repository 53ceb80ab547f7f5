"""The diffusers families the worker serves, what each can honour, and the check at load that
refuses a setting the served family cannot honour (the worker then does not start, like a
misconfigured image gate: gpu_tasks/worker.py).

A family is recognised by its pipeline class (model_index.json's `_class_name`). What it honours
is read from the loaded pipeline where diffusers exposes it (the `__call__` parameters and
`_callback_tensor_inputs`), so a diffusers upgrade that changes a pipeline shows up here as a
refusal at start, not as a wrong image at run time.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field

from django.conf import settings

log = logging.getLogger(__name__)


class ModelConfigError(Exception):
    """The served model and the settings do not go together; the worker refuses to start."""


@dataclass(frozen=True)
class Family:
    name: str
    latent_channels: int
    denoiser: str  # "unet" | "transformer": the pipeline attribute that denoises
    packed_latents: bool = False  # Flux packs 2x2 latent patches into a token sequence
    # How a negative prompt is honoured: "cfg" (as the unconditional branch of classifier-free
    # guidance, with guidance > 1) or "true-cfg" (Flux: guidance is distilled into the model; a
    # negative prompt needs a second pass per step, IMAGEGEN_TRUE_CFG_SCALE > 1).
    negative_prompt: str = "cfg"
    guidance: str = "cfg"  # "cfg" | "distilled"
    callback: str = "on_step_end"  # "on_step_end" (callback_on_step_end) | "legacy" (callback, callback_steps)
    cfg_cutoff: str | None = None  # the diffusers.callbacks class that stops CFG after a fraction of the steps
    step_cache: bool = False  # diffusers' first-block cache applies (registered blocks, cache contexts)
    call_kwargs: dict = field(default_factory=dict)  # always passed to the pipeline call


FAMILIES: dict[str, Family] = {
    "sd15": Family("sd15", 4, "unet", cfg_cutoff="SDCFGCutoffCallback"),
    "sdxl": Family("sdxl", 4, "unet", cfg_cutoff="SDXLCFGCutoffCallback"),
    "sd3": Family("sd3", 16, "transformer", cfg_cutoff="SD3CFGCutoffCallback"),
    "flux": Family("flux", 16, "transformer", packed_latents=True, negative_prompt="true-cfg", guidance="distilled",
                   step_cache=True),
    # Resolution binning would resize each request to PixArt's nearest trained aspect bucket and
    # back; the worker serves exactly the menu's sizes.
    "pixart": Family("pixart", 4, "transformer", callback="legacy",
                     call_kwargs={"use_resolution_binning": False, "clean_caption": False}),
}

PIPELINE_FAMILIES = {
    "StableDiffusionPipeline": "sd15",
    "StableDiffusionXLPipeline": "sdxl",
    "StableDiffusion3Pipeline": "sd3",
    "FluxPipeline": "flux",
    "PixArtSigmaPipeline": "pixart",
    "PixArtAlphaPipeline": "pixart",
}


def detect(pipe) -> Family:
    name = type(pipe).__name__
    if name not in PIPELINE_FAMILIES:
        raise ModelConfigError(
            f"IMAGEGEN_MODEL_PATH holds a {name}, which the worker does not serve "
            f"(it serves {', '.join(sorted(PIPELINE_FAMILIES))})"
        )
    return FAMILIES[PIPELINE_FAMILIES[name]]


def callback_tensors(family: Family, cfg_cutoff: bool) -> list[str]:
    """The tensors the step callback asks for: latents (previews, cancel), plus what the CFG
    cutoff rewrites when it is on (`cfg_cutoff`)."""
    if family.callback != "on_step_end":
        return []
    names = ["latents"]
    if cfg_cutoff and family.cfg_cutoff:
        import diffusers.callbacks

        names += [n for n in getattr(diffusers.callbacks, family.cfg_cutoff).tensor_inputs if n not in names]
    return names


def check(pipe, family: Family, variants: dict[str, str] | None = None) -> list[str]:
    """Every reason the settings cannot be honoured by this pipeline (empty: all is well);
    `variants`: the lever variants its quality tiers bundle (tier -> variant). A tier's CFG
    cutoff on a family without one is not a problem: it does not apply there (logged at load)."""
    from gpu_tasks.levers import parse_variant

    problems: list[str] = []
    tier_cutoff = False
    for tier, variant in sorted((variants or {}).items()):
        try:
            levers = parse_variant(variant)
        except ValueError as exc:
            problems.append(f"the {tier} tier's levers {variant!r}: {exc}")
            continue
        if levers.get("cfg_cutoff", 0) > 0:
            if family.cfg_cutoff is None:
                log.info("the %s tier's %s does not apply to a %s model (no CFG cutoff): that tier runs without it",
                         tier, variant, family.name)
            else:
                tier_cutoff = True
    params = inspect.signature(pipe.__call__).parameters
    wanted = settings.IMAGEGEN_MODEL_FAMILY
    if wanted and wanted != family.name:
        problems.append(f"IMAGEGEN_MODEL_FAMILY={wanted} but IMAGEGEN_MODEL_PATH holds a {family.name} model "
                        f"({type(pipe).__name__})")
    if family.callback == "on_step_end":
        if "callback_on_step_end" not in params:
            problems.append(f"{type(pipe).__name__} takes no callback_on_step_end: progress, previews and cancel need it")
        else:
            offered = set(getattr(pipe, "_callback_tensor_inputs", []))
            missing = [n for n in callback_tensors(family, settings.IMAGEGEN_CFG_CUTOFF > 0 or tier_cutoff)
                       if n not in offered]
            if missing:
                problems.append(f"{type(pipe).__name__} does not give the step callback {', '.join(missing)} "
                                f"(it offers {', '.join(sorted(offered))})")
    elif "callback" not in params:
        problems.append(f"{type(pipe).__name__} takes no step callback: progress, previews and cancel need it")
    if family.negative_prompt == "cfg" and "negative_prompt" not in params:
        problems.append(f"{type(pipe).__name__} takes no negative_prompt")
    cutoff = settings.IMAGEGEN_CFG_CUTOFF
    if not 0 <= cutoff < 1:
        problems.append(f"IMAGEGEN_CFG_CUTOFF={cutoff}: a fraction of the steps, 0 (off) <= it < 1")
    elif cutoff > 0 and family.cfg_cutoff is None:
        why = ("its guidance is distilled into the model (no unconditional branch to stop)"
               if family.guidance == "distilled" else "diffusers has no CFG-cutoff callback for it and its step "
               "callback cannot rewrite the prompt embeddings")
        problems.append(f"IMAGEGEN_CFG_CUTOFF={cutoff} cannot be honoured by a {family.name} model: {why}")
    if settings.IMAGEGEN_STEP_CACHE not in ("off", "first-block"):
        problems.append(f"IMAGEGEN_STEP_CACHE={settings.IMAGEGEN_STEP_CACHE}: off or first-block")
    elif settings.IMAGEGEN_STEP_CACHE == "first-block" and not family.step_cache:
        problems.append(f"IMAGEGEN_STEP_CACHE=first-block cannot be honoured by a {family.name} model: diffusers' "
                        "first-block cache needs a transformer pipeline that sets cache contexts (flux)")
    if settings.IMAGEGEN_TRUE_CFG_SCALE > 1 and family.negative_prompt != "true-cfg":
        problems.append(f"IMAGEGEN_TRUE_CFG_SCALE={settings.IMAGEGEN_TRUE_CFG_SCALE} is for distilled-guidance "
                        f"models (flux); a {family.name} model takes negative prompts through its guidance scale")
    if family.denoiser != "unet":
        if settings.IMAGEGEN_ATTENTION == "classic":
            problems.append(f"IMAGEGEN_ATTENTION=classic swaps a UNet's attention processors; a {family.name} "
                            "model denoises with a transformer (leave it at sdpa)")
        if settings.IMAGEGEN_CHANNELS_LAST:
            problems.append(f"IMAGEGEN_CHANNELS_LAST is a convolution layout; a {family.name} model denoises with "
                            "a transformer (leave it off)")
    return problems
