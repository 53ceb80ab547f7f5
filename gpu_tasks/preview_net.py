"""A tiny learned preview decoder: latents (the scheduler's clean-image estimate x0) to RGB.

The way TAESD distils a VAE decoder, but smaller still: three 3x3 convolutions at latent
resolution, a 1x1 convolution to `factor * factor` RGB values per latent pixel, and a pixel
shuffle up to image resolution. It is trained (training/train_preview_decoder.py) on the
model's own passes: the x0 estimate at every step as input, the pipeline's final image (the
VAE's decode of the final latents) as target, so an early, still blurry estimate is already
mapped towards what the image will become.

A model that ships one keeps it beside its weights as `preview_decoder.safetensors` (its
architecture in the file's metadata); `load` returns None for a model without one, and the
previews then use the linear latent-to-RGB map (gpu_tasks/pipeline.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

FILENAME = "preview_decoder.safetensors"


class PreviewNet(nn.Module):
    def __init__(self, latent_channels: int = 4, width: int = 32, factor: int = 4, depth: int = 3):
        super().__init__()
        self.config = {"latent_channels": latent_channels, "width": width, "factor": factor, "depth": depth}
        layers: list[nn.Module] = []
        channels = latent_channels
        for _ in range(depth):
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.SiLU()]
            channels = width
        layers += [nn.Conv2d(width, 3 * factor * factor, 1), nn.PixelShuffle(factor)]
        self.body = nn.Sequential(*layers)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        """(n, C, h, w) latents -> (n, 3, h * factor, w * factor) RGB, about [0, 1] (unclamped)."""
        return self.body(latents) + 0.5


def save(net: PreviewNet, path: Path, info: dict | None = None) -> None:
    from safetensors.torch import save_file

    tensors = {name: value.detach().to(torch.float32).contiguous() for name, value in net.state_dict().items()}
    metadata = {"config": json.dumps(net.config), "info": json.dumps(info or {})}
    save_file(tensors, str(path), metadata=metadata)


def load(model_dir: Path, latent_channels: int | None = None) -> PreviewNet | None:
    """The decoder shipped beside a model, in eval mode on the CPU; None when there is none. A
    decoder for another number of latent channels than the model's is refused (ValueError)."""
    from safetensors import safe_open

    path = Path(model_dir) / FILENAME
    if not path.exists():
        return None
    with safe_open(str(path), framework="pt") as fh:
        config = json.loads((fh.metadata() or {}).get("config", "{}"))
        state = {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118 (safe_open is no dict)
    net = PreviewNet(**config)
    if latent_channels is not None and net.config["latent_channels"] != latent_channels:
        raise ValueError(f"{path} decodes {net.config['latent_channels']} latent channels; the model has {latent_channels}")
    net.load_state_dict(state)
    net.eval()
    for parameter in net.parameters():
        parameter.requires_grad_(False)
    return net


def info(model_dir: Path) -> dict:
    """What the shipped decoder's training recorded (empty without one)."""
    from safetensors import safe_open

    path = Path(model_dir) / FILENAME
    if not path.exists():
        return {}
    with safe_open(str(path), framework="pt") as fh:
        return json.loads((fh.metadata() or {}).get("info", "{}"))


def decode(net: PreviewNet, latents: torch.Tensor) -> torch.Tensor:
    """uint8 (n, H, W, 3) pictures on the CPU from (n, C, h, w) latents, decoded on the net's device."""
    device = next(net.parameters()).device
    with torch.inference_mode():
        rgb = net(latents.detach().to(device, torch.float32))
        return (rgb.clamp(0.0, 1.0) * 255.0 + 0.5).to(torch.uint8).permute(0, 2, 3, 1).cpu().contiguous()
