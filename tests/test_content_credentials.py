"""Content credentials (C2PA) in every image file: a manifest signed at the hand-off that c2pa's
reader verifies, that stops verifying once the pixels change, in PNG, JPEG and WebP, on a
generated image, a cache hit converted to another format and a moderator-approved image; the
embedded signing key survives a restart; production refuses to start without its own."""

from __future__ import annotations

import datetime
import io
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from django.test import Client
from PIL import Image

from imagegen import signing_credentials
from jobs.media import credentials
from jobs.media.encoding import ImageParameters, encode, read_parameters
from tests.conftest import wait_for_status, wait_until_cached
from tests.test_generation import submit

ROOT = Path(__file__).resolve().parent.parent
PARAMS = ImageParameters(prompt="a red circle on a blue background", negative_prompt="blurry", seed=7, steps=20,
                         guidance_scale=5.0, width=64, height=64, model_version="shapes-v1", job_id="job-7")


def picture() -> Image.Image:
    pixels = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def signed(fmt: str) -> bytes:
    encoded, _ = credentials.credentialed(encode(picture(), fmt, None, PARAMS), fmt, PARAMS)
    return encoded.data


def with_other_pixels(data: bytes, fmt: str) -> bytes:
    """The same file, manifest kept, with changed image data: a PNG re-compressed with one pixel
    changed (still a valid PNG); a JPEG or WebP with a byte of its compressed image flipped."""
    out = bytearray(data)
    if fmt == "png":
        at = data.index(b"IDAT") - 4
        length = struct.unpack(">I", data[at:at + 4])[0]
        raw = bytearray(zlib.decompress(data[at + 8:at + 8 + length]))
        raw[1 + 3 * 10] ^= 0x40  # row 0, pixel 10, red (the Sub filter keeps it a one-pixel change)
        body = zlib.compress(bytes(raw))
        chunk = struct.pack(">I", len(body)) + b"IDAT" + body + struct.pack(">I", zlib.crc32(b"IDAT" + body) & 0xFFFFFFFF)
        return data[:at] + chunk + data[at + 12 + length:]
    start = data.index(b"\xff\xda") + 20 if fmt == "jpeg" else data.index(b"VP8") + 20
    out[start + 40] ^= 0x10
    return bytes(out)


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp"])
def test_a_file_of_each_format_carries_a_manifest_that_verifies_and_names_how_it_was_made(fmt):
    data = signed(fmt)
    check = credentials.verify(data)
    assert check.ok and check.trusted and check.state == "Trusted", check.failures
    created = check.actions[0]
    assert created["action"] == "c2pa.created"
    assert created["digitalSourceType"] == credentials.TRAINED_ALGORITHMIC_MEDIA
    assert created["softwareAgent"]["name"] == "shapes-v1"
    assert check.parameters["jobId"] == "job-7" and check.parameters["modelVersion"] == "shapes-v1"
    assert check.parameters["prompt"] == PARAMS.prompt and check.parameters["seed"] == 7
    assert read_parameters(data)["Seed"] == "7", "the A1111 text and XMP stay readable beside the manifest"


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp"])
def test_a_file_whose_pixels_changed_no_longer_verifies(fmt):
    changed = with_other_pixels(signed(fmt), fmt)
    check = credentials.verify(changed)
    assert not check.ok and check.state == "Invalid"
    assert any("mismatch" in f["code"] for f in check.failures), check.failures
    if fmt == "png":
        with Image.open(io.BytesIO(changed)) as im:
            assert np.abs(np.asarray(im.convert("RGB"), int) - np.asarray(picture(), int)).sum() > 0


def test_a_file_without_credentials_does_not_verify():
    check = credentials.verify(encode(picture(), "png", None, PARAMS).data)
    assert not check.ok and check.state == "none"


def test_a_file_signed_by_an_untrusted_root_is_valid_but_not_trusted(tmp_path, settings):
    other = tmp_path / "other"
    other.mkdir()
    creds = signing_credentials.issue_chain(other)
    settings.IMAGEGEN_C2PA_KEY, settings.IMAGEGEN_C2PA_CERT = str(creds.key), str(creds.chain)
    data = signed("png")
    check = credentials.verify(data)
    assert check.ok and not check.trusted and check.state == "Valid"
    assert [f["code"] for f in check.failures] == [credentials.UNTRUSTED]
    assert credentials.verify(data, trust_anchors=str(creds.trust_anchors)).trusted


def _fingerprint(var_dir: Path, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMAGEGEN_", "DJANGO_"))}
    env.update({"DJANGO_SETTINGS_MODULE": "imagegen.settings", "IMAGEGEN_VAR_DIR": str(var_dir),
                "DATABASE_URL": f"sqlite:///{var_dir / 'db.sqlite3'}", **(env_extra or {})})
    code = ("import hashlib, pathlib; from django.conf import settings; "
            "print(hashlib.sha256(pathlib.Path(settings.IMAGEGEN_C2PA_KEY).read_bytes()).hexdigest())")
    return subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True)


