"""A batch's own row while its pass is formed and runs: opened when a GPU worker takes work from
the scheduler, sized once its jobs are claimed, timed around the pass."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from jobs.models import Batch, GenerationJob


def open_batch(shape: dict, cap: int, worker: str, lane: str) -> Batch:
    return Batch.objects.create(
        model_version=shape["model_version"], width=shape["width"], height=shape["height"], steps=shape["steps"],
        guidance_scale=shape["guidance_scale"], scheduler=shape["scheduler"], size=0, cap=cap, worker=worker, lane=lane,
    )


def drop_unclaimed_batch(batch_id) -> None:
    """No job of the taken entries could be claimed (all cancelled or taken already)."""
    Batch.objects.filter(id=batch_id, size=0).delete()


def size_batch(batch: Batch, size: int) -> None:
    batch.size = size
    Batch.objects.filter(id=batch.id).update(size=size)


def pass_started(batch_id) -> None:
    Batch.objects.filter(id=batch_id).update(pass_started_at=timezone.now())


def pass_finished(batch_id, gpu_seconds: float, finished_at: datetime) -> None:
    Batch.objects.filter(id=batch_id).update(gpu_seconds=gpu_seconds, finished_at=finished_at)


def record_steering(steering: dict[str, str]) -> None:
    """The steering each job's pass was given (job id -> phrases), where none is recorded yet:
    one statement per distinct steering (a batch has one or two)."""
    by_value: dict[str, list[str]] = {}
    for job_id, value in steering.items():
        by_value.setdefault(value, []).append(job_id)
    for value, ids in by_value.items():
        GenerationJob.objects.filter(id__in=ids, steering=None).update(steering=value)
