"""Object storage (issue 7): local folders and a real S3 server (SeaweedFS on loopback), public
and quarantine storages, upload retries, retention tiers, dropped bytes regenerated on demand,
purge on delete, and the staff-only private image view.

The S3 half runs its own GPU and stage workers with the S3 settings on queues of their own
(tests/s3_fixtures.py), so the session's local workers never take its jobs.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.files.storage import FileSystemStorage
from django.test import override_settings
from django.utils import timezone
from PIL import Image
from rest_framework.test import APIClient

from tests.conftest import client_for, forget_cache, make_user, wait_for_status
from tests.s3_fixtures import S3_MODEL_NAME, s3_overrides
from tests.s3_server import PUBLIC_BUCKET, QUARANTINE_BUCKET

PURGED: list[str] = []


def record_purge(urls: list[str]) -> None:
    PURGED.extend(urls)


def png_bytes(color=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buf, format="PNG")
    return buf.getvalue()


def http_get(url: str) -> tuple[int, bytes, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, b"", dict(e.headers)


# --- the S3 server and the settings that point at it ---


@pytest.fixture(params=["local", "s3"])
def backend(request):
    """Points the test process's storages at the backend; yields (name, server or None)."""
    if request.param == "local":
        yield "local", None
        return
    server = request.getfixturevalue("seaweed")
    with override_settings(**s3_overrides(server)):
        yield "s3", server


@pytest.fixture
def generating(backend, request, monkeypatch):
    """Workers that store to the backend. For S3: a GPU worker started with the S3 settings,
    serving its own queue (model name s3shapes), and this process runs the prompt gate itself
    under that model name, so the job is admitted to that worker and no other."""
    name, server = backend
    if name == "local":
        request.getfixturevalue("workers")
        yield backend
        return
    request.getfixturevalue("s3_gpu_worker")
    from jobs.pipeline import stages
    from jobs.pipeline.tasks import check_prompt

    real_send = stages.send

    def send(stage, *args, countdown=None):  # the prompt check runs here, the later stages on workers
        if stage == "prompt":
            check_prompt.run(*args)
            return True
        return real_send(stage, *args, countdown=countdown)

    monkeypatch.setattr(stages, "send", send)
    with override_settings(IMAGEGEN_MODEL_NAME=S3_MODEL_NAME):
        yield backend


def fetch_public(name: str, url: str) -> tuple[int, bytes, dict]:
    """GET an image URL the way a browser would: the app for local storage, the bucket for S3."""
    if name == "local":
        response = APIClient().get(url)
        body = b"".join(response.streaming_content) if response.status_code == 200 else b""
        return response.status_code, body, dict(response.headers)
    return http_get(url)


def make_done_image(owner, storage_key: str, data: bytes, *, tier="public", model_version=None, **fields):
    from jobs.models import GeneratedImage, GenerationJob

    job = GenerationJob.objects.create(
        owner=owner, prompt="a red square", width=64, height=64, steps=4, guidance_scale=5.0, seed=11, count=1,
        model_version=model_version or settings.IMAGEGEN_MODEL_VERSION, stage="done",
    )
    return GeneratedImage.objects.create(
        job=job, index=0, seed=11, storage_key=storage_key, width=64, height=64, byte_size=len(data),
        sha256=hashlib.sha256(data).hexdigest(), tier=tier, **fields,
    )


# --- upload, URLs, privacy ---


@pytest.mark.django_db(transaction=True)
def test_upload_sets_immutable_headers_and_plain_public_urls(backend, alice):
    from jobs.media.storage import image_url, public_storage, store_bytes

    name, server = backend
    data = png_bytes()
    obj = store_bytes(data, public_storage())
    assert obj.key.startswith("i/") and obj.key.endswith(".png") and obj.byte_size == len(data)
    assert obj.sha256 == hashlib.sha256(data).hexdigest()
    url = image_url(obj.key)
    assert "?" not in url, "public URLs carry no per-request signature"
    if name == "s3":
        head = server.client().head_object(Bucket=PUBLIC_BUCKET, Key=obj.key)
        assert head["ContentType"] == "image/png"
        assert head["CacheControl"] == "public, max-age=31536000, immutable"
        assert url == f"{server.endpoint}/{PUBLIC_BUCKET}/{obj.key}"
    else:
        assert url == f"/media/{obj.key}"
        make_done_image(alice, obj.key, data)
    status, body, headers = fetch_public(name, url)
    assert status == 200 and body == data
    assert headers["Content-Type"] == "image/png"
    assert headers["Cache-Control"] == "public, max-age=31536000, immutable"


