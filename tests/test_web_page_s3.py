"""The page with its images in object storage (issue 44, item 1): image URLs are then absolute
(the bucket's endpoint, or a CDN domain), and the page must show them while still refusing an
image from anywhere else. Debian's chromium against daphne started with the S3 settings, the
image stored in SeaweedFS and read from it by the browser."""

from __future__ import annotations

import io

import pytest
from django.test import override_settings
from PIL import Image

from tests.browser import usable_password
from tests.conftest import make_user
from tests.live_server import start_daphne, stop_daphne
from tests.s3_fixtures import s3_env, s3_overrides
from tests.s3_server import PUBLIC_BUCKET
from tests.test_storage import make_done_image
from tests.test_web_page import browser_page  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_page_and_the_gallery_show_images_stored_in_a_bucket(seaweed, worker_env, browser_page, tmp_path):  # noqa: F811
    from jobs.media.storage import publish_object, store_quarantined

    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buf, "PNG")
    data = buf.getvalue()
    with override_settings(**s3_overrides(seaweed)):
        stored = store_quarantined(data)
        publish_object(stored.key)
    owner = make_user("s3-page")
    make_done_image(owner, stored.key, data)
    server = start_daphne({**worker_env, **s3_env(seaweed)}, tmp_path, name="daphne-s3")
    page = browser_page
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(server.url + "/accounts/login/")
        page.get_by_label("Username").fill(owner.username)
        page.get_by_label("Password").fill(usable_password(owner))
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(server.url + "/")
        # The gallery's tile shows the image from the bucket (before: an empty tile).
        thumb = page.locator(".gallery .tile img")
        thumb.wait_for()
        assert thumb.get_attribute("src") == f"{seaweed.endpoint}/{PUBLIC_BUCKET}/{stored.key}"
        page.wait_for_function("document.querySelector('.gallery .tile img').naturalWidth === 64")
        # Opened, the job's card shows it too.
        page.locator(".gallery .tile button.thumbs").click()
        page.wait_for_function("document.querySelector('#results img.final') !== null "
                               "&& document.querySelector('#results img.final').naturalWidth === 64")
        # Only the origins the server configured: never an image from elsewhere.
        for url in ("https://evil.example/x.png", "//evil.example/x.png", "/\\evil.example/x.png",
                    "javascript:alert(1)", f"{seaweed.endpoint}.evil.example/x.png"):
            assert page.evaluate("(u) => window.imagegen.safeSrc(u)", url) == "", url
        assert page.evaluate("(u) => window.imagegen.safeSrc(u)", "/media/i/x.png") == "/media/i/x.png"
        assert errors == []
    finally:
        stop_daphne(server)
