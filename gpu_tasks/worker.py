"""GPU and classify worker start-up and shutdown: load the model (or the image classifier)
before the first task, send heartbeats, and finish hand-offs in flight on a warm shutdown."""

from __future__ import annotations

import logging

from celery.signals import worker_ready, worker_shutdown
from django.conf import settings

log = logging.getLogger(__name__)


def _queues(sender) -> set[str]:
    consumer = getattr(sender, "task_consumer", None)
    return {q.name for q in consumer.queues} if consumer is not None else set()


@worker_ready.connect
def _on_worker_ready(sender=None, **kwargs):
    """Load what the rows of the stages this worker consumes declare (`loads` in
    imagegen/stage_table.py; the prompt filter is loaded earlier, before the pool forks)."""
    from imagegen.stage_table import loads_for

    queues = _queues(sender)
    loads = loads_for(queues)
    gpu_queues = sorted(q for q in queues if q.startswith(settings.QUEUE_GPU_PREFIX))
    if "signing_key" in loads:
        _check_signing_key()
    if "image_gate" in loads:  # GPU workers gate their previews
        _check_image_gate()
    if "rewriter" in loads and settings.IMAGEGEN_REWRITER_PATH:
        from gpu_tasks.rewrite_stage import rewriter

        log.info("prompt rewriter %s loaded", rewriter().version)  # from disk, before its first batch
    if "model" not in loads or not gpu_queues:
        return
    from gpu_tasks.generate import WORKER_ID, runner_for
    from gpu_tasks.pipeline import get_model
    from scheduling import catalogue, heartbeats

    caps: dict[str, dict | None] = {}
    for queue in gpu_queues:  # load each lane's model once, before its first batch
        version = catalogue.version_of_lane(queue[len(settings.QUEUE_GPU_PREFIX):])
        model = _load_model_or_exit(lambda v=version: get_model(v))
        caps[queue] = model.capabilities() if hasattr(model, "capabilities") else None
        if settings.IMAGEGEN_WARM_UP and settings.IMAGEGEN_ACCELERATOR == "real":
            from gpu_tasks.pipeline import warm_up

            log.info("warmed up every menu shape of %s in %.1fs", queue, warm_up(model))
    for queue in gpu_queues:
        lane = queue[len(settings.QUEUE_GPU_PREFIX):]
        runner_for(lane)  # its hand-off and lease threads start now
        heartbeats.start(lane, WORKER_ID, caps[queue])
    log.info("GPU worker ready for %s", ", ".join(gpu_queues))


GATE_ERROR_KEY = "gate-error"
MODEL_ERROR_KEY = "model-error"


def _check_signing_key() -> None:
    """A worker whose stage signs its images refuses to start without a valid key and chain."""
    import os

    from imagegen import signing_credentials

    try:
        signing_credentials.require()
    except signing_credentials.CredentialsError as exc:
        log.critical("content credentials: %s; this worker signs every image it makes, refusing to start", exc)
        os._exit(3)


def _load_model_or_exit(get_model):
    """Load the served model and check its family against the settings (gpu_tasks/families.py):
    a setting the family cannot honour refuses to start the worker, and /readyz names it until
    a worker of this model starts cleanly."""
    import os

    from gpu_tasks.families import ModelConfigError
    from imagegen.redis_client import PREFIX, get_redis

    key = f"{PREFIX}{MODEL_ERROR_KEY}:{settings.IMAGEGEN_MODEL_NAME}"
    try:
        model = get_model()
    except ModelConfigError as exc:
        log.critical("the served model and the settings do not go together, refusing to start: %s", exc)
        try:
            get_redis().set(key, str(exc)[:1000], ex=24 * 3600)
        finally:
            os._exit(3)
    get_redis().delete(key)
    return model


def _check_image_gate() -> None:
    """Load the image classifier(s) and check the policy against them before any work: a
    misconfigured gate (a policy label the classifier cannot produce, a model that does not
    load) refuses to start the worker, and /readyz names it until a worker starts cleanly."""
    import os

    from imagegen.redis_client import PREFIX, get_redis
    from safety import image_gate

    try:
        versions = image_gate.check_classifier()
    except image_gate.ImageGateError as exc:
        log.critical("the image gate is misconfigured, refusing to start: %s", exc)
        try:
            get_redis().set(PREFIX + GATE_ERROR_KEY, str(exc)[:1000], ex=24 * 3600)
        finally:
            os._exit(3)  # the supervisor (make run, systemd, Kubernetes) restarts it, with back-off
    get_redis().delete(PREFIX + GATE_ERROR_KEY)
    log.info("image gate ready: %s", ", ".join(versions))


@worker_shutdown.connect
def _on_worker_shutdown(**kwargs):
    from gpu_tasks.generate import close_runners
    from scheduling import heartbeats

    heartbeats.stop()
    close_runners()
