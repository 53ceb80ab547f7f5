"""/healthz: the process is up. /readyz: the database, Redis and at least one live GPU worker;
anonymous callers learn only ready or not, staff and operators (imagegen.metrics_view.operator_access)
which part fails."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import JsonResponse

from imagegen.metrics_view import operator_access


def healthz(request):
    return JsonResponse({"status": "ok"})


def readyz(request):
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unavailable: {type(exc).__name__}"
    try:
        from imagegen.redis_client import get_redis

        get_redis().ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"unavailable: {type(exc).__name__}"
    if checks["redis"] == "ok":
        from imagegen.redis_client import PREFIX, get_redis
        from scheduling.heartbeats import live_workers

        gate_error = get_redis().get(PREFIX + "gate-error")  # written by a worker that refused to start
        checks["image_gate"] = "ok" if not gate_error else f"misconfigured: {gate_error}"
        model_error = get_redis().get(f"{PREFIX}model-error:{settings.IMAGEGEN_MODEL_NAME}")  # gpu_tasks/worker.py
        checks["model"] = "ok" if not model_error else f"misconfigured: {model_error}"

        from scheduling import catalogue
        from scheduling.lanes import lane_of

        for version in catalogue.served():  # every selectable model needs a worker on its lane
            lane = lane_of(version)
            name = "gpu_workers" if lane == settings.IMAGEGEN_MODEL_NAME else f"gpu_workers:{version}"
            checks[name] = "ok" if live_workers(lane) else f"no live GPU worker for {lane}"
    else:
        checks["gpu_workers"] = "unknown: redis is unavailable"
        checks["image_gate"] = "unknown: redis is unavailable"
        checks["model"] = "unknown: redis is unavailable"
    failing = [part for part, state in checks.items() if state != "ok"]
    body: dict = {"status": "ready" if not failing else "not ready"}
    user = getattr(request, "user", None)
    if (user is not None and user.is_staff) or operator_access(request):
        body.update(checks=checks, failing=failing)
    return JsonResponse(body, status=200 if not failing else 503)
