"""The caption, given to a video model's temporal layers (issue 47).

AnimateDiff's motion modules are self-attention over frames at each pixel: they never see the
text, which reaches them only through the frozen image UNet's cross-attention. That was enough for
clips that hold together, not for clips that move the way the caption says (docs/video_model.md).
This module gives every motion module the caption directly: the text encoder's states, pooled
over the caption's tokens, go through a small shared MLP and one projection per motion module,
and the result is added to that module's tokens after its input projection (where its
sinusoidal frame positions are added too, so attention can pair "moving left" with frame order).
Every projection starts at zero: attached with fresh weights, the video model draws exactly what
it drew without it.

Shipped beside the adapter as ``motion_text.safetensors`` (with ``motion_text.json``, its sizes);
``attach(unet, folder)`` hooks it into a ``UNetMotionModel`` (an ``AnimateDiffPipeline``'s
``unet``) when the folder has one, and does nothing otherwise. It is plain hooks on diffusers'
modules, so the pipeline, the scheduler and the serving code stay as diffusers makes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

WEIGHTS = "motion_text.safetensors"
CONFIG = "motion_text.json"


def motion_modules(unet) -> list[tuple[str, Any]]:
    """(name, AnimateDiffTransformer3D) of every motion module, in a fixed order."""
    from diffusers.models.unets.unet_motion_model import AnimateDiffTransformer3D

    return [(name, m) for name, m in unet.named_modules() if isinstance(m, AnimateDiffTransformer3D)]


class MotionText(nn.Module):
    """text_dim -> hidden (SiLU) -> one zero-initialised projection per motion module."""

    def __init__(self, text_dim: int, inner_dims: list[int], hidden: int = 256):
        super().__init__()
        self.config = {"text_dim": text_dim, "inner_dims": list(inner_dims), "hidden": hidden}
        self.mlp = nn.Sequential(nn.Linear(text_dim, hidden), nn.SiLU())
        projections = [nn.Linear(hidden, d) for d in inner_dims]
        for proj in projections:
            nn.init.zeros_(proj.weight)
            nn.init.zeros_(proj.bias)
        self.out = nn.ModuleList(projections)

    def forward(self, text_states: torch.Tensor) -> list[torch.Tensor]:
        """(clips, tokens, text_dim) -> one (clips, inner_dim) vector per motion module."""
        h = self.mlp(text_states.mean(dim=1))
        return [proj(h) for proj in self.out]


def build(text_dim: int, inner_dims: list[int], hidden: int = 256) -> MotionText:
    return MotionText(text_dim, inner_dims, hidden)


def for_unet(unet, text_dim: int):
    """A fresh conditioner sized for this UNetMotionModel's motion modules."""
    return build(text_dim, [m.proj_in.out_features for _, m in motion_modules(unet)])


def hook(unet, conditioner) -> list:
    """Install the conditioner on the UNet: a pre-hook keeps the call's text states (one row per
    clip: the pipeline hands them repeated per frame), and each motion module's input projection adds
    its clip's vector to every (pixel, frame) token. Returns the hook handles."""
    modules = motion_modules(unet)
    if len(modules) != len(conditioner.out):
        raise ValueError(f"the conditioner has {len(conditioner.out)} projections; the UNet {len(modules)} motion modules")
    current: dict[str, Any] = {}

    def keep_text(_module, args, kwargs):
        sample = kwargs.get("sample", args[0] if args else None)
        states = kwargs.get("encoder_hidden_states", args[2] if len(args) > 2 else None)
        if states is None or sample is None:
            current["vectors"] = None
            return
        clips, frames = sample.shape[0], sample.shape[2]
        if states.shape[0] == clips * frames:  # the pipeline repeats each clip's states per frame
            states = states[::frames]
        current["vectors"] = conditioner(states.to(next(conditioner.parameters()).dtype))

    handles = [unet.register_forward_pre_hook(keep_text, with_kwargs=True)]
    for k, (_name, module) in enumerate(modules):
        def add(_proj, _inputs, output, k=k):
            vectors = current.get("vectors")
            if vectors is None:
                return output
            v = vectors[k].to(output.dtype)  # (clips, inner)
            return output + v.repeat_interleave(output.shape[0] // v.shape[0], dim=0)[:, None, :]

        handles.append(module.proj_in.register_forward_hook(add))
    return handles


def save(conditioner, folder: Path) -> None:
    from safetensors.torch import save_file

    folder = Path(folder)
    save_file({k: v.detach().half().contiguous() for k, v in conditioner.state_dict().items()}, folder / WEIGHTS)
    (folder / CONFIG).write_text(json.dumps(conditioner.config, indent=1))


def load(folder: Path, dtype=None):
    """The folder's conditioner, or None when it ships none."""
    folder = Path(folder)
    if not (folder / WEIGHTS).exists():
        return None
    from safetensors.torch import load_file

    config = json.loads((folder / CONFIG).read_text())
    conditioner = build(config["text_dim"], config["inner_dims"], config["hidden"])
    conditioner.load_state_dict({k: v.float() for k, v in load_file(folder / WEIGHTS).items()}, strict=True)
    conditioner.eval().requires_grad_(False)
    return conditioner.to(dtype) if dtype is not None else conditioner


def attach(unet, folder: Path, dtype=None):
    """Hook the folder's conditioner (if it ships one) into `unet`; returns it (or None)."""
    conditioner = load(folder, dtype)
    if conditioner is not None:
        conditioner.to(next(unet.parameters()).device)
        unet.motion_text = conditioner  # kept with the UNet: moved by pipe.to(), freed with it
        hook(unet, conditioner)
    return conditioner
