"""What a pass is made of, shared by the real pipeline (gpu_tasks/pipeline.py) and the simulated
accelerator (gpu_tasks/simulated.py): one row per image, the step callback, the preview size."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
