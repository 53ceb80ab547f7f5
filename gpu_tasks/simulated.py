"""A simulated accelerator: the pipeline interface with a measured cost model that sleeps
instead of computing and makes deterministic placeholder pixels.

It lets the real API, scheduler, Redis and Celery workers run with many "GPU" workers on one
machine (IMAGEGEN_ACCELERATOR=simulated). Cost of one pass:

    seconds = steps * step_seconds(batch, width, height)
    step_seconds = IMAGEGEN_SIM_STEP_MS/1000 * (width*height / 64²) * (1 + (batch-1) * IMAGEGEN_SIM_BATCH_MARGINAL)

The marginal factor is the extra cost of each additional row in a batch (a GPU that is far from
saturated at batch 1 has a small one); fit it from `manage.py measure_batch_caps` on the real
device.
"""

from __future__ import annotations

import base64
import hashlib
import io
import time

from django.conf import settings
from PIL import Image

from gpu_tasks.pipeline import PREVIEW_MAX_SIDE, Row, StepCallback


def step_seconds(batch: int, width: int, height: int, step_ms: float | None = None, marginal: float | None = None) -> float:
    step_ms = settings.IMAGEGEN_SIM_STEP_MS if step_ms is None else step_ms
    marginal = settings.IMAGEGEN_SIM_BATCH_MARGINAL if marginal is None else marginal
    return step_ms / 1000 * (width * height / 4096) * (1 + (batch - 1) * marginal)


def _colour(row: Row) -> tuple[int, int, int]:
    digest = hashlib.sha256(f"{row.prompt}|{row.negative_prompt}|{row.seed}".encode()).digest()
    return digest[0], digest[1], digest[2]


class SimulatedModel:
    device = "simulated"
    load_seconds = 0.0

    def generate(self, rows: list[Row], width: int, height: int, steps: int, guidance_scale: float,
                 on_step: StepCallback | None = None) -> list[Image.Image] | None:
        per_step = step_seconds(len(rows), width, height)
        deadline = time.monotonic()
        for step in range(1, steps + 1):
            deadline += per_step
            delay = deadline - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if on_step is not None and on_step(step, steps, rows):
                return None
        out = []
        for row in rows:
            image = Image.new("RGB", (width, height), _colour(row))
            image.paste(tuple(255 - c for c in _colour(row)), (width // 4, height // 4, 3 * width // 4, 3 * height // 4))
            out.append(image)
        return out

    def preview(self, latents, row_index: int, width: int, height: int) -> str:
        rows = latents  # the simulated loop hands its rows in place of latents
        scale = min(PREVIEW_MAX_SIDE, max(width, height)) / max(width, height)
        image = Image.new("RGB", (max(1, round(width * scale)), max(1, round(height * scale))), _colour(rows[row_index]))
        buf = io.BytesIO()
        image.save(buf, format="JPEG", quality=60)
        return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
