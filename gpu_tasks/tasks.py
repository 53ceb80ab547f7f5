"""The GPU-side stage tasks: generate (gpu.<lane>; it takes the lane first, the stage table
routes it to the lane's queue; the worker's hand-off dispatches the next stage) and rewrite
(the prompt rewriter, on its own queue)."""

from __future__ import annotations

import logging

from imagegen.stage_table import stage_task

log = logging.getLogger(__name__)


@stage_task("generate")
def run_batch(lane: str) -> list[str]:
    """A batch token: when this worker is free, run the lane's next batches, if any.

    Tokens carry no job: the work lives in the scheduler's buckets and the database, so a lost,
    duplicated or redelivered token is harmless. Each denoised batch is handed on to classify
    by the worker's hand-off thread once its images are in quarantine.
    """
    from gpu_tasks.generate import runner_for

    return runner_for(lane).run()


@stage_task("rewrite")
def rewrite_prompts(job_id: str | None = None) -> int:
    """A rewrite token: rewrite the prompts of every job waiting for the rewriter (the named job
    first), up to IMAGEGEN_REWRITE_BATCH, in one forward pass (gpu_tasks/rewrite_stage.py).
    A token that finds nothing waiting does nothing."""
    from gpu_tasks.rewrite_stage import run

    return run(job_id)
