"""The end users' page in a real browser: Debian's headless chromium driven by Playwright,
against daphne and real workers. Sign in, submit, watch the preview, see the final image."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.browser import usable_password

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser_page():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; never `playwright install`)")
    # Playwright's sync API runs an event loop in this thread; the test itself touches the
    # database only before the browser starts.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        page = context.new_page()
        page.set_default_timeout(30_000)
        yield page
        context.close()
        browser.close()


def test_sign_in_submit_watch_the_preview_and_see_the_final_image(workers, daphne_server, alice, browser_page):
    page, server = browser_page, daphne_server
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    ARTIFACTS.mkdir(exist_ok=True)

    page.goto(server.url + "/")
    assert "/accounts/login/" in page.url  # the page needs a session
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("wrong")
    page.get_by_role("button", name="Sign in").click()
    assert page.get_by_role("alert").is_visible()
    page.screenshot(path=str(ARTIFACTS / "login_page.png"))
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill(usable_password(alice))
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(server.url + "/")
    assert page.get_by_text("Signed in as").is_visible()
    assert {c["name"] for c in page.context.cookies()} >= {"csrftoken", "sessionid"}

    # Markup in the prompt must stay text.
    prompt = 'a red circle <img src=x onerror="window.pwned=1"> & "quotes"'
    page.get_by_label("Prompt", exact=True).fill(prompt)
    page.get_by_label("Size").select_option("96x96")
    page.get_by_label("Steps").fill("48")
    page.get_by_label("Seed").fill("11")
    page.get_by_role("button", name="Generate").click()

    page.wait_for_selector("#current:not([hidden])")
    assert page.locator("#current-prompt").text_content() == prompt
    # The preview sharpens step by step: at least one arrives over the websocket before done.
    page.wait_for_function("document.getElementById('preview').dataset.step !== undefined")
    assert page.get_attribute("#preview", "src").startswith("data:image/jpeg;base64,")
    if page.locator("#preview-figure").is_visible():
        page.screenshot(path=str(ARTIFACTS / "web_page_running.png"))
    final = page.locator("#results img.final")
    final.wait_for()
    page.wait_for_function("document.querySelector('#results img.final').naturalWidth === 96")
    assert page.locator("#current-status").text_content() == "done"
    assert page.locator("#progress").get_attribute("aria-valuetext") == "step 48 of 48"
    assert final.get_attribute("src").startswith("/media/i/")
    assert page.locator("#cancel").is_hidden()

    # The gallery lists the job with its thumbnail and the prompt as text.
    page.wait_for_selector(".gallery .tile img")
    assert page.locator(".gallery .tile p").first.text_content() == prompt
    assert page.evaluate("window.pwned") is None
    assert page.locator(".gallery img[src='x']").count() == 0
    page.screenshot(path=str(ARTIFACTS / "web_page.png"), full_page=True)
    assert errors == []