@pytest.mark.django_db(transaction=True)
def test_custom_domain_urls_have_no_signature_and_serve(seaweed):
    from jobs.media.storage import image_url, public_storage, store_bytes

    with override_settings(**s3_overrides(seaweed, custom_domain="cdn.example.test")):
        assert image_url("i/abc.png") == "https://cdn.example.test/i/abc.png"
    # A "CDN" that is the bucket itself, so the custom-domain URL can be fetched here.
    host = f"{seaweed.endpoint.split('//')[1]}/{PUBLIC_BUCKET}"
    with override_settings(**s3_overrides(seaweed, custom_domain=host, url_protocol="http:")):
        data = png_bytes((1, 2, 3))
        obj = store_bytes(data, public_storage())
        url = image_url(obj.key)
        assert url == f"http://{host}/{obj.key}"
        assert http_get(url)[:2] == (200, data)


@pytest.mark.django_db(transaction=True)
def test_quarantine_is_private_and_staff_read_it(backend, alice):
    from django.contrib.auth.models import Permission

    from jobs.media.storage import private_url, quarantine_storage, store_bytes

    name, server = backend
    data = png_bytes((9, 9, 9))
    obj = store_bytes(data, quarantine_storage())
    image = make_done_image(alice, obj.key, data, tier="quarantine")
    if name == "s3":
        head = server.client().head_object(Bucket=QUARANTINE_BUCKET, Key=obj.key)
        assert head["ContentType"] == "image/png"
        # Anonymous GET of the plain URL is refused; a short-lived presigned URL works.
        assert http_get(f"{server.endpoint}/{QUARANTINE_BUCKET}/{obj.key}")[0] == 403
        signed = private_url(obj.key, expires=60)
        assert "Signature=" in signed or "X-Amz-Signature=" in signed
        assert http_get(signed)[:2] == (200, data)
        # Not reachable through the public bucket either.
        assert http_get(f"{server.endpoint}/{PUBLIC_BUCKET}/{obj.key}")[0] == 404
    else:
        assert private_url(obj.key) is None
        assert not str(quarantine_storage().location).startswith(str(settings.MEDIA_ROOT))
        assert APIClient().get(f"/media/{obj.key}").status_code == 404

    url = f"/staff/images/{image.id}"
    assert APIClient().get(url).status_code == 404
    alice_web = APIClient()
    alice_web.force_login(alice)
    assert alice_web.get(url).status_code == 404
    staff_no_perm = make_user("helpdesk", is_staff=True)
    web = APIClient()
    web.force_login(staff_no_perm)
    assert web.get(url).status_code == 404
    mod = make_user("mod", is_staff=True)
    mod.user_permissions.add(Permission.objects.get(codename="review_content", content_type__app_label="safety"))
    web.force_login(mod)
    response = web.get(url)
    assert response.status_code == 200 and b"".join(response.streaming_content) == data
    assert response["Cache-Control"] == "private, no-store"
    if name == "s3":
        redirect = web.get(url, {"redirect": "1"})
        assert redirect.status_code == 302 and http_get(redirect["Location"])[:2] == (200, data)


# --- upload retries ---


class FlakyStorage(FileSystemStorage):
    def __init__(self, failures: list[Exception], **kwargs):
        super().__init__(**kwargs)
        self.failures = list(failures)
        self.calls = 0

    def _save(self, name, content):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return super()._save(name, content)


def client_error(code: str, status: int):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


