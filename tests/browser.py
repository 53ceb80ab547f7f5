"""Helpers for the browser tests (Debian's chromium driven by Playwright's sync API)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
SCREENSHOTS = ROOT / "docs" / "screenshots"


def usable_password(user, password: str | None = None) -> str:
    """Give `user` a password the live server can check. The test settings hash with MD5 for
    speed, but daphne runs imagegen.settings, which does not accept MD5 hashes: store a PBKDF2
    hash (few iterations: the server upgrades it on sign-in)."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    password = password or f"{user.username}-pw"
    user.password = PBKDF2PasswordHasher().encode(password, PBKDF2PasswordHasher().salt(), iterations=1000)
    user.save(update_fields=["password"])
    return password


def sign_in(page, server, user) -> None:
    password = usable_password(user)
    page.goto(server.url + "/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(server.url + "/")


def screenshot(page, name: str, **options) -> Path:
    """Into test-artifacts/; also into docs/screenshots/ with IMAGEGEN_UPDATE_SCREENSHOTS=1."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), **options)
    if os.environ.get("IMAGEGEN_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, SCREENSHOTS / path.name)
    return path
