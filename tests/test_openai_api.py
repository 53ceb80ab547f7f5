"""The OpenAI-compatible routes, driven by the official `openai` package against a live daphne
with real workers; the error mapping that needs no worker runs in-process; and the CLI client."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
from pathlib import Path
from unittest import mock

import httpx
import openai
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from PIL import Image
from rest_framework.test import APIClient

from tests.conftest import make_user

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "a red circle on a blue background"


@pytest.fixture
def oai(daphne_server, workers, alice):  # noqa: F811
    return openai.OpenAI(base_url=f"{daphne_server.url}/v1", api_key=alice.auth_token.key, max_retries=0, timeout=60)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(io.BytesIO(data)) as im:
        return im.size


@pytest.mark.django_db(transaction=True)
def test_generate_url_and_b64_json_models_and_errors(oai, daphne_server):  # noqa: F811
    result = oai.images.generate(prompt=PROMPT, size="96x64", n=2, response_format="url")
    assert isinstance(result.created, int) and result.created > 0
    assert len(result.data) == 2
    for item in result.data:
        assert item.url.startswith(daphne_server.url + "/media/i/")
        fetched = httpx.get(item.url, timeout=10)
        assert fetched.status_code == 200 and fetched.headers["content-type"] == "image/png"
        assert png_size(fetched.content) == (96, 64)

    result = oai.images.generate(prompt=PROMPT, response_format="b64_json", user="end-user-42")
    assert len(result.data) == 1 and result.data[0].url is None
    assert png_size(base64.b64decode(result.data[0].b64_json)) == settings.IMAGEGEN_SIZE_MENU[0]  # the default size

    with pytest.raises(openai.BadRequestError) as blocked:
        oai.images.generate(prompt="a yellow star", size="64x64")
    assert blocked.value.status_code == 400
    assert blocked.value.code == "moderation_blocked"
    assert blocked.value.body["type"] == "invalid_request_error"
    assert blocked.value.body["moderation_details"]["stage"] == "input"

    with pytest.raises(openai.BadRequestError) as bad_size:
        oai.images.generate(prompt=PROMPT, size="1024x1024")
    assert bad_size.value.param == "size" and bad_size.value.code == "invalid_value"
    assert "64x64" in bad_size.value.message  # names the menu

    models = oai.models.list()
    assert [m.id for m in models.data] == [settings.IMAGEGEN_MODEL_VERSION]
    assert models.data[0].owned_by == "imagegen"
    assert oai.models.retrieve(settings.IMAGEGEN_MODEL_VERSION).id == settings.IMAGEGEN_MODEL_VERSION
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("dall-e-3")
    with pytest.raises(openai.BadRequestError) as wrong_model:
        oai.images.generate(prompt=PROMPT, model="dall-e-3")
    assert wrong_model.value.param == "model" and wrong_model.value.code == "model_not_found"

    wrong_key = openai.OpenAI(base_url=f"{daphne_server.url}/v1", api_key="not-a-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        wrong_key.models.list()
    assert auth.value.status_code == 401 and auth.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        wrong_key.images.generate(prompt=PROMPT)


@pytest.mark.django_db(transaction=True)
def test_cli_submit_watch_download(daphne_server, workers, alice, tmp_path):  # noqa: F811
    cli = [sys.executable, str(ROOT / "scripts" / "imagegen_cli.py"), "--url", daphne_server.url]
    env = {"PATH": "/usr/bin:/bin", "IMAGEGEN_TOKEN": alice.auth_token.key}

    def run(*args):
        return subprocess.run([*cli, *args], env=env, capture_output=True, text=True, timeout=90)

    submitted = run("submit", PROMPT, "--size", "64x96", "--seed", "11")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    watched = run("watch", job_id)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    lines = watched.stdout.splitlines()
    assert lines[-2].startswith("status done") and "/media/i/" in lines[-1]
    assert "base64" not in watched.stdout  # previews are a short note
    downloaded = run("download", job_id, "-o", str(tmp_path))
    assert downloaded.returncode == 0, downloaded.stderr
    saved = Path(downloaded.stdout.strip())
    assert png_size(saved.read_bytes()) == (64, 96)

    refused = run("submit", PROMPT, "--size", "80x80")
    assert refused.returncode == 1 and "HTTP 400" in refused.stderr and "size menu" in refused.stderr


# --- in-process: the mapping of outcomes to OpenAI errors (no workers needed) -------------


@pytest.fixture
def carol_bearer(db):
    carol = make_user("carol")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {carol.auth_token.key}")
    return client


def _finish_as(status: str, reason: str = "", blocked_stage: str = ""):
    def finish(job):
        from jobs.models import FIRST_STAGE, at
        type(job).objects.filter(id=job.id).update(**at(FIRST_STAGE[status]), reason=reason, blocked_stage=blocked_stage)
        job.refresh_from_db()
        return job

    async def fake_wait(job, seconds, client_gone=None):  # the view's wait is async
        return await sync_to_async(finish)(job)

    return fake_wait


@pytest.mark.django_db
@pytest.mark.parametrize(
    "status, code, http, error_code",
    [
        ("failed", "generation_failed", 500, "server_error"),
        ("review", "content_policy_review", 400, "invalid_request_error"),
        ("cancelled", "job_cancelled", 409, "invalid_request_error"),
        ("blocked", "moderation_blocked", 400, "invalid_request_error"),
    ],
)
def test_outcomes_map_to_openai_errors(carol_bearer, status, code, http, error_code):
    # A plain (non-transactional) test: the prompt check is sent on commit, which never comes.
    with mock.patch("jobs.api.openai.views._wait_for", _finish_as(status, "because", "image")):
        response = carol_bearer.post("/v1/images/generations", {"prompt": PROMPT}, format="json")
    assert response.status_code == http
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == error_code
    assert set(error) == {"message", "type", "param", "code"} | ({"moderation_details"} if status == "blocked" else set())


@pytest.mark.django_db
def test_timeout_is_504_with_the_job_id(carol_bearer, settings):
    settings.IMAGEGEN_OPENAI_WAIT_SECONDS = 0.2
    response = carol_bearer.post("/v1/images/generations", {"prompt": PROMPT, "size": "auto"}, format="json")
    assert response.status_code == 504
    error = response.json()["error"]
    assert error["code"] == "timeout" and error["type"] == "server_error"
    from jobs.models import GenerationJob

    job = GenerationJob.objects.get()
    assert str(job.id) in error["message"] and job.status == "queued"  # it keeps going
    assert (job.width, job.height) == settings.IMAGEGEN_SIZE_MENU[0]


@pytest.mark.django_db
def test_auth_and_validation_errors_in_openai_shape(carol_bearer):
    anonymous = APIClient()
    response = anonymous.get("/v1/models")
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "invalid_api_key"
    token_keyword = APIClient()
    token_keyword.credentials(HTTP_AUTHORIZATION=f"Token {carol_bearer._credentials['HTTP_AUTHORIZATION'].split()[1]}")
    assert token_keyword.get("/v1/models").status_code == 401

    response = carol_bearer.post("/v1/images/generations", {"prompt": PROMPT, "n": 99}, format="json")
    assert response.status_code == 400 and response.json()["error"]["param"] == "n"
    response = carol_bearer.post("/v1/images/generations", {"n": 1}, format="json")
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    response = carol_bearer.post("/v1/images/generations", "{not json", content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
    response = carol_bearer.post("/v1/images/generations", {"prompt": PROMPT, "response_format": "gif"}, format="json")
    assert response.status_code == 400 and response.json()["error"]["param"] == "response_format"
