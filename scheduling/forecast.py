"""Pre-launch cost forecast: GPU-seconds per image from measured (or given) step time, the
fleet it takes, and what it costs. Pure arithmetic, so it is checked against a worked example:

    40 ms/step x 30 steps = 1.2 GPU-s/image; 50M images/day x 1.2 / 86,400 s = 694 busy GPUs;
    at 50% utilisation 1,389 GPUs; at $2/GPU-hour $0.00067 per image.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

SECONDS_PER_DAY = 86_400
DAYS_PER_MONTH = 30


@dataclass(frozen=True)
class Inputs:
    images_per_day: float
    gpu_hour_price: float
    steps: int
    step_seconds_batch1: float  # per image-step at batch 1
    step_seconds_best: float  # per image-step at the best batch
    best_batch: int
    utilization: float = 0.5
    cache_hit_rate: float = 0.0
    bytes_per_image: float = 0.0
    peak_factor: float = 3.0
    # priority=batch work runs in full passes on GPUs interactive work leaves idle, so its fleet
    # runs this busy (bench/fleet_sim.py --batch-share measures it).
    batch_utilization: float = 0.9
    # The prompt rewriter (the rewrite stage): GPU-seconds per prompt at its batch, and the share
    # of jobs that go through it. Counted per image (one-image jobs: the most it can cost).
    rewrite_seconds_per_prompt: float = 0.0
    rewrite_share: float = 1.0


def _scenario(images_per_day: float, gpu_s_per_image: float, i: Inputs) -> dict:
    busy = images_per_day * gpu_s_per_image / SECONDS_PER_DAY
    fleet = busy / i.utilization
    return {
        "gpu_seconds_per_image": gpu_s_per_image,
        "busy_gpus": busy,
        "fleet_gpus": fleet,
        # The GPU time an image takes, priced; and the same with the idle share of the fleet.
        "cost_per_image": gpu_s_per_image / 3600 * i.gpu_hour_price,
        "fleet_cost_per_image": gpu_s_per_image / 3600 * i.gpu_hour_price / i.utilization,
        "cost_per_month": fleet * 24 * DAYS_PER_MONTH * i.gpu_hour_price,
    }


def forecast(i: Inputs) -> dict:
    at_1 = i.step_seconds_batch1 * i.steps
    at_best = i.step_seconds_best * i.steps
    generated = i.images_per_day * (1 - i.cache_hit_rate)
    base = _scenario(i.images_per_day, at_1, i)
    return {
        "inputs": asdict(i),
        "batch_1": base,
        "best_batch": {"batch": i.best_batch, **_scenario(i.images_per_day, at_best, i)},
        "what_if": {
            "steps_halved": _scenario(i.images_per_day, at_1 / 2, i),
            "cache_hit_rate": {"rate": i.cache_hit_rate, **_scenario(generated, at_1, i)},
            "best_batch_and_cache": _scenario(generated, at_best, i),
        },
        # The price of an image per tier: interactive at the fleet's utilisation and batch 1 (a
        # light user's lone image), batch in full passes at the batch utilisation.
        "price_per_image": {
            "interactive": base["fleet_cost_per_image"],
            "batch": at_best / 3600 * i.gpu_hour_price / i.batch_utilization,
        },
        # GPU-seconds per image without and with the prompt rewriter in front (at the best batch).
        "rewrite": {
            "seconds_per_prompt": i.rewrite_seconds_per_prompt,
            "without": at_best,
            "with": at_best + i.rewrite_seconds_per_prompt * i.rewrite_share,
            "fleet_gpus_with": _scenario(i.images_per_day, at_best + i.rewrite_seconds_per_prompt * i.rewrite_share, i)["fleet_gpus"],
        },
        "storage_bytes_per_day": generated * i.bytes_per_image,
        "peak_submits_per_second": i.images_per_day / SECONDS_PER_DAY * i.peak_factor,
    }
