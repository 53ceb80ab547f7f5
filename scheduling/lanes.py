"""Lanes: the scheduling lane of a model version, and waking a GPU worker of a lane.

A lane is the model's name for the version this deployment serves, name@version for any other
(a canary, or a version being drained). Each lane has its own GPU queue (`gpu.<lane>`); the
Celery router (imagegen/celery_routes.py) maps a batch token to its lane's queue from the task's
first argument, so no call site names a queue.
"""

from __future__ import annotations

import logging

from django.conf import settings

from imagegen import stage_table

log = logging.getLogger(__name__)

def lane_of(model_version: str) -> str:
    if model_version == settings.IMAGEGEN_MODEL_VERSION:
        return settings.IMAGEGEN_MODEL_NAME
    return f"{settings.IMAGEGEN_MODEL_NAME}@{model_version}"


def served_lanes() -> list[str]:
    """The lanes of the served model versions, each once, in the catalogue's order."""
    from scheduling import catalogue

    return list(dict.fromkeys(lane_of(version) for version in catalogue.served()))


def lane_of_shape(shape: str) -> str:
    """The lane whose queue holds a shape (a shape key starts with its model version)."""
    return lane_of(shape.split("|", 1)[0])


def pick_version(job_id) -> str:
    """The canary takes IMAGEGEN_CANARY_SHARE of new jobs, chosen by the job id (stable)."""
    share = settings.IMAGEGEN_CANARY_SHARE
    if settings.IMAGEGEN_CANARY_VERSION and share > 0 and (job_id.int % 10_000) / 10_000 < share:
        return settings.IMAGEGEN_CANARY_VERSION
    return settings.IMAGEGEN_MODEL_VERSION


def gpu_queue(lane: str) -> str:
    return settings.QUEUE_GPU_PREFIX + lane


def wake(lane: str) -> None:
    """Send a batch token (the generate stage's row: imagegen/stage_table.py): a free GPU worker
    of the lane takes the next batch. A token carries no job (the work is in the buckets), so a
    lost, duplicated or redelivered one is harmless; the reaper sends one for a lane with work."""
    stage_table.send("generate", lane)