def test_the_embedded_key_is_made_once_kept_private_and_survives_a_restart(tmp_path):
    first, second = _fingerprint(tmp_path), _fingerprint(tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.split()[-1] == second.stdout.split()[-1]
    key = tmp_path / signing_credentials.FOLDER / signing_credentials.KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600
    assert _fingerprint(tmp_path / "elsewhere").stdout.split()[-1] != first.stdout.split()[-1], "per installation"


@pytest.mark.integration  # starts a process or opens a socket of its own
def test_production_refuses_to_start_without_a_valid_key_and_certificate(tmp_path):
    production = {"IMAGEGEN_EMBEDDED": "false", "DJANGO_SECRET_KEY": "x" * 50}
    # None named: a process that signs nothing starts (the ones that sign refuse at their own
    # start: tests/test_deploy_files.py); a key or chain that is named is checked everywhere.
    missing = _fingerprint(tmp_path, production)
    assert "IMAGEGEN_C2PA_KEY must name a PEM file" not in missing.stderr
    good_dir, old_dir = tmp_path / "good", tmp_path / "old"
    good_dir.mkdir()
    old_dir.mkdir()
    good = signing_credentials.issue_chain(good_dir, valid_days=365)
    old = signing_credentials.issue_chain(old_dir, valid_days=30, not_before=datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC))
    expired = _fingerprint(tmp_path, {**production, "IMAGEGEN_C2PA_KEY": str(old.key), "IMAGEGEN_C2PA_CERT": str(old.chain)})
    assert expired.returncode != 0 and "expired on 2020-01-31" in expired.stderr
    wrong = _fingerprint(tmp_path, {**production, "IMAGEGEN_C2PA_KEY": str(old.key), "IMAGEGEN_C2PA_CERT": str(good.chain)})
    assert wrong.returncode != 0 and "is not the key of the first certificate" in wrong.stderr
    accepted = _fingerprint(tmp_path, {**production, "IMAGEGEN_C2PA_KEY": str(good.key), "IMAGEGEN_C2PA_CERT": str(good.chain)})
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    assert not (tmp_path / signing_credentials.FOLDER).exists(), "production makes no key of its own"


@pytest.mark.integration  # starts a process or opens a socket of its own
def test_the_cli_verifies_a_file_and_says_when_it_does_not(tmp_path, settings):
    good, bad = tmp_path / "good.jpeg", tmp_path / "bad.jpeg"
    good.write_bytes(signed("jpeg"))
    bad.write_bytes(with_other_pixels(good.read_bytes(), "jpeg"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    trust = ["--trust", settings.IMAGEGEN_C2PA_TRUST_ANCHORS]
    ok = subprocess.run([sys.executable, "scripts/imagegen_cli.py", "verify", str(good), *trust, "--json"], cwd=ROOT,
                        env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    report = json.loads(ok.stdout)
    assert report["state"] == "Trusted" and report["parameters"]["jobId"] == "job-7"
    failed = subprocess.run([sys.executable, "scripts/imagegen_cli.py", "verify", str(bad), *trust], cwd=ROOT, env=env,
                            capture_output=True, text=True)
    assert failed.returncode == 3 and "Invalid" in failed.stdout


# --- the files the service delivers ---


def fetch(url: str) -> bytes:
    response = Client().get(url)
    assert response.status_code == 200, url
    return b"".join(response.streaming_content)


@pytest.mark.django_db(transaction=True)
def test_generated_converted_and_approved_images_carry_valid_credentials(workers, alice_api, classifier_mode,
                                                                          moderator_client, settings):
    from jobs.models import GeneratedImage
    from tests.test_safety_gates import admin_action

    made = {}
    for fmt in ("png", "jpeg", "webp"):
        job = submit(alice_api, prompt="a green square on a white background", seed=3100, output_format=fmt)
        made[fmt] = wait_for_status(job["id"], ("done",))
    for fmt, job in made.items():
        image = job.images.get()
        data = fetch(alice_api.get(f"/api/v1/jobs/{job.id}").json()["images"][0]["url"])
        check = credentials.verify(data)
        assert check.trusted, (fmt, check.failures)
        assert check.parameters["jobId"] == str(job.id) and check.parameters["modelVersion"] == job.model_version
        assert image.content_sha256 and image.content_sha256 != image.sha256

    # A cache hit in another format: encoded again, signed again, naming the job that asked.
    settings.IMAGEGEN_CACHE_SCOPE = "global"
    first = wait_for_status(submit(alice_api, prompt="a purple triangle", seed=3200, output_format="webp")["id"], ("done",))
    wait_until_cached(first)  # remembered just after the commit that made it done
    again = submit(alice_api, prompt="a purple triangle", seed=3200, output_format="jpeg")
    assert again["status"] == "done" and GeneratedImage.objects.get(job_id=again["id"]).source_key
    check = credentials.verify(fetch(again["images"][0]["url"]))
    assert check.trusted and check.parameters["jobId"] == again["id"] != str(first.id)

    # A held image a moderator approves: the file signed at the hand-off, published as it is.
    classifier_mode("json:" + json.dumps({"heart": 0.8}))
    held = submit(alice_api, steps=2, seed=3300, prompt="a pink circle", output_format="webp")
    wait_for_status(held["id"], ("review",))
    classifier_mode(None)
    admin_action(moderator_client, "approve_selected", [held["id"]])
    body = alice_api.get(f"/api/v1/jobs/{held['id']}").json()
    assert body["status"] == "done"
    check = credentials.verify(fetch(body["images"][0]["url"]))
    assert check.trusted and check.parameters["jobId"] == held["id"]
