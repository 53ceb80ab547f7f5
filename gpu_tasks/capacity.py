"""Measuring the served model: images per second at each batch size, and the batch caps that
follow (the size past which throughput stops rising)."""

from __future__ import annotations

import time

from gpu_tasks.pipeline import LoadedModel, Row


def images_per_second(model: LoadedModel, width: int, height: int, steps: int, batch: int, images: int, guidance: float = 5.0) -> float:
    """Generate `images` images in passes of `batch` and return the throughput."""
    rows = [Row("bench", i, f"a red circle on a blue background {i}", "", i) for i in range(batch)]
    model.generate(rows, width, height, steps, guidance)  # warm-up for this shape
    passes = max(1, images // batch)
    started = time.perf_counter()
    for _ in range(passes):
        model.generate(rows, width, height, steps, guidance)
    return passes * batch / (time.perf_counter() - started)


def suggest_cap(throughput: dict[int, float], min_gain: float = 0.10) -> int:
    """The smallest batch after which doubling gains less than min_gain."""
    sizes = sorted(throughput)
    best = sizes[0]
    for smaller, larger in zip(sizes, sizes[1:], strict=False):
        if throughput[larger] >= throughput[smaller] * (1 + min_gain):
            best = larger
        else:
            break
    return best


def suggest_fill_wait(cap: int, single_pass_seconds: float) -> float:
    """How long a partial batch should wait for more of its shape: nothing when batching does not
    pay (cap 1); else at most half a batch-1 pass (waiting longer than that costs the first job
    more than running it alone and the next one after it would), and never above 1 s."""
    if cap <= 1:
        return 0.0
    return round(min(1.0, 0.5 * single_pass_seconds), 3)
