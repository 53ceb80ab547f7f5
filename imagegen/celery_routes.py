"""The Celery router: every task's queue comes from the one table in settings
(IMAGEGEN_TASK_QUEUES). A queue written with `{lane}` belongs to a lane: the task's first
argument is the lane, so `run_batch("shapes")` goes to `gpu.shapes` and `run_batch("shapes@v2")`
to `gpu.shapes@v2`. Call sites never name a queue."""

from __future__ import annotations

from django.conf import settings


def route(name: str, args, kwargs, options, task=None, **kw) -> dict | None:
    queue = settings.IMAGEGEN_TASK_QUEUES.get(name)
    if queue is None:
        return None  # CELERY_TASK_DEFAULT_QUEUE
    if "{lane}" in queue:
        lane = (args[0] if args else None) or (kwargs or {}).get("lane")
        if not lane:
            raise ValueError(f"task {name} is routed by lane: its first argument must be the lane")
        queue = queue.format(lane=lane)
    return {"queue": queue}
