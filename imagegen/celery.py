"""The one Celery app, configured from Django settings under the CELERY_ prefix."""

import os

from celery import Celery
from celery.signals import beat_init, worker_process_init

from imagegen.lifetime import die_with_parent_if_asked

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")

app = Celery("imagegen")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_init.connect
@beat_init.connect
def _die_with_the_worker(**kwargs) -> None:
    """A pool process (or the embedded beat) goes with its worker, even one killed outright or
    one that refuses to start (imagegen/lifetime.py)."""
    die_with_parent_if_asked()
