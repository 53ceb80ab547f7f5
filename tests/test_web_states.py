"""The end users' page in each state the service knows about, in Debian's chromium (Playwright)
against daphne and real workers: field errors and Ctrl+Enter; queue position and ETA while
queued; a job held for review that keeps listening and shows the moderator's decision live; a
blocked job with its reason and one appeal; every image with its seed, full-size download and
"reuse settings"; gallery paging and delete; a 429 that can never fit, and a real "busy" that
counts down. Screenshots of each state go to test-artifacts/ (and docs/screenshots/ with
IMAGEGEN_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import io
import os
import re
import time
from pathlib import Path

import pytest
from django.conf import settings
from PIL import Image

from jobs.models import GenerationJob
from tests.browser import screenshot, sign_in
from tests.conftest import client_for, make_user, wait_for_status
from tests.live_server import start_daphne, stop_daphne
from tests.test_web_page import browser_page  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PROMPT = "a red circle on a blue background"


@pytest.fixture
def errors(browser_page):  # noqa: F811
    seen: list[str] = []
    browser_page.on("pageerror", lambda exc: seen.append(str(exc)))
    yield seen
    assert seen == [], "script errors on the page"


def off_the_page_loop(action, *args):
    """Run a server-side action (a moderator's decision) in a thread of its own: Playwright's
    sync API keeps an event loop in the test's thread, where sending events would fail."""
    import threading

    from django.db import connection

    failure: list[BaseException] = []

    def run():
        try:
            action(*args)
        except BaseException as exc:  # re-raised in the test
            failure.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if failure:
        raise failure[0]


def latest_job(user) -> GenerationJob:
    return GenerationJob.objects.filter(owner=user).latest("created_at")


def ctrl_enter(page, field: str = "#prompt") -> None:
    page.locator(field).press("Control+Enter")


def test_field_errors_ctrl_enter_every_image_seed_download_reuse_and_delete(workers, daphne_server, alice, browser_page, errors):  # noqa: F811
    page = browser_page
    sign_in(page, daphne_server, alice)
    screenshot(page, "form")

    ctrl_enter(page)  # an empty prompt: said next to the field, nothing sent
    assert page.locator("#prompt-error").text_content() == "Write a prompt first."
    assert GenerationJob.objects.filter(owner=alice).count() == 0

    page.get_by_label("Prompt", exact=True).fill(PROMPT)
    page.get_by_label("Guidance").fill("31")  # over the API's 30
    page.get_by_label("Seed").fill("4294967296")  # over 2**32 - 1
    ctrl_enter(page, "#guidance_scale")
    page.wait_for_selector("#guidance_scale-error:not([hidden])")
    assert "30" in page.locator("#guidance_scale-error").text_content()
    assert page.locator("#seed-error").is_visible() and page.locator("#prompt-error").is_hidden()
    assert page.get_attribute("#guidance_scale", "aria-invalid") == "true"
    screenshot(page, "field_errors")

    page.get_by_label("Guidance").fill("4.5")
    page.get_by_label("Seed").fill("21")
    page.get_by_label("Negative prompt").fill("blurry")
    page.get_by_label("Images", exact=True).fill("2")
    page.get_by_label("Format").select_option("webp")
    page.get_by_label("Steps", exact=True).fill("40")
    ctrl_enter(page)
    page.wait_for_function("document.getElementById('preview').dataset.step !== undefined")  # a gated preview
    if page.locator("#preview-figure").is_visible():
        screenshot(page, "running")
    page.wait_for_selector("#results figure.result >> nth=1")
    page.wait_for_function("[...document.querySelectorAll('#results img.final')].every(i => i.naturalWidth === 64)")
    assert page.locator("#guidance_scale-error").is_hidden()
    captions = page.locator("#results figcaption .seed").all_text_contents()
    assert captions == ["seed 21", "seed 22"]
    job = latest_job(alice)
    assert (job.negative_prompt, job.guidance_scale, job.count, job.output_format) == ("blurry", 4.5, 2, "webp")
    downloads = page.locator("#results a.download")
    assert downloads.count() == 2
    for i in range(2):
        link = downloads.nth(i)
        assert link.get_attribute("download").endswith(f"-{i + 1}-seed{21 + i}.webp")
        body = page.request.get(daphne_server.url + link.get_attribute("href"))
        assert body.headers["content-type"] == "image/webp"
        with Image.open(io.BytesIO(body.body())) as im:
            assert im.size == (64, 64)  # full size, not a thumbnail
    screenshot(page, "done")

    # The gallery has every image of the job, each with its seed; "reuse settings" refills the form.
    tile = page.locator(f".gallery .tile[data-job='{job.id}']")
    tile.wait_for()
    assert tile.locator(".thumbs img").count() == 2
    assert tile.locator(".files .seed").all_text_contents() == ["seed 21", "seed 22"]
    page.get_by_label("Prompt", exact=True).fill("something else")
    page.get_by_label("Format").select_option("png")
    tile.get_by_role("button", name="Reuse settings").click()
    form = {name: page.input_value(f"#{name}") for name in
            ("prompt", "negative_prompt", "size", "steps", "count", "seed", "guidance_scale", "output_format")}
    assert form == {"prompt": PROMPT, "negative_prompt": "blurry", "size": "64x64", "steps": "40", "count": "2",
                    "seed": "21", "guidance_scale": "4.5", "output_format": "webp"}
    assert page.locator("#reuse-note").is_visible()

    page.on("dialog", lambda dialog: dialog.accept())
    tile.get_by_role("button", name="Delete").click()
    tile.wait_for(state="detached")
    assert client_for(alice).get(f"/api/v1/jobs/{job.id}").status_code == 404


def test_queued_shows_position_and_an_eta_that_updates(workers, daphne_server, alice, bob, browser_page, errors):  # noqa: F811
    from tests.test_batching import gpu_held, wait_scheduled

    page = browser_page
    sign_in(page, daphne_server, alice)
    with gpu_held(client_for(bob)) as blocker:  # the GPU worker busy until the block ends
        # Alice's own earlier job: fair share orders jobs within a user's flow first-in first-out,
        # so it is ahead of hers whatever the other users have queued. Queued in the scheduler
        # (its prompt check done) before hers is submitted: the two checks could finish in either
        # order.
        ahead = client_for(alice).post("/api/v1/jobs", {"prompt": "a green square", "steps": 4}, format="json").json()
        wait_scheduled([ahead["id"]], blocker)
        page.get_by_label("Prompt", exact=True).fill(PROMPT)
        page.get_by_label("Steps", exact=True).fill("4")
        page.get_by_role("button", name="Generate").click()
        info = page.locator("#queue-info")
        page.wait_for_function(
            "/ahead of yours|Next in line/.test(document.getElementById('queue-info').textContent)"
            " && /ready in about|any moment/.test(document.getElementById('queue-info').textContent)"
        )
        first = info.text_content()
        # The submit answer's position comes from the wait-estimate summary, which may predate
        # the job ahead by up to its refresh interval; the page's next poll reads the exact count.
        assert re.search(r"1 job ahead of yours|Next in line", first), first
        screenshot(page, "queued")
        # The ETA moves: it counts down each second and each poll brings the server's new one
        # (the box's data-eta-seconds: its text, rounded to minutes past 90 s, may keep its words
        # for a minute on a loaded machine).
        eta = info.get_attribute("data-eta-seconds")
        assert eta is not None and eta != "", first
        page.wait_for_function(f"document.getElementById('queue-info').dataset.etaSeconds !== {eta!r}", timeout=10_000)
        page.wait_for_function("/1 job ahead of yours/.test(document.getElementById('queue-info').textContent)",
                               timeout=10_000)
    page.wait_for_selector("#results img.final", timeout=60_000)
    assert info.is_hidden() and page.locator("#current-status").text_content() == "done"
    wait_for_status(ahead["id"], ("done",))


def test_held_for_review_keeps_listening_and_the_moderators_decision_appears_live(
    workers, daphne_server, alice, moderator, browser_page, errors, classifier_mode,  # noqa: F811
):
    from jobs.actions import approve

    page = browser_page
    sign_in(page, daphne_server, alice)
    classifier_mode('json:{"heart": 0.8}')  # the image gate holds every image for review
    page.get_by_label("Prompt", exact=True).fill("a pink circle")
    page.get_by_role("button", name="Generate").click()
    page.wait_for_function("document.getElementById('current-status').textContent === 'review'")
    classifier_mode(None)
    assert page.locator("#current-reason").text_content().startswith("Held for review:")
    assert "A moderator will look at the image" in page.locator("#next-step").text_content()
    assert page.locator("#results img").count() == 0  # held images are never shown
    screenshot(page, "review")

    job = latest_job(alice)
    # The page only listens now (no reload, no poll): past the ~5 s in which an idle socket used
    # to time out, the decision must still arrive on it.
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.wait_for_timeout(6000)
    assert [url for url in requests if "/api/" in url] == [], "the page polled instead of listening"
    off_the_page_loop(approve, job, moderator, "fine")
    page.wait_for_selector("#results img.final")
    assert page.locator("#current-status").text_content() == "done"
    assert page.locator("#decision").text_content() == "A moderator approved it."
    screenshot(page, "review_approved")


def test_a_job_held_again_after_an_approval_shows_one_state(
    workers, daphne_server, alice, moderator, browser_page, errors, classifier_mode,  # noqa: F811
):
    """A held prompt approved, then its images held: the page says "held for review" and nothing
    else (it went on saying "A moderator approved it: it is being made now" beside it)."""
    from jobs.actions import approve

    page = browser_page
    sign_in(page, daphne_server, alice)
    classifier_mode('json:{"heart": 0.8}')  # the image gate holds every image
    page.get_by_label("Prompt", exact=True).fill("a red heart on a white background")
    page.get_by_role("button", name="Generate").click()
    page.wait_for_function("document.getElementById('current-status').textContent === 'review'")
    assert "look at the prompt" in page.locator("#next-step").text_content()
    job = latest_job(alice)
    off_the_page_loop(approve, job, moderator, "a heart shape is fine")
    page.wait_for_function("document.getElementById('next-step').textContent.includes('look at the image')",
                           timeout=120_000)
    assert page.locator("#current-status").text_content() == "review"
    assert page.locator("#decision").is_hidden(), page.locator("#decision").text_content()
    classifier_mode(None)
    off_the_page_loop(approve, latest_job(alice), moderator, "fine")
    page.wait_for_selector("#results img.final")
    assert page.locator("#decision").text_content() == "A moderator approved it."


def test_a_blocked_job_shows_its_reason_and_one_appeal_whose_outcome_appears(
    workers, daphne_server, alice, moderator, browser_page, errors,  # noqa: F811
):
    from jobs.actions import approve

    page = browser_page
    sign_in(page, daphne_server, alice)
    page.get_by_label("Prompt", exact=True).fill("a yellow star")
    page.get_by_role("button", name="Generate").click()
    page.wait_for_function("document.getElementById('current-status').textContent === 'blocked'")
    reason = page.locator("#current-reason").text_content()
    assert reason.startswith("Blocked by the prompt check: ") and len(reason) > len("Blocked by the prompt check: ")
    assert page.locator("#appeal-box").is_visible()
    screenshot(page, "blocked")

    page.get_by_label("Ask a moderator to look again").fill("It is a plain star shape.")
    page.get_by_role("button", name="Appeal").click()
    page.wait_for_selector("#appeal-box", state="hidden")
    assert "Appeal sent" in page.locator("#next-step").text_content()
    job = latest_job(alice)
    assert job.appeal_note == "It is a plain star shape." and job.appealed_at is not None
    assert client_for(alice).post(f"/api/v1/jobs/{job.id}/appeal", {"note": "again"}, format="json").status_code == 409
    screenshot(page, "appeal_sent")

    off_the_page_loop(approve, job, moderator, "a harmless shape")  # overturned: the prompt goes on to be generated
    page.wait_for_selector("#results img.final", timeout=60_000)
    assert page.locator("#decision").text_content() == "A moderator overturned the block after your appeal."
    screenshot(page, "appeal_overturned")


def test_gallery_pages_through_every_job(workers, daphne_server, browser_page, errors):  # noqa: F811
    carol = make_user("carol")
    api = client_for(carol)
    first = api.post("/api/v1/jobs", {"prompt": "a white triangle", "seed": 777, "steps": 4}, format="json").json()
    from imagegen.redis_client import get_redis
    from jobs.media.cache import request_key

    key = request_key(wait_for_status(first["id"], ("done",)), 0)
    deadline = time.monotonic() + 120
    while not get_redis().exists(key):  # the cache entry is written just after the job is done
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for _ in range(12):  # request-hash cache hits: done at once, no GPU
        assert api.post("/api/v1/jobs", {"prompt": "a white triangle", "seed": 777, "steps": 4}, format="json").json()["status"] == "done"
    page = browser_page
    sign_in(page, daphne_server, carol)
    page.wait_for_selector(".gallery .tile >> nth=11")
    assert page.locator(".gallery .tile").count() == 12
    assert page.locator("#newer").is_hidden()
    screenshot(page, "gallery", full_page=True)
    page.get_by_role("button", name="Older →").click()
    page.wait_for_function("document.querySelectorAll('.gallery .tile').length === 1")
    assert page.locator("#page-label").text_content() == "Page 2"
    assert page.locator(f".gallery .tile[data-job='{first['id']}']").count() == 1  # the oldest
    page.get_by_role("button", name="← Newer").click()
    page.wait_for_function("document.querySelectorAll('.gallery .tile').length === 12")
    assert page.locator("#older").is_visible()


@pytest.fixture
def strict_server(worker_env):
    """A web server whose wait limit is 2 s: a 150-step, 8-image 96x96 job can never fit."""
    server = start_daphne({**worker_env, "IMAGEGEN_MAX_QUEUE_WAIT": "2"}, Path(settings.VAR_DIR), name="daphne-strict")
    yield server
    stop_daphne(server)


def test_a_job_that_can_never_fit_says_so_and_offers_fewer_steps_or_images(workers, strict_server, alice, browser_page, errors):  # noqa: F811
    page = browser_page
    sign_in(page, strict_server, alice)
    page.get_by_label("Prompt", exact=True).fill(PROMPT)
    page.get_by_label("Size").select_option("96x96")
    page.get_by_label("Steps", exact=True).fill("150")
    page.get_by_label("Images", exact=True).fill("8")
    page.get_by_role("button", name="Generate").click()
    page.wait_for_selector("#refused:not([hidden])")
    assert page.get_attribute("#refused", "data-kind") == "never"
    assert "can never fit" in page.locator("#refused-text").text_content()
    assert page.locator("#refused-countdown").is_hidden()  # no pointless countdown
    assert page.locator("#submit").is_enabled()
    buttons = page.locator("#refused-suggestions button").all_text_contents()
    assert any(b.startswith("Use ") and b.endswith(" steps") for b in buttons) and any(b.startswith("Make ") for b in buttons)
    screenshot(page, "never_fits")
    page.locator("#refused-suggestions button", has_text="steps").click()
    assert int(page.input_value("#steps")) < 150
    assert page.locator("#refused").is_hidden()


@pytest.fixture
def busy_server(worker_env):
    """A web server for a lane whose queue is full (3 images queued, the limit 3)."""
    from scheduling import scheduler

    lane = "pagebusy"
    shape = scheduler.shape_key("busy-version", 64, 64, 4, 5.0, "")
    scheduler.enqueue(lane, shape, "someone-elses-job", 3)
    server = start_daphne({**worker_env, "IMAGEGEN_MODEL_NAME": lane, "IMAGEGEN_MAX_QUEUED_IMAGES": "3"},
                          Path(settings.VAR_DIR), name="daphne-busy")
    yield server
    stop_daphne(server)
    scheduler.remove(shape, "someone-elses-job", 3)


def test_a_real_busy_counts_down_its_retry_after(busy_server, alice, browser_page, errors):  # noqa: F811
    page = browser_page
    sign_in(page, busy_server, alice)
    page.get_by_label("Prompt", exact=True).fill(PROMPT)
    page.get_by_role("button", name="Generate").click()
    page.wait_for_selector("#refused-countdown:not([hidden])")
    assert page.get_attribute("#refused", "data-kind") == "busy"
    assert "queue is full" in page.locator("#refused-text").text_content()
    first = int(page.get_attribute("#refused-countdown", "data-left"))
    assert 25 <= first <= 30
    assert page.locator("#submit").is_disabled() and page.locator("#submit").text_content().startswith("Try again in")
    screenshot(page, "busy")
    page.wait_for_function(f"Number(document.getElementById('refused-countdown').dataset.left) < {first}")
    assert GenerationJob.objects.filter(owner=alice).count() == 0


if os.environ.get("IMAGEGEN_UPDATE_SCREENSHOTS") == "1":  # pragma: no cover - a documentation run
    pytestmark.append(pytest.mark.timeout(900))
