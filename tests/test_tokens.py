"""Secrets (issue 18, item 8): API tokens stored hashed (a prefix in clear for the lookup, the
token shown once by `issue_token`), the embedded default's secret key generated per
installation and kept in the var folder, the private Redis started with a generated password,
and `manage.py check --deploy` clean with production settings."""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.core.management import call_command
from django.db import connection
from rest_framework.test import APIClient

from tests.test_security import ORIGIN, _connects, make_job

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent


def issue(*args: str) -> str:
    out = io.StringIO()
    call_command("issue_token", *args, stdout=out)
    return out.getvalue().strip().splitlines()[-1]


def every_stored_value() -> str:
    """Every row of every table, as text: where a token in clear would show."""
    rows = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT * FROM "{table}"')
            rows += [repr(row) for row in cursor.fetchall()]
    return "\n".join(rows)


def test_tokens_are_stored_hashed_shown_once_and_work_on_every_route():
    token = issue("erin")
    assert len(token) >= 40
    stored = every_stored_value()
    assert token not in stored, "the API token is stored in clear"
    from django.contrib.auth import get_user_model

    erin = get_user_model().objects.get(username="erin")
    job = make_job(erin, status="running")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api.get(f"/api/v1/jobs/{job.id}").status_code == 200
    bearer = APIClient()
    bearer.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert bearer.get("/v1/models").status_code == 200
    assert asyncio.run(_connects(job.id, ORIGIN, (b"authorization", f"Token {token}".encode())))
    forged = APIClient()
    forged.credentials(HTTP_AUTHORIZATION=f"Token {token[:-4]}abcd")
    assert forged.get("/api/v1/jobs").status_code == 401
    # shown once: asking again issues another token (the first cannot be shown again) and both work
    second = issue("erin")
    assert second != token
    for key in (token, second):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        assert client.get("/api/v1/jobs").status_code == 200
    assert second not in every_stored_value()


def test_the_event_streams_accept_exactly_the_tokens_the_api_accepts():
    """Websocket and SSE authenticate with the API's own token class: a good token connects; a
    forged one, a deactivated user's or a malformed header does not, on either transport."""
    from django.contrib.auth import get_user_model

    token = issue("fran")
    fran = get_user_model().objects.get(username="fran")
    job = make_job(fran, status="running")
    header = f"Token {token}"
    assert asyncio.run(_connects(job.id, ORIGIN, (b"authorization", header.encode())))
    for bad in (f"Token {token[:-4]}abcd", f"Token {token} extra", "Token"):
        assert not asyncio.run(_connects(job.id, ORIGIN, (b"authorization", bad.encode()))), bad
        assert APIClient().get(f"/api/v1/jobs/{job.id}/events", HTTP_AUTHORIZATION=bad).status_code in (401, 403, 404), bad
    fran.is_active = False
    fran.save(update_fields=["is_active"])
    assert not asyncio.run(_connects(job.id, ORIGIN, (b"authorization", header.encode())))
    assert APIClient().get(f"/api/v1/jobs/{job.id}", HTTP_AUTHORIZATION=header).status_code == 401


def _secret_key(var: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SECRET_KEY",)}
    env.update({"IMAGEGEN_VAR_DIR": str(var), "DJANGO_SETTINGS_MODULE": "imagegen.settings"})
    out = subprocess.run([sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
                          "print(settings.SECRET_KEY)"], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_the_embedded_secret_key_is_generated_per_installation_and_kept_in_the_var_folder(tmp_path):
    first = _secret_key(tmp_path / "a")
    assert _secret_key(tmp_path / "a") == first  # kept across restarts
    other = _secret_key(tmp_path / "b")
    assert other != first  # per installation
    assert len(first) >= 50 and "insecure" not in first
    files = [p for p in (tmp_path / "a").iterdir() if p.is_file() and p.read_text().strip() == first]
    assert files and oct(files[0].stat().st_mode & 0o777) == "0o600", files


def test_the_private_redis_requires_its_generated_password(tmp_path):
    from scripts.private_redis import start

    proc, url = start(tmp_path / "redis")
    try:
        parsed = redis.Redis.from_url(url).connection_pool.connection_kwargs
        assert parsed.get("password") and len(parsed["password"]) >= 20
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=parsed["port"]).ping()
        assert redis.Redis.from_url(url).ping()
        assert parsed["password"] not in Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
        proc.kill()
        proc.wait()
        proc, again = start(tmp_path / "redis", port=parsed["port"])  # restarted on its port: same URL
        assert again == url and redis.Redis.from_url(url).ping()
    finally:
        proc.kill()
        proc.wait()


def production_signing_credentials(folder) -> dict[str, str]:
    """Production names its own content-credentials key and certificate (imagegen/signing_credentials.py)."""
    from imagegen.signing_credentials import issue_chain

    (folder / "c2pa-issued").mkdir()
    creds = issue_chain(folder / "c2pa-issued", valid_days=365, organization="imagegen test")
    return {"IMAGEGEN_C2PA_KEY": str(creds.key), "IMAGEGEN_C2PA_CERT": str(creds.chain)}


def test_check_deploy_passes_with_production_settings(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMAGEGEN_", "DJANGO_"))}
    env.update({
        "DJANGO_SETTINGS_MODULE": "imagegen.settings", "IMAGEGEN_EMBEDDED": "false",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50), "DJANGO_ALLOWED_HOSTS": "imagegen.example.com",
        "IMAGEGEN_VAR_DIR": str(tmp_path), "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        **production_signing_credentials(tmp_path),
    })
    out = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no issues" in out.stdout
