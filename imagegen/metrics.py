"""Metrics that are correct across the web process and every worker, on any host.

Counters and histograms live in Redis (one HINCRBYFLOAT per update, pipelined), so a scrape of
/metrics on any web process sees what every Celery worker did. Gauges about the queue, the
review queue, stored bytes and outcomes are computed from Redis and the database at scrape
time. Updating a metric never raises: metrics must not fail a generation.

Counts of things that rows also record (jobs by status, safety verdicts) are counters here too,
incremented when the change commits: computed from rows they would fall when rows are deleted,
and a Prometheus counter must only go up.
"""

from __future__ import annotations

import json
import logging

from imagegen.redis_client import PREFIX, get_redis, write

log = logging.getLogger(__name__)

BUCKETS = {
    "imagegen_queue_wait_seconds": (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
    "imagegen_time_to_first_preview_seconds": (0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
    "imagegen_submit_to_done_seconds": (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
    "imagegen_batch_size": (1, 2, 4, 8, 16, 32, 64),
    "imagegen_rewrite_batch_size": (1, 2, 4, 8, 16, 32, 64),
    "imagegen_rewrite_seconds": (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
    "imagegen_batch_fill": (0.125, 0.25, 0.5, 0.75, 0.9, 1.0),
    "imagegen_classifier_seconds": (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
}

HELP = {
    "imagegen_images_generated_total": "Images produced by the pipeline",
    "imagegen_jobs_total": "Jobs entering each status (transitions, counted on commit), by model version; terminal statuses are outcomes",
    "imagegen_safety_decisions_total": "Safety verdicts recorded, by stage, category and decision",
    "imagegen_prompt_checks_total": "Prompt checks by the language the gate detected and their decision (allow, review, block)",
    "imagegen_batches_total": "Pipeline passes run",
    "imagegen_gpu_seconds_total": "GPU-seconds spent in pipeline passes, per worker",
    "imagegen_requeues_total": "Jobs requeued after their worker was lost",
    "imagegen_stage_reruns_total": "Batches whose classify or publish stage was run again after its worker was lost",
    "imagegen_stage_resends_total": "Batch stages sent again because no worker started them within their bound (a lost message)",
    "imagegen_attempts_total": "Generation attempts started",
    "imagegen_cache_hits_total": "Images served from the request-hash cache",
    "imagegen_cache_misses_total": "Images that had to be generated",
    "imagegen_shed_total": "Submits refused with 429, by limit",
    "imagegen_degraded_total": "Jobs accepted degraded under load, by what they got (`to`: fewer steps, or the model's student)",
    "imagegen_queue_wait_seconds": "Admission to the scheduler until a GPU worker took the job",
    "imagegen_time_to_first_preview_seconds": "Submit until the first preview was published",
    "imagegen_previews_withheld_total": "Preview pictures the image gate did not allow (not sent; the job's next round is judged afresh), by decision",
    "imagegen_submit_to_done_seconds": "Submit until the job was done",
    "imagegen_batch_size": "Images per pipeline pass",
    "imagegen_batch_fill": "Batch size over the shape's cap",
    "imagegen_rewrite_batch_size": "Prompts per forward pass of the prompt rewriter (the rewrite stage)",
    "imagegen_rewrite_seconds": "Seconds one forward pass of the prompt rewriter takes",
    "imagegen_classifier_seconds": "Output image classifier latency per batch",
}


def _labels_key(labels: dict | None) -> str:
    return json.dumps(labels or {}, sort_keys=True)


def inc(name: str, value: float = 1.0, **labels) -> None:
    try:
        key, field = f"{PREFIX}m:c:{name}", _labels_key(labels)
        write(lambda pipe: pipe.hincrbyfloat(key, field, value))  # with the request's other counters
    except Exception:
        log.warning("metric %s not recorded", name, exc_info=True)


def inc_on_commit(name: str, value: float = 1.0, **labels) -> None:
    """inc() once the current transaction commits (at once outside one): a rolled-back change
    is never counted."""
    if value:
        from django.db import transaction

        transaction.on_commit(lambda: inc(name, value, **labels))


def count_jobs(status: str, version: str, n: int = 1) -> None:
    """n jobs of this model version entered `status` (on commit)."""
    inc_on_commit("imagegen_jobs_total", n, status=str(status), version=version)


def count_verdicts(verdicts) -> None:
    """Safety verdicts recorded (on commit), by stage, category and decision."""
    for v in verdicts:
        inc_on_commit("imagegen_safety_decisions_total", stage=v.stage, category=v.category or "-", decision=v.decision)
        if v.stage == "prompt" and getattr(v, "language", ""):  # a check that ran (not a cache hit)
            inc_on_commit("imagegen_prompt_checks_total", language=getattr(v, "language", "") or "-", decision=v.decision)


def observe(name: str, value: float, **labels) -> None:
    try:
        key = f"{PREFIX}m:h:{name}"
        lk = _labels_key(labels)
        pipe = get_redis().pipeline()
        for le in BUCKETS[name]:
            if value <= le:
                pipe.hincrbyfloat(key, f"{lk}|{le}", 1)
        pipe.hincrbyfloat(key, f"{lk}|+Inf", 1)
        pipe.hincrbyfloat(key, f"{lk}|sum", value)
        pipe.execute()
    except Exception:
        log.warning("metric %s not recorded", name, exc_info=True)


def read_counters() -> dict[str, dict[str, float]]:
    r = get_redis()
    out = {}
    for key in r.scan_iter(f"{PREFIX}m:c:*"):
        out[key[len(f"{PREFIX}m:c:"):]] = {k: float(v) for k, v in r.hgetall(key).items()}
    return out


def read_histograms() -> dict[str, dict[str, dict[str, float]]]:
    """name -> labels key -> {"le": count..., "sum": s}"""
    r = get_redis()
    out: dict = {}
    for key in r.scan_iter(f"{PREFIX}m:h:*"):
        name = key[len(f"{PREFIX}m:h:"):]
        for field, value in r.hgetall(key).items():
            lk, _, part = field.rpartition("|")
            out.setdefault(name, {}).setdefault(lk, {})[part] = float(value)
    return out
