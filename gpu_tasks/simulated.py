"""A simulated accelerator: the pipeline interface with a measured cost model that sleeps
instead of computing, and makes deterministic pictures with the entropy of real ones.

It lets the real API, scheduler, Redis and Celery workers run with many "GPU" workers on one
machine (IMAGEGEN_ACCELERATOR=simulated). Cost of one pass:

    seconds = steps * step_seconds(batch, width, height)
    step_seconds = IMAGEGEN_SIM_STEP_MS/1000 * (width*height / 64²) * (1 + (batch-1) * IMAGEGEN_SIM_BATCH_MARGINAL)

The marginal factor is the extra cost of each additional row in a batch (a GPU that is far from
saturated at batch 1 has a small one); fit it from `manage.py measure_batch_caps` on the real
device.

The pictures are a smooth random colour field plus fine noise, at the requested size: they cost
what a generated image costs to encode and store (a 1024x1024 one is about 1.8 MB as PNG, like a
real model's output), unlike flat colours, which compress to almost nothing. They are made
inside the last step's time budget, so a pass costs what the cost model says.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from django.conf import settings
from PIL import Image

from gpu_tasks.rows import Row, StepCallback, preview_size

NOISE_AMPLITUDE = 7  # +-levels of per-pixel noise: about 12 bits a pixel after PNG, as photos
_noise_lock = threading.Lock()
_noise: dict[tuple[int, int], np.ndarray] = {}


def step_seconds(batch: int, width: int, height: int, step_ms: float | None = None, marginal: float | None = None) -> float:
    step_ms = settings.IMAGEGEN_SIM_STEP_MS if step_ms is None else step_ms
    marginal = settings.IMAGEGEN_SIM_BATCH_MARGINAL if marginal is None else marginal
    return step_ms / 1000 * (width * height / 4096) * (1 + (batch - 1) * marginal)


def _digest(row: Row) -> bytes:
    return hashlib.sha256(f"{row.prompt}|{row.negative_prompt}|{row.seed}".encode()).digest()


def _noise_field(width: int, height: int) -> np.ndarray:
    """One noise array per size and process (drawing it per image would cost more than a step);
    each image takes it at its own offset, so no two images share their fine detail."""
    with _noise_lock:
        if (width, height) not in _noise:
            rng = np.random.default_rng(width * 100_003 + height)
            _noise[(width, height)] = rng.integers(-NOISE_AMPLITUDE, NOISE_AMPLITUDE + 1, (height, width, 3), dtype=np.int16)
        return _noise[(width, height)]


def picture(row: Row, width: int, height: int) -> Image.Image:
    """A deterministic picture for the row: a function of (prompt, negative prompt, seed)."""
    digest = _digest(row)
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    coarse = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).resize((width, height), Image.Resampling.BICUBIC)
    shift = int.from_bytes(digest[8:12], "little") % (width * height)
    fine = np.roll(_noise_field(width, height).reshape(-1, 3), shift, axis=0).reshape(height, width, 3)
    pixels = np.asarray(coarse, dtype=np.int16) + fine
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


class SimulatedModel:
    device = "simulated"
    load_seconds = 0.0

    def generate(self, rows: list[Row], width: int, height: int, steps: int, guidance_scale: float,
                 on_step: StepCallback | None = None, variant: str = "") -> list[Image.Image] | None:
        # A variant's levers (a CFG cutoff) are not priced by the cost model: the pass costs the same.
        per_step = step_seconds(len(rows), width, height)
        deadline = time.monotonic()
        out: list[Image.Image] = []
        for step in range(1, steps + 1):
            deadline += per_step
            if step == steps:  # decoding is part of the last step's budget
                out = [picture(row, width, height) for row in rows]
            delay = deadline - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if on_step is not None and on_step(step, steps, rows):
                return None
            if time.monotonic() > deadline + per_step:
                # The callback held the pass longer than a step (paused while another pass ran,
                # gpu_tasks/generate.py): the device sat idle meanwhile, so the next step starts now.
                # (A shorter callback overlaps the next step, as a real device's queued work does.)
                deadline = time.monotonic()
        return out

    def can_pause(self) -> bool:
        return True

    @contextmanager
    def paused(self) -> Iterator[None]:
        """A waiting pass keeps all of its state on its own stack here."""
        yield

    def preview_images(self, latents, row_indices: list[int], width: int, height: int) -> list[Image.Image]:
        rows = latents  # the simulated loop hands its rows in place of latents
        return [picture(rows[i], *preview_size(width, height)) for i in row_indices]
