"""The one Celery app, configured from Django settings under the CELERY_ prefix."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")

app = Celery("imagegen")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
