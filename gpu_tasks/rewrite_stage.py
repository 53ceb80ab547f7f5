"""The rewrite stage's worker side: claim the waiting jobs of every user (one claim), rewrite
their prompts in one forward pass of the rewriter, save each (which moves it on: a changed
prompt to its second check, an unchanged one straight to the scheduler), then send a changed
one to the prompt gate (the cpu queue).
The writes are jobs/actions/rewrites.py's; the model is gpu_tasks/rewriter.py's."""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import connection

log = logging.getLogger(__name__)

_loaded: dict[str, object] = {}
_load_lock = threading.Lock()


def rewriter():
    """The configured rewriter, loaded once per process (from disk, never downloaded)."""
    from gpu_tasks.rewriter import Rewriter

    path = settings.IMAGEGEN_REWRITER_PATH
    if not path:
        raise RuntimeError("no rewriter is configured (IMAGEGEN_REWRITER_PATH)")
    with _load_lock:
        if path not in _loaded:
            _loaded[path] = Rewriter(path, threads=settings.IMAGEGEN_TORCH_THREADS or None)
        return _loaded[path]


def run(job_id: str | None = None) -> int:
    """Rewrite what waits (the named job first). Returns how many prompts were rewritten."""
    from imagegen import metrics
    from jobs import actions
    from jobs.pipeline import stages
    from jobs.realtime import events
    from jobs.representation import rewritten_event
    from scheduling import costs

    jobs = actions.claim_rewrites(job_id, settings.IMAGEGEN_REWRITE_BATCH)
    if not jobs:
        return 0
    started = time.monotonic()
    try:
        model = rewriter()
        results = model.rewrite([job.prompt for job in jobs])
    except Exception:
        log.exception("the rewriter failed on %d prompts; they go back to wait", len(jobs))
        actions.release_rewrites([job.id for job in jobs])
        raise
    seconds = time.monotonic() - started
    costs.record_rewrite_cost(len(jobs), seconds)
    actions.observe_stage_seconds("rewrite", seconds)
    metrics.observe("imagegen_rewrite_batch_size", len(jobs))
    metrics.observe("imagegen_rewrite_seconds", seconds)
    for job, result in zip(jobs, results, strict=True):
        if not actions.save_rewrite(job.id, result.prompt, model.version, changed=result.changed,
                                    notes=result.notes):
            continue  # cancelled or failed meanwhile
        events.publish(job.id, rewritten_event(job.id, result.prompt, result.notes))
        if result.changed:  # unchanged: already in its shape's bucket (save_rewrite scheduled it)
            stages.send("prompt", str(job.id))  # the second gate, on what the image model will draw
    log.info("rewrote %d prompts in %.3fs", len(jobs), seconds, extra={"stage": "rewrite"})
    connection.close_if_unusable_or_obsolete()
    return len(jobs)
