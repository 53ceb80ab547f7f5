"""The cost model, measured by the GPU workers and kept in one Redis hash:

- per shape and batch size, a moving average of the seconds one pass takes (`<shape>#<size>`);
- per shape, GPU-seconds per image (a video model's: per clip), and across shapes GPU-seconds per
  megapixel-step of one frame (for shapes not measured yet: a clip's prior is its frames times an
  image's, the design's cost of a video, frames x steps);
- the time a job spends outside the queue and the pass: the claim, the image gate and
  delivery (`_overhead`);
- the prompt rewriter (the rewrite stage): seconds one forward pass takes (`_rewrite_pass`) and
  per prompt (`_rewrite_per_prompt`).
"""

from __future__ import annotations

from django.conf import settings

from imagegen.redis_client import PREFIX, get_redis
from scheduling import scheduler

COST_KEY = f"{PREFIX}cost"
GLOBAL_FIELD = "_per_mpx_step"
OVERHEAD_FIELD = "_overhead"
REWRITE_PASS_FIELD = "_rewrite_pass"
REWRITE_PROMPT_FIELD = "_rewrite_per_prompt"
EWMA_ALPHA = 0.3


def _ewma(old, new: float) -> float:
    return new if old is None else EWMA_ALPHA * new + (1 - EWMA_ALPHA) * float(old)


def record_batch_cost(shape: str, images: int, seconds: float) -> None:
    """Called by the GPU worker after each pass of `images` rows."""
    if images <= 0 or seconds <= 0:
        return
    info = scheduler.parse_shape(shape)
    per_image = seconds / images
    per_unit = per_image / (info["width"] * info["height"] / 1e6 * info["steps"] * frames_of(info["model_version"]))
    pass_field = f"{shape}#{images}"
    r = get_redis()
    old_image, old_unit, old_pass = r.hmget(COST_KEY, [shape, GLOBAL_FIELD, pass_field])
    r.hset(COST_KEY, mapping={shape: _ewma(old_image, per_image), GLOBAL_FIELD: _ewma(old_unit, per_unit),
                              pass_field: _ewma(old_pass, seconds)})


def record_overhead(samples: list[float]) -> None:
    """Called after delivery with each first-attempt job's seconds outside the queue and the
    pass: the claim and the image gate and delivery. (The prompt check is not in it: its time
    depends on the checks waiting at that moment, which the estimate counts as queued work.)"""
    if not samples:
        return
    r = get_redis()
    r.hset(COST_KEY, OVERHEAD_FIELD, _ewma(r.hget(COST_KEY, OVERHEAD_FIELD), max(0.0, sum(samples) / len(samples))))


def record_rewrite_cost(prompts: int, seconds: float) -> None:
    """Called by the rewrite stage after each forward pass of `prompts` prompts."""
    if prompts <= 0 or seconds <= 0:
        return
    r = get_redis()
    old_pass, old_prompt = r.hmget(COST_KEY, [REWRITE_PASS_FIELD, REWRITE_PROMPT_FIELD])
    r.hset(COST_KEY, mapping={REWRITE_PASS_FIELD: _ewma(old_pass, seconds),
                              REWRITE_PROMPT_FIELD: _ewma(old_prompt, seconds / prompts)})


def rewrite_seconds(costs: dict) -> float:
    """What the rewrite stage adds to a job's wait: one forward pass of the rewriter (measured;
    before any, IMAGEGEN_PRIOR_REWRITE_SECONDS)."""
    return float(costs.get(REWRITE_PASS_FIELD, settings.IMAGEGEN_PRIOR_REWRITE_SECONDS))


_rewrite_read: list[float] = [0.0, 0.0]  # when this process last read it, and what it read


def recent_rewrite_seconds(max_age: float = 5.0) -> float:
    """rewrite_seconds, read from Redis at most once per `max_age` seconds per process: the
    submit path's figure (a rewriter pass changes slowly; a round trip per submit would not)."""
    import time

    now = time.monotonic()
    if now - _rewrite_read[0] > max_age:
        fields = get_redis().hmget(COST_KEY, [REWRITE_PASS_FIELD])
        value = float(fields[0]) if fields[0] is not None else float(settings.IMAGEGEN_PRIOR_REWRITE_SECONDS)
        _rewrite_read[:] = [now, value]
    return _rewrite_read[1]


def costs() -> dict:
    return get_redis().hgetall(COST_KEY)


def overhead(costs: dict) -> float:
    return float(costs.get(OVERHEAD_FIELD, 0.0))


def seconds_per_image(shape: str, costs: dict | None = None) -> float:
    costs = costs if costs is not None else get_redis().hgetall(COST_KEY)
    if shape in costs:
        return float(costs[shape])
    info = scheduler.parse_shape(shape)
    unit = float(costs.get(GLOBAL_FIELD, settings.IMAGEGEN_PRIOR_SECONDS_PER_MPX_STEP))
    return unit * info["width"] * info["height"] / 1e6 * info["steps"] * frames_of(info["model_version"])


def frames_of(version: str) -> int:
    """Frames per output of a model version: a served video model's clip length, else 1."""
    from scheduling import catalogue

    served = catalogue.served().get(version)
    return served.frames if served is not None else 1


def pass_seconds(shape: str, images: int, costs: dict) -> float:
    """Seconds one pass of `images` rows of `shape` takes: measured at that size; else between
    the nearest measured sizes (linear); else from the per-image figure."""
    exact = costs.get(f"{shape}#{images}")
    if exact is not None:
        return float(exact)
    measured = sorted(
        (int(field.rsplit("#", 1)[1]), float(value)) for field, value in costs.items()
        if field.startswith(shape + "#") and field.rsplit("#", 1)[1].isdigit()
    )
    below = [m for m in measured if m[0] < images]
    above = [m for m in measured if m[0] > images]
    if below and above:
        (b0, s0), (b1, s1) = below[-1], above[0]
        return s0 + (s1 - s0) * (images - b0) / (b1 - b0)
    if len(measured) >= 2:  # extrapolate along the nearest two measured sizes
        if above:  # smaller than any measured: no cheaper per image than the smallest measured
            (b0, s0), (b1, s1) = measured[0], measured[1]
            return max(s0 * images / b0, s0 - max(0.0, (s1 - s0) / (b1 - b0)) * (b0 - images))
        (b0, s0), (b1, s1) = measured[-2], measured[-1]
        return s1 + max(0.0, (s1 - s0) / (b1 - b0)) * (images - b1)
    if measured:  # one size measured: scale by size, the pessimistic side for larger passes
        b0, s0 = measured[0]
        return s0 * images / b0 if images > b0 else s0
    return seconds_per_image(shape, costs) * images
