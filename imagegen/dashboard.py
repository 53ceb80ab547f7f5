"""The staff dashboard: live figures and the last hour, sampled once a minute by the beat."""

from __future__ import annotations

import json
import time

from celery import shared_task
from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.shortcuts import render

from imagegen.redis_client import PREFIX, get_redis

SAMPLES_KEY = f"{PREFIX}samples"
KEEP = 60


def current_figures() -> dict:
    from imagegen import metrics
    from jobs.actions import review_queue
    from jobs.media.cache import stats
    from safety.models import SafetyVerdict
    from scheduling import scheduler
    from scheduling.costs import COST_KEY, seconds_per_image
    from scheduling.heartbeats import busy_fractions, live_workers

    model = settings.IMAGEGEN_MODEL_NAME
    costs = get_redis().hgetall(COST_KEY)
    queued_images = queued_seconds = 0.0
    for shape, entries in scheduler.queued_entries(model).items():
        n = sum(c for _, c, _ in entries)
        queued_images += n
        queued_seconds += n * seconds_per_image(shape, costs)
    counters = metrics.read_counters()
    hist = metrics.read_histograms()

    def total(name):
        return sum(counters.get(name, {}).values())

    fills = hist.get("imagegen_batch_fill", {}).get("{}", {})
    sizes = hist.get("imagegen_batch_size", {}).get("{}", {})
    workers = live_workers(model)
    gpu_seconds = total("imagegen_gpu_seconds_total")
    images = total("imagegen_images_generated_total")
    return {
        "time": time.time(),
        "queued_images": int(queued_images),
        "queued_gpu_seconds": round(queued_seconds, 2),
        "workers": len(workers),
        "busy": busy_fractions(model),
        "images_total": int(images),
        "batches_total": int(total("imagegen_batches_total")),
        "mean_fill": round(fills.get("sum", 0) / fills["+Inf"], 3) if fills.get("+Inf") else None,
        "mean_batch": round(sizes.get("sum", 0) / sizes["+Inf"], 2) if sizes.get("+Inf") else None,
        "images_per_gpu_second": round(images / gpu_seconds, 3) if gpu_seconds else None,
        "review_depth": review_queue().count(),
        "blocked_prompt": SafetyVerdict.objects.filter(stage="prompt", decision="block").count(),
        "blocked_image": SafetyVerdict.objects.filter(stage="image", decision="block").count(),
        "cache": stats(),
        "shed": int(total("imagegen_shed_total")),
        "degraded": int(total("imagegen_degraded_total")),
        **fleet_figures(),
    }


def fleet_figures() -> dict:
    """Every worker's liveness and each routed queue's live consumers (scheduling/liveness.py):
    a host that stopped consuming a queue shows within one heartbeat TTL."""
    from imagegen.metrics_view import expected_queues
    from scheduling import liveness

    expected = expected_queues()
    nodes = liveness.nodes()
    return {
        "nodes": [{"name": name, **info, "age": round(info["age"], 1)} for name, info in sorted(nodes.items())],
        "queue_consumers": sorted(liveness.consumers(expected).items()),
    }


def record_sample() -> dict:
    figures = current_figures()
    sample = {k: figures[k] for k in ("time", "queued_images", "workers", "images_total", "review_depth")}
    r = get_redis()
    r.lpush(SAMPLES_KEY, json.dumps(sample))
    r.ltrim(SAMPLES_KEY, 0, KEEP - 1)
    return sample


def _polyline(points: list[tuple[float, float]], width=600, height=120) -> str:
    if len(points) < 2:
        return ""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1, y1 = min(xs), max(xs), max(ys) or 1
    return " ".join(f"{(x - x0) / ((x1 - x0) or 1) * width:.1f},{height - y / y1 * (height - 10):.1f}" for x, y in points)


@staff_member_required
def dashboard(request):
    figures = current_figures()
    samples = [json.loads(s) for s in reversed(get_redis().lrange(SAMPLES_KEY, 0, -1))]
    throughput = [
        (b["time"], max(0.0, (b["images_total"] - a["images_total"]) / max(1.0, b["time"] - a["time"]) * 60))
        for a, b in zip(samples, samples[1:], strict=False)
    ]
    return render(request, "staff/dashboard.html", {
        "f": figures,
        "queue_line": _polyline([(s["time"], s["queued_images"]) for s in samples]),
        "throughput_line": _polyline(throughput),
        "samples": len(samples),
        "queue_max": max((s["queued_images"] for s in samples), default=0),
        "throughput_max": round(max((t for _, t in throughput), default=0), 1),
    })


@shared_task(name="imagegen.dashboard.sample_figures")
def sample_figures() -> dict:
    """Periodic: one sample a minute for the last-hour plot."""
    return record_sample()
