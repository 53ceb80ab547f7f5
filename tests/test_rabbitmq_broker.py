"""RabbitMQ as the broker instead of Redis, with no code change: only CELERY_BROKER_URL differs.
Skipped where no RabbitMQ answers on 127.0.0.1:5672."""

from __future__ import annotations

import socket

import pytest
from celery import Celery
from django.conf import settings
from django.test import override_settings

from tests.conftest import wait_for_status
from tests.test_generation import submit

pytestmark = pytest.mark.django_db(transaction=True)
AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def rabbitmq_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not rabbitmq_up(), reason="no RabbitMQ on 127.0.0.1:5672")
def test_a_job_runs_end_to_end_over_a_rabbitmq_broker(worker_env, start_worker, alice_api, monkeypatch):
    lane = "shapes-amqp"  # its own queues, so the session's Redis-broker workers stay out of it
    env = {"CELERY_BROKER_URL": AMQP, "IMAGEGEN_QUEUE_CPU": "cpu-amqp", "IMAGEGEN_QUEUE_IO": "io-amqp",
           "IMAGEGEN_QUEUE_CLASSIFY": "classify-amqp", "IMAGEGEN_MODEL_NAME": lane}
    start_worker("amqp-cpu", "cpu-amqp,io-amqp,classify-amqp", **env)
    start_worker("amqp-gpu", f"{settings.QUEUE_GPU_PREFIX}{lane}", **env)
    # This process is the web tier of that deployment: its first task goes out over RabbitMQ too.
    amqp_app = Celery(broker=AMQP, set_as_current=False)  # never replace the project app for later tests
    from jobs.pipeline import stages

    def send(stage, *args, countdown=None):  # the submit dispatches its first stage through the table
        amqp_app.send_task(stages.STAGES[stage].task, args=list(args), queue="cpu-amqp", countdown=countdown)
        return True

    monkeypatch.setattr("jobs.pipeline.stages.send", send)
    with override_settings(IMAGEGEN_MODEL_NAME=lane):
        job = submit(alice_api, steps=2, seed=808, prompt="a rabbit-shaped square")
        done = wait_for_status(job["id"], ("done",), timeout=90)
    assert done.images.count() == 1
    assert done.batch.worker  # the RabbitMQ GPU worker ran the batch
