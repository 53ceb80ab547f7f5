"""The moderators' review queue in the admin (issue 45, item 1), in Debian's chromium (Playwright)
against daphne: the admin index counts the open cases; at 1280 px the list shows each case's
thumbnail and owner; a case's page shows the image at least 256 px, upscaled without smoothing,
and decides with Approve and Reject with note (which needs a note); an appeal overturned from
the page delivers the image; an appeal overturned and then blocked again is back, and the
moderator who overturned it is told on the index. A screenshot of each state goes to
test-artifacts/ (and docs/screenshots/ with IMAGEGEN_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.models import GenerationJob
from safety.models import SafetyVerdict
from tests.browser import screenshot, usable_password
from tests.test_review_api import appealed_prompt_block, held_image_case, held_prompt_case, make_case, quarantined_image
from tests.test_web_page import browser_page  # noqa: F401  (the fixture)
from tests.test_web_states import off_the_page_loop

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDE = {"width": 1280, "height": 900}


@pytest.fixture
def errors(browser_page):  # noqa: F811
    seen: list[str] = []
    browser_page.on("pageerror", lambda exc: seen.append(str(exc)))
    yield seen
    assert seen == [], "script errors on the page"


def sign_in_to_admin(page, server, user) -> None:
    password = usable_password(user)
    page.goto(server.url + "/admin/login/?next=/admin/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(server.url + "/admin/")


def appealed_image_block(owner, minutes_ago: float) -> GenerationJob:
    """Blocked by the image gate (its image in quarantine), then appealed by its owner."""
    job = make_case(owner, "blocked", minutes_ago, blocked_stage="image", reason="This image looks like a star.",
                    appealed_at=timezone.now(), appeal_note="It is a plain circle.", finished_at=timezone.now())
    image = quarantined_image(job)
    SafetyVerdict.objects.create(job=job, image=image, image_index=0, stage="image", decision="block",
                                 category="demo_forbidden", score=0.7, reason="star 0.70")
    return job


def within_viewport(page, selector: str) -> dict:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, f"{selector} is not rendered"
    assert box["x"] >= 0 and box["x"] + box["width"] <= WIDE["width"], (selector, box)
    return box


def rendered(page, selector: str) -> dict:
    # The element is in the DOM before its bytes arrive: wait until the browser has finished with
    # the image (loaded or failed: `complete` is true either way), then read what it rendered.
    page.wait_for_function("s => { const img = document.querySelector(s); return img && img.complete; }",
                           arg=selector)
    return page.eval_on_selector(selector, """img => ({
        width: img.getBoundingClientRect().width, height: img.getBoundingClientRect().height,
        natural: img.naturalWidth, loaded: img.complete && img.naturalWidth > 0,
        rendering: getComputedStyle(img).imageRendering})""")


def test_a_moderator_decides_cases_from_their_pages(daphne_server, alice, moderator, browser_page, errors):  # noqa: F811
    page, server = browser_page, daphne_server
    page.set_viewport_size(WIDE)
    appeal = appealed_image_block(alice, minutes_ago=40)
    to_approve = held_image_case(alice, minutes_ago=30)
    to_reject = held_image_case(alice, minutes_ago=20)
    GenerationJob.objects.filter(id=to_reject.id).update(prompt="a pink heart with a long prompt that wraps " * 3)
    held_prompt_case(alice, minutes_ago=10)

    sign_in_to_admin(page, server, moderator)
    summary = page.locator(".review-summary")
    assert summary.get_attribute("data-open-cases") == "4"
    assert "4 open cases" in summary.text_content()
    screenshot(page, "admin_review_index")

    # The list at 1280 px: every row's thumbnail and the owner column are on screen.
    page.click(".review-summary a")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 4
    within_viewport(page, "#result_list th.column-thumbnails")
    within_viewport(page, "#result_list th.column-owner")
    within_viewport(page, "#result_list td.field-owner")
    thumb = within_viewport(page, "#result_list img.review-thumb")
    assert thumb["width"] >= 64
    assert rendered(page, "#result_list img.review-thumb")["loaded"]
    screenshot(page, "admin_review_list")
    # No column is cut off: the table fits its box, no horizontal scrolling.
    widths = page.eval_on_selector("#changelist .results", """box => ({scroll: box.scrollWidth, client: box.clientWidth,
        columns: [...box.querySelectorAll('thead th')].map(th => [th.className, Math.round(th.getBoundingClientRect().width)])})""")
    assert widths["scroll"] <= widths["client"], widths
    within_viewport(page, "#result_list th.column-waiting")

    # A case's page: the image large enough to judge, unsmoothed; Approve with a note.
    page.goto(f"{server.url}/admin/safety/reviewcase/{to_approve.id}/change/")
    image = rendered(page, "img.review-large")
    assert image["loaded"] and image["natural"] == 64
    assert image["width"] >= 256 and image["height"] >= 256 and image["rendering"] == "pixelated"
    assert page.locator("input[name=_save]").count() == 0  # nothing to save: decide or leave
    assert page.get_by_role("button", name="Approve").is_visible()
    assert page.get_by_role("button", name="Reject with note").is_visible()
    screenshot(page, "admin_review_case", full_page=True)
    page.get_by_label("Note").fill("A heart shape is fine.")
    page.get_by_role("button", name="Approve").click()
    page.wait_for_selector(".review-decided")
    assert "Approved" in page.locator(".messagelist").text_content()
    assert "done" in page.locator(".review-decided").text_content()
    assert page.get_by_role("button", name="Approve").count() == 0
    job = GenerationJob.objects.get(id=to_approve.id)
    assert job.status == "done" and job.images.get().tier == "public"
    assert SafetyVerdict.objects.get(job=job, stage="human").notes == "A heart shape is fine."
    screenshot(page, "admin_review_approved")

    # Reject with note: without a note nothing is decided; with one, the user reads it.
    page.goto(f"{server.url}/admin/safety/reviewcase/{to_reject.id}/change/")
    page.get_by_role("button", name="Reject with note").click()
    page.wait_for_selector(".messagelist .error")
    assert "needs a note" in page.locator(".messagelist").text_content()
    assert GenerationJob.objects.get(id=to_reject.id).status == "review"
    page.get_by_label("Note").fill("The heart is drawn as an anatomical organ.")
    page.get_by_role("button", name="Reject with note").click()
    page.wait_for_selector(".review-decided")
    assert "Rejected" in page.locator(".messagelist").text_content()
    job = GenerationJob.objects.get(id=to_reject.id)
    assert (job.status, job.blocked_stage, job.reason) == ("blocked", "human", "The heart is drawn as an anatomical organ.")
    assert job.images.get().tier == "quarantine"
    screenshot(page, "admin_review_rejected")

    # An appeal of an image block, overturned: the image is delivered.
    page.goto(f"{server.url}/admin/safety/reviewcase/{appeal.id}/change/")
    assert "It is a plain circle." in page.locator(".review-decision").text_content()
    page.get_by_label("Note").fill("A plain circle, the gate misread it.")
    page.get_by_role("button", name="Approve").click()
    page.wait_for_selector(".review-decided")
    assert "Appeal overturned" in page.locator(".messagelist").text_content()
    job = GenerationJob.objects.get(id=appeal.id)
    assert (job.status, job.appeal_outcome) == ("done", "overturned") and job.images.get().tier == "public"
    screenshot(page, "admin_review_appeal_overturned")

    # The case is decided once: the other door (the API) answers 409, the page says so.
    from tests.conftest import client_for

    assert client_for(moderator).post(f"/api/v1/review/{appeal.id}/decision", {"decision": "reject", "note": "no"},
                                      format="json").status_code == 409

    page.goto(server.url + "/admin/")
    assert page.locator(".review-summary").get_attribute("data-open-cases") == "1"


def test_an_appeal_overturned_then_blocked_again_is_back_and_its_moderator_is_told(
    daphne_server, alice, moderator, browser_page, errors,  # noqa: F811
):
    from jobs.actions import review
    from jobs.actions.lifecycle import move

    page, server = browser_page, daphne_server
    page.set_viewport_size(WIDE)
    case = appealed_prompt_block(alice, minutes_ago=30)
    # Status events are sent from a thread of its own (Playwright's loop runs in this one).
    off_the_page_loop(review.decide, case.id, "approve", moderator, "a plain shape")
    # Generated, then the image gate blocked it at publish (the move finish_batch makes).
    GenerationJob.objects.filter(id=case.id).update(stage="publish", status="running")
    quarantined_image(case)
    off_the_page_loop(lambda: move(case.id, "publish", "blocked", blocked_stage="image",
                                   reason="This image looks like a star."))
    assert GenerationJob.objects.get(id=case.id).appeal_outcome == ""  # open again

    sign_in_to_admin(page, server, moderator)
    told = page.locator(".review-summary .review-again")
    assert told.count() == 1 and "An appeal you overturned was blocked again" in told.text_content()
    screenshot(page, "admin_review_blocked_again_index")
    told.locator("a").click()
    page.wait_for_selector(".review-case")
    assert page.locator(".review-case").get_attribute("data-case-kind") == "reopened_appeal"
    assert "the user's appeal is open again" in page.locator(".review-again").text_content()
    assert rendered(page, "img.review-large")["width"] >= 256
    screenshot(page, "admin_review_blocked_again_case", full_page=True)