def test_store_bytes_writes_once_and_leaves_nothing_behind_when_it_fails(tmp_path):
    """No retry loop of the project's own (issue 43): a failed write is raised at once, with no
    half-written object under the key; retrying is botocore's (S3) or the stage's (Celery)."""
    from jobs.media.storage import store_bytes

    flaky = FlakyStorage([OSError("disk hiccup")], location=tmp_path)
    with pytest.raises(OSError, match="disk hiccup"):
        store_bytes(b"data", flaky)
    assert flaky.calls == 1
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], "no half-written leftovers"
    obj = store_bytes(b"data", flaky)
    assert flaky.calls == 2 and (tmp_path / obj.key).read_bytes() == b"data"


class _ThrottlingS3(http.server.ThreadingHTTPServer):
    """An S3 endpoint on loopback that answers each PUT from a script (HTTP status, S3 error code),
    then 200: what a throttling or failing store says, which SeaweedFS cannot be made to say."""

    def __init__(self, script: list[tuple[int, str]]):
        self.script, self.puts = list(script), 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_PUT(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.puts += 1
                status, code = server.script.pop(0) if server.script else (200, "")
                body = b"" if status == 200 else (
                    f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode())
                self.send_response(status)
                self.send_header("ETag", '"0123456789abcdef0123456789abcdef"')
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def storage(self, attempts: int):
        from django.core.files.storage import storages

        from imagegen.settings import s3_storages

        entries = s3_storages("bucket", endpoint_url=f"http://127.0.0.1:{self.server_address[1]}", access_key="a",
                              secret_key="b", addressing_style="path", attempts=attempts)
        with override_settings(STORAGES={**settings.STORAGES, **entries}):
            return storages.create_storage(entries["default"])


@pytest.mark.integration  # a socket of its own
@pytest.mark.parametrize("script, attempts, stored, puts", [
    ([(503, "SlowDown"), (500, "InternalError")], 3, True, 3),  # transient twice, then stored: botocore's retries
    ([(503, "SlowDown")] * 5, 3, False, 3),  # still failing after the bounded attempts: raised
    ([(403, "AccessDenied")], 3, False, 1),  # a refusal is not retried
])
def test_transient_s3_errors_are_retried_by_botocore_a_bounded_number_of_times(script, attempts, stored, puts):
    from jobs.media.storage import store_bytes

    server = _ThrottlingS3(script)
    try:
        storage = server.storage(attempts)
        if stored:
            assert store_bytes(b"data", storage).byte_size == 4
        else:
            with pytest.raises(Exception, match=script[0][1]):
                store_bytes(b"data", storage)
        assert server.puts == puts
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.integration  # starts a process or opens a socket of its own
def test_an_unreachable_bucket_fails_after_the_bounded_retries():
    from botocore.exceptions import EndpointConnectionError
    from django.core.files.storage import storages

    from imagegen.settings import s3_storages
    from jobs.media.storage import store_bytes
    from tests.s3_server import _free_ports

    dead = s3_storages("nowhere", endpoint_url=f"http://127.0.0.1:{_free_ports(1)[0]}", access_key="a", secret_key="b",
                       addressing_style="path", attempts=2)
    with override_settings(STORAGES={**settings.STORAGES, **dead}):
        started = time.monotonic()
        with pytest.raises(EndpointConnectionError):
            store_bytes(b"data", storages["default"])
        assert time.monotonic() - started < 20


# --- the whole path: generate, tier, drop, regenerate, purge ---


@pytest.mark.django_db(transaction=True)
def test_generate_cold_drop_regenerate_and_delete(generating, alice, bob):
    from jobs.models import GeneratedImage, GenerationJob
    from jobs.pipeline.retention import count_view, run_retention

    name, server = generating
    forget_cache()
    alice_api, bob_api = client_for(alice), client_for(bob)
    created = alice_api.post("/api/v1/jobs", {"prompt": "a blue circle", "width": 64, "height": 64, "steps": 2,
                                              "seed": 4242, "count": 1}, format="json")
    assert created.status_code == 202, created.content
    job = wait_for_status(created.json()["id"], ("done",), timeout=90)
    image = job.images.get()
    url = alice_api.get(f"/api/v1/jobs/{job.id}").json()["images"][0]["url"]
    status, body, headers = fetch_public(name, url)
    assert status == 200 and hashlib.sha256(body).hexdigest() == image.sha256
    assert headers["Cache-Control"] == "public, max-age=31536000, immutable"
    if name == "s3":
        assert url.startswith(f"{server.endpoint}/{PUBLIC_BUCKET}/i/"), "the GPU worker stored to the bucket"
        head = server.client().head_object(Bucket=PUBLIC_BUCKET, Key=image.storage_key)
        assert head["ContentType"] == "image/png" and head.get("StorageClass", "STANDARD") == "STANDARD"

    # Views are counted and flushed; a young image stays hot.
    count_view(image.storage_key)
    count_view(image.storage_key)
    with override_settings(IMAGEGEN_CDN_PURGE_HOOK="tests.test_storage:record_purge"):
        # The local image view counted the fetch above too; S3 objects are fetched from the bucket.
        expected = 3 if name == "local" else 2
        assert run_retention()["views_flushed"] >= expected
        image.refresh_from_db()
        assert image.views == expected and not image.cold

        # Old and rarely seen: cold tier, same key and URL, still served.
        GeneratedImage.objects.filter(id=image.id).update(created_at=timezone.now() - timedelta(days=40))
        with override_settings(IMAGEGEN_HOT_DAYS=30, IMAGEGEN_COLD_MAX_VIEWS=10):
            assert run_retention()["cold"] == 1
        image.refresh_from_db()
        assert image.cold and not image.bytes_dropped
        if name == "s3":
            head = server.client().head_object(Bucket=PUBLIC_BUCKET, Key=image.storage_key)
            assert head["StorageClass"] == "STANDARD_IA"
            assert head["CacheControl"] == "public, max-age=31536000, immutable" and head["ContentType"] == "image/png"
        assert fetch_public(name, url)[0] == 200

        # The cold tail loses its bytes: the URL 404s, the CDN is purged, row and verdicts stay.
        PURGED.clear()
        with override_settings(IMAGEGEN_HOT_DAYS=30, IMAGEGEN_DROP_COLD_BYTES=True, IMAGEGEN_DROP_AFTER_DAYS=35):
            assert run_retention()["dropped"] == 1
        image.refresh_from_db()
        assert image.bytes_dropped and image.verdicts.exists()
        assert fetch_public(name, url)[0] == 404
        assert PURGED == [url]

    # Asking for it regenerates it: 404 for bob, 202 with a job for alice, then 200, same sha256.
    assert bob_api.get(f"/api/v1/images/{image.id}").status_code == 404
    asked = alice_api.get(f"/api/v1/images/{image.id}")
    assert asked.status_code == 202, asked.content
    regen_id = asked.json()["job"]["id"]
    assert asked.json()["job"]["seed"] == image.seed and asked.json()["job"]["count"] == 1
    wait_for_status(regen_id, ("done",), timeout=90)
    back = alice_api.get(f"/api/v1/images/{image.id}")
    assert back.status_code == 200, back.content
    first_file_sha256 = image.sha256
    image.refresh_from_db()
    assert not image.bytes_dropped and not image.lost and not image.cold
    # The same bytes under new content credentials (jobs/media/credentials.py: salts and signature differ).
    assert image.content_sha256 == GeneratedImage.objects.get(job_id=regen_id).content_sha256
    assert back.json()["sha256"] == image.sha256 != first_file_sha256
    status, body, _ = fetch_public(name, back.json()["url"])
    assert status == 200 and hashlib.sha256(body).hexdigest() == image.sha256

    # Deleting: bob gets 404; alice 204. The object is shared with the regeneration job, so it
    # stays until that job is deleted too; then it is gone, the URL 404s and the CDN is purged.
    assert bob_api.delete(f"/api/v1/jobs/{job.id}").status_code == 404
    with override_settings(IMAGEGEN_CDN_PURGE_HOOK="tests.test_storage:record_purge"):
        PURGED.clear()
        assert alice_api.delete(f"/api/v1/jobs/{job.id}").status_code == 204
        assert not GenerationJob.objects.visible().filter(id=job.id).exists()  # its safety record stays
        assert fetch_public(name, back.json()["url"])[0] == 200
        assert alice_api.delete(f"/api/v1/jobs/{regen_id}").status_code == 204
        assert fetch_public(name, back.json()["url"])[0] == 404
        assert back.json()["url"] in PURGED
        if name == "s3":
            with pytest.raises(Exception, match="404|Not Found"):
                server.client().head_object(Bucket=PUBLIC_BUCKET, Key=image.storage_key)
    assert alice_api.get(f"/api/v1/jobs/{job.id}").status_code == 404


# --- answers that need no GPU ---


@pytest.mark.django_db(transaction=True)
def test_dropped_bytes_of_a_retired_model_version_or_a_mismatch_are_410(alice):
    from jobs.models import GenerationJob, at
    from jobs.pipeline.regenerate import complete_regeneration

    api = client_for(alice)
    data = png_bytes((5, 5, 5))
    retired = make_done_image(alice, "i/" + "a" * 32 + ".png", data, model_version="shapes-v0", bytes_dropped=True)
    gone = api.get(f"/api/v1/images/{retired.id}")
    assert gone.status_code == 410 and "shapes-v0" in gone.json()["detail"]

    # A regeneration whose bytes differ marks the image lost, and it stays 410.
    dropped = make_done_image(alice, "i/" + "b" * 32 + ".png", data, bytes_dropped=True)
    other = make_done_image(alice, "i/" + "c" * 32 + ".png", png_bytes((6, 6, 6)))
    assert complete_regeneration(dropped.id, other.job_id) == "lost"
    dropped.refresh_from_db()
    assert dropped.lost and dropped.storage_key == "i/" + "b" * 32 + ".png"
    assert api.get(f"/api/v1/images/{dropped.id}").status_code == 410
    # Unfinished regeneration: pending; equal bytes: restored onto the new key.
    dropped2 = make_done_image(alice, "i/" + "d" * 32 + ".png", data, bytes_dropped=True)
    same = make_done_image(alice, "i/" + "e" * 32 + ".png", data)
    GenerationJob.objects.filter(id=same.job_id).update(**at("generate"))
    assert complete_regeneration(dropped2.id, same.job_id) == "pending"
    GenerationJob.objects.filter(id=same.job_id).update(**at("done"))
    assert complete_regeneration(dropped2.id, same.job_id) == "restored"
    dropped2.refresh_from_db()
    assert dropped2.storage_key == same.storage_key and not dropped2.bytes_dropped

    present = make_done_image(alice, "i/" + "f" * 32 + ".png", data)
    assert api.get(f"/api/v1/images/{present.id}").status_code == 200
    assert client_for(make_user("eve")).get(f"/api/v1/images/{present.id}").status_code == 404


def test_retention_is_scheduled_on_the_io_queue_and_registered():
    from imagegen.celery import app

    assert settings.CELERY_BEAT_SCHEDULE["retention"]["task"] == "jobs.pipeline.retention.run_retention"
    from imagegen.stage_table import route

    assert route("jobs.pipeline.retention.run_retention", [], {}, {}) == {"queue": settings.QUEUE_IO}
    app.loader.import_default_modules()
    assert "jobs.pipeline.retention.run_retention" in app.tasks and "jobs.media.cdn.retry_purge" in app.tasks


@pytest.mark.integration  # starts a process or opens a socket of its own
def test_http_purge_hook_sends_purge_and_a_failing_hook_is_retried_later(monkeypatch):
    from jobs.media import cdn

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_PURGE(self):  # noqa: N802
            seen.append((self.path, self.headers.get("Fastly-Key")))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with override_settings(IMAGEGEN_CDN_PURGE_HOOK="jobs.media.cdn:http_purge", IMAGEGEN_CDN_PURGE_TOKEN="k"):
            cdn.purge([f"{base}/i/a.png", f"{base}/i/b.png"])
        assert seen == [("/i/a.png", "k"), ("/i/b.png", "k")]
    finally:
        server.shutdown()
        server.server_close()
    queued = []
    monkeypatch.setattr(cdn.retry_purge, "apply_async", lambda args, countdown: queued.append(args))
    with override_settings(IMAGEGEN_CDN_PURGE_HOOK="jobs.media.cdn:http_purge"):
        cdn.purge([f"{base}/i/c.png"])  # the server is gone: no exception, a retry is queued
    assert queued == [[[f"{base}/i/c.png"]]]


def test_a_failing_purge_is_retried_by_celery_with_backoff_and_a_bound(monkeypatch):
    """retry_purge leaves the backoff to Celery (autoretry_for, retry_backoff, jitter): a hook that
    fails twice then works is called three times and succeeds; one that always fails is tried
    max_retries + 1 times, then the task fails (logged, not lost silently)."""
    from jobs.media import cdn

    calls = []

    def flaky(urls):
        calls.append(urls)
        if len(calls) < 3:
            raise ConnectionError("the CDN's API is away")

    monkeypatch.setattr(cdn, "_hook", lambda: flaky)
    assert cdn.retry_purge.apply(args=[["https://cdn.example/i/a.png"]]).state == "SUCCESS"
    assert len(calls) == 3
    calls.clear()
    monkeypatch.setattr(cdn, "_hook", lambda: (lambda urls: (calls.append(urls), 1 / 0)))
    result = cdn.retry_purge.apply(args=[["https://cdn.example/i/b.png"]])
    assert result.state == "FAILURE" and isinstance(result.result, cdn.PurgeFailed)
    assert len(calls) == cdn.retry_purge.max_retries + 1
    assert cdn.retry_purge.retry_backoff == 30 and cdn.retry_purge.retry_jitter


def test_the_media_origins_the_page_trusts_come_from_the_configured_storage():
    """Issue 44, item 1: the page shows images from its own origin and the public storage's (an
    S3 endpoint or a CDN domain), which the server states; nothing else."""
    from imagegen.settings import s3_storages
    from jobs.media.storage import media_origins

    assert media_origins() == []  # local storage: paths on the page's own origin
    bucket = s3_storages("pics", endpoint_url="http://127.0.0.1:8333", access_key="a", secret_key="b",
                         addressing_style="path")
    with override_settings(STORAGES={**settings.STORAGES, **bucket}):
        assert media_origins() == ["http://127.0.0.1:8333"]
    cdn = s3_storages("pics", access_key="a", secret_key="b", custom_domain="img.example.com")
    with override_settings(STORAGES={**settings.STORAGES, **cdn}):
        assert media_origins() == ["https://img.example.com"]


@pytest.mark.integration  # starts a process of its own
def test_production_refuses_to_start_with_the_quarantine_inside_the_public_bucket(tmp_path):
    """Issue 44, item 4: without a quarantine bucket, held and taken-down images would go to a
    prefix of the public bucket, which a CDN that can read the bucket serves."""
    import os
    import subprocess
    import sys

    from imagegen import signing_credentials

    (tmp_path / "c2pa").mkdir()
    chain = signing_credentials.issue_chain(tmp_path / "c2pa", valid_days=365)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMAGEGEN_", "DJANGO_"))}
    env.update({"DJANGO_SETTINGS_MODULE": "imagegen.settings", "IMAGEGEN_VAR_DIR": str(tmp_path),
                "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "IMAGEGEN_EMBEDDED": "false",
                "DJANGO_SECRET_KEY": "x" * 50, "IMAGEGEN_C2PA_KEY": str(chain.key), "IMAGEGEN_C2PA_CERT": str(chain.chain),
                "IMAGEGEN_S3_BUCKET": "pics", "IMAGEGEN_S3_ENDPOINT_URL": "http://127.0.0.1:1"})

    def start(extra: dict) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=settings.BASE_DIR,
                              env={**env, **extra}, capture_output=True, text=True, timeout=120)

    refused = start({})
    assert refused.returncode != 0 and "IMAGEGEN_S3_QUARANTINE_BUCKET" in refused.stderr, refused.stderr[-2000:]
    assert start({"IMAGEGEN_S3_QUARANTINE_BUCKET": "held"}).returncode == 0
    assert start({"IMAGEGEN_EMBEDDED": "true"}).returncode == 0  # a trial on one machine may use a prefix
