"""Take-downs that always happen (issue 28, item 4): un-publishing is an outbox row written in
the take-down's transaction and retried until the public object is gone; a periodic
reconciliation removes any public object whose row is not public; a custom CDN domain with the
log-only purge hook refuses to start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.files.base import ContentFile
from django.test import override_settings

from jobs.media.storage import public_storage
from jobs.models import GeneratedImage
from tests.conftest import client_for
from tests.s3_fixtures import s3_overrides
from tests.test_storage import make_done_image, png_bytes

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def s3(seaweed):
    with override_settings(**s3_overrides(seaweed)):
        yield seaweed


@pytest.fixture
def s3_fails_once(monkeypatch):
    """The bucket refuses the next delete once (what a real S3 does on a bad minute)."""
    from botocore.exceptions import EndpointConnectionError
    from storages.backends.s3 import S3Storage

    original = S3Storage.delete
    failures = [EndpointConnectionError(endpoint_url="http://s3")]

    def delete(self, name):
        if failures:
            raise failures.pop()
        return original(self, name)

    monkeypatch.setattr(S3Storage, "delete", delete)
    return failures


def upkeep() -> None:
    """The periodic upkeep, as beat would run it on the io queue."""
    from jobs.pipeline.retention import run_unpublish

    run_unpublish(reconcile=True)


@override_settings(IMAGEGEN_UNPUBLISH_RETRY_BACKOFF=0)
def test_a_take_down_with_s3_failing_once_still_removes_the_object(s3, s3_fails_once, alice):
    data = png_bytes()
    key = public_storage().save("i/takedown-once.png", ContentFile(data))
    image = make_done_image(alice, key, data)
    assert public_storage().exists(key)

    response = client_for(alice).delete(f"/api/v1/jobs/{image.job_id}")
    assert response.status_code == 204
    assert not s3_fails_once, "the delete was tried"
    from jobs.models import PendingUnpublish

    assert PendingUnpublish.objects.get(storage_key=key).attempts == 1  # the failure is kept, not swallowed
    upkeep()  # the retry
    assert not public_storage().exists(key), "the taken-down object is still public"
    assert not PendingUnpublish.objects.exists()


def test_reconciliation_removes_a_public_object_whose_row_is_not_public(s3, alice):
    from jobs.models import PendingUnpublish

    data = png_bytes((10, 200, 10))
    stray = public_storage().save("i/stray-takedown.png", ContentFile(data))
    kept = public_storage().save("i/kept-public.png", ContentFile(data))
    make_done_image(alice, stray, data, tier="quarantine")  # taken down, the delete lost for good
    make_done_image(alice, kept, data)
    fresh = public_storage().save("i/no-row.png", ContentFile(data))
    assert not PendingUnpublish.objects.exists()
    with override_settings(IMAGEGEN_UNPUBLISH_RECONCILE_GRACE_SECONDS=0):
        upkeep()
    assert not public_storage().exists(stray)
    assert public_storage().exists(kept)
    assert not public_storage().exists(fresh)  # past the grace, an object no row shares goes too
    GeneratedImage.objects.filter(storage_key=kept).update(tier="quarantine")
    with override_settings(IMAGEGEN_UNPUBLISH_RECONCILE_GRACE_SECONDS=3600):
        other = public_storage().save("i/young-stray.png", ContentFile(data))
        upkeep()
        assert public_storage().exists(other), "an object younger than the grace may be a publish in flight"


def test_a_custom_cdn_domain_with_the_log_only_purge_hook_refuses_to_start():
    env = {**os.environ, "IMAGEGEN_S3_BUCKET": "b", "IMAGEGEN_S3_CUSTOM_DOMAIN": "img.example.com",
           "IMAGEGEN_CDN_PURGE_HOOK": "jobs.media.cdn:log_purge", "DJANGO_SETTINGS_MODULE": "imagegen.settings"}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    run = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "IMAGEGEN_CDN_PURGE_HOOK" in run.stderr, run.stderr[-2000:]
    env["IMAGEGEN_CDN_PURGE_HOOK"] = "jobs.media.cdn:http_purge"
    ok = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr[-2000:]



def test_the_unpublish_upkeep_is_scheduled_on_the_io_queue_and_registered(settings):
    from imagegen.celery import app
    from imagegen.stage_table import UPKEEP, route

    assert settings.CELERY_BEAT_SCHEDULE["unpublish"]["task"] == "jobs.pipeline.retention.run_unpublish"
    assert UPKEEP["jobs.pipeline.retention.run_unpublish"] == "QUEUE_IO"
    assert route("jobs.pipeline.retention.run_unpublish", [], {}, {}) == {"queue": settings.QUEUE_IO}
    app.loader.import_default_modules()
    assert "jobs.pipeline.retention.run_unpublish" in app.tasks
