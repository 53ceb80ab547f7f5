"""The end users' page at its edges (issue 45, items 4 and 5), in Debian's chromium (Playwright)
against daphne and real workers: a Verify panel stays open when the results render again and
reads in words in a gallery tile; the form at 1280 px (whole select values, no blank gap, a
summary that never repeats an invalid value, the negative prompt off for a model that takes
none, a favicon); a held job comes back on reload, reads as information, and a rejection is not
shown as a success; the appeal note is shown back; a gallery tile's progress follows the job."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.conf import settings

from jobs.models import GenerationJob
from tests.browser import screenshot, sign_in
from tests.live_server import start_daphne, stop_daphne
from tests.test_web_page import browser_page  # noqa: F401  (the fixture)
from tests.test_web_states import errors, off_the_page_loop  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"done", "blocked", "failed", "cancelled"}
DANGER = "rgb(180, 35, 24)"  # app.css --danger
OK_GREEN = "rgb(6, 118, 71)"  # app.css --ok
ERROR_BACKGROUND = "rgb(254, 243, 242)"  # app.css, the error boxes' background
JOB_URL = re.compile(r"/api/v1/jobs/[0-9a-f-]{36}$")

# Records each API answer the page has read (after its JSON is parsed, so before the page acts on
# it): a test waits for "the page has the answer" on this, then lets the page's task finish.
ANSWERS = """
(() => {
  window.__answered = [];
  const json = Response.prototype.json;
  Response.prototype.json = function () {
    const url = this.url;
    return json.call(this).then((value) => { window.__answered.push(url); return value; });
  };
})();
"""


def answered(page, pattern: str) -> int:
    return page.evaluate(f"window.__answered.filter((u) => /{pattern}/.test(u)).length")


def settle(page) -> None:
    """The page's pending promise callbacks run (a render after an answer it has read)."""
    page.evaluate("() => new Promise((resolve) => setTimeout(resolve, 0))")


def until(page, predicate, what: str, timeout_ms: int = 30_000):
    """predicate()'s first truthy value, checked while Playwright delivers the page's events
    (its route handlers run only while the test waits in a Playwright call)."""
    for _ in range(timeout_ms // 50):
        found = predicate()
        if found:
            return found
        page.wait_for_timeout(50)
    raise AssertionError(f"{what}: not seen within {timeout_ms / 1000:g} s")


def latest_job(user) -> GenerationJob:
    return GenerationJob.objects.filter(owner=user).latest("created_at")


def color(page, selector: str, prop: str = "color") -> str:
    return page.evaluate(f"getComputedStyle(document.querySelector({selector!r})).{prop}")


@pytest.fixture
def shapes_server(worker_env):
    """A web server whose catalogue is the shipped one: shapes-v2, its distilled student (which
    takes no negative prompt) and shapes-v1-lcm, the students with their long labels."""
    models = ROOT / "models"
    if not all((models / name / "model_index.json").exists() for name in ("shapes-v2", "shapes-v2-lcm", "shapes-v1-lcm")):
        pytest.skip("the shipped models are missing")
    server = start_daphne({
        **worker_env, "IMAGEGEN_MODEL_PATH": str(models / "shapes-v2"), "IMAGEGEN_MODEL_VERSION": "shapes-v2",
        "IMAGEGEN_EXTRA_MODELS": f"shapes-v2-lcm={models / 'shapes-v2-lcm'},shapes-v1-lcm={models / 'shapes-v1-lcm'}",
    }, Path(settings.VAR_DIR), name="daphne-shapes")
    yield server
    stop_daphne(server)


def test_the_form_at_1280_px_shows_whole_values_no_gap_no_invalid_summary_and_no_favicon_404(
    shapes_server, alice, browser_page, errors,  # noqa: F811
):
    from django.test import Client

    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 900})
    console: list[str] = []
    page.on("console", lambda message: console.append(message.text) if message.type == "error" else None)
    # Straight to the page with a session (the browser asks for a site's icon once: on the page
    # it sees first).
    client = Client()
    client.force_login(alice)
    page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": shapes_server.url}])
    page.goto(shapes_server.url + "/")
    page.wait_for_load_state("networkidle")
    page.wait_for_function("/ready in|No GPU worker/.test(document.getElementById('choice-time').textContent)")
    # The favicon: the browser logged no 404 for it; it is linked and served.
    assert [text for text in console if "404" in text] == []
    icon = page.locator("link[rel=icon]").get_attribute("href")
    answer = page.request.get(shapes_server.url + icon)
    assert answer.status == 200 and answer.headers["content-type"].startswith("image/")
    answer = page.request.get(shapes_server.url + "/favicon.ico")  # asked for by pages that link none
    assert answer.status == 200 and answer.headers["content-type"].startswith("image/")

    # Every option of the model and priority selects fits its box (the text's width against the
    # select's inner width less its arrow), as does the chosen value of every other select.
    too_wide = page.evaluate("""() => {
      const canvas = document.createElement('canvas').getContext('2d');
      const out = [];
      for (const select of document.querySelectorAll('#generate select')) {
        const style = getComputedStyle(select);
        canvas.font = style.font;
        const room = select.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight) - 20;
        const all = ['model', 'priority'].includes(select.id);
        for (const option of (all ? [...select.options] : [select.selectedOptions[0]])) {
          const width = canvas.measureText(option.text).width;
          if (width > room) out.push(`${select.id}: "${option.text}" needs ${Math.ceil(width)} px, has ${Math.floor(room)}`);
        }
        if (select.scrollWidth > select.clientWidth) out.push(`${select.id} scrolls`);
      }
      return out;
    }""")
    assert too_wide == []
    assert page.locator("#model option").all_text_contents() == [
        "shapes-v2", "shapes-v1-lcm (distilled, 1 step)", "shapes-v2-lcm (distilled, 4 steps)"]

    # No blank band above "Rewrite my prompt": it starts right below the row before it.
    gap = page.evaluate("""() => {
      const rewrite = document.getElementById('rewrite').closest('div').getBoundingClientRect();
      const above = [...document.querySelectorAll('#generate .row > div')]
        .map((d) => d.getBoundingClientRect()).filter((r) => r.bottom <= rewrite.top + 1);
      const lowest = Math.max(...above.map((r) => r.bottom));
      const label = document.querySelector('label[for=rewrite]').getBoundingClientRect();
      return {box: rewrite.top - lowest, label: label.top - lowest};
    }""")
    assert gap["label"] <= 24, gap

    # The summary never states an invalid value: 500 steps is over the model's 150.
    page.get_by_label("Prompt", exact=True).fill("a red circle")
    work = page.locator("#choice-work")
    assert "12 steps per image" in work.text_content()  # the form opens at the model's own steps
    page.get_by_label("Steps", exact=True).fill("500")
    page.wait_for_function("/12 to 150 steps/.test(document.getElementById('choice-work').textContent)")
    assert "500" not in work.text_content()
    page.get_by_role("button", name="Generate").click()
    page.wait_for_selector("#steps-error:not([hidden])")
    assert "500" not in work.text_content() and "500" not in page.locator("#choice-info").text_content()
    page.get_by_label("Images", exact=True).fill("99")
    assert "99" not in page.locator("#choice-info").text_content()
    page.get_by_label("Steps", exact=True).fill("20")
    page.get_by_label("Images", exact=True).fill("2")
    page.wait_for_function("/\\b20 steps per image/.test(document.getElementById('choice-work').textContent)")

    # A model that takes no negative prompt: the field is off and says why; back on for one that does.
    negative = page.locator("#negative_prompt")
    assert negative.is_enabled()
    negative.fill("blurry")
    page.get_by_label("Model").select_option("shapes-v2-lcm")
    assert negative.is_disabled()
    note = page.locator("#negative_prompt-note")
    assert note.is_visible() and "no negative prompt" in note.text_content()
    screenshot(page, "form_1280", full_page=True, clip=page.locator("#generate").locator("xpath=..").bounding_box())
    page.get_by_label("Model").select_option("shapes-v2")
    assert negative.is_enabled() and note.is_hidden() and negative.input_value() == "blurry"
    page.screenshot(path=str(ROOT / "test-artifacts" / "form_1280_full.png"), full_page=True)


def test_verify_panels_stay_open_when_the_results_render_again_and_read_in_words_in_a_tile(
    workers, daphne_server, alice, browser_page, errors,  # noqa: F811
):
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 900})
    page.add_init_script(ANSWERS)

    # The job's socket closes right after its final status, before the page has fetched the
    # finished job (a proxy, a quick server): the page then polls the job as well, and each
    # answer renders the results again. From the final status on, the job's fetches are held:
    # the first (the results appear), then, once the Verify panel is open, the polls.
    hold = {"on": False, "routes": []}

    def proxy(ws):
        server = ws.connect_to_server()

        def down(message):
            try:
                event = json.loads(message)
            except ValueError:
                event = {}
            final = event.get("type") == "status" and event.get("status") in TERMINAL
            hold["on"] = hold["on"] or final
            ws.send(message)
            if final:
                ws.close()

        server.on_message(down)
        ws.on_message(lambda message: server.send(message))

    def job_get(route):
        if hold["on"] and route.request.method == "GET":
            hold["routes"].append(route)
        else:
            route.continue_()

    page.route_web_socket(re.compile(r"/ws/jobs/"), proxy)
    page.route(JOB_URL, job_get)
    sign_in(page, daphne_server, alice)
    page.get_by_label("Prompt", exact=True).fill("a red circle on a blue background")
    page.get_by_role("button", name="Generate").click()
    until(page, lambda: len(hold["routes"]) >= 2, "the fetch after the final status and a poll after the socket closed",
          timeout_ms=60_000)
    hold["routes"].pop(0).continue_()
    page.wait_for_selector("#results img.final")
    job = latest_job(alice)
    page.locator("#results a.verify").first.click()
    page.wait_for_function("document.querySelector('#results .credentials').dataset.state === 'Trusted'")
    before = answered(page, str(job.id) + "$")
    held, hold["routes"], hold["on"] = hold["routes"], [], False
    for route in held:
        route.continue_()
    page.wait_for_function(f"window.__answered.filter((u) => u.endsWith('{job.id}')).length >= {before + len(held)}")
    settle(page)
    panel = page.locator("#results .credentials").first
    assert panel.is_visible() and panel.get_attribute("data-state") == "Trusted"

    # The gallery's tile: the panel in words, no column one character wide, a bounded height; and
    # it stays open when the gallery loads again.
    tile = page.locator(f".gallery .tile[data-job='{job.id}']")
    tile.locator("a.verify").click()
    page.wait_for_function(f"document.querySelector(\".tile[data-job='{job.id}'] .credentials\").dataset.state === 'Trusted'")
    tile_panel = tile.locator(".credentials")
    labels = tile_panel.locator("dt").all_text_contents()
    assert labels and not [label for label in labels if re.search(r"[a-z][A-Z]", label)], labels
    assert "Guidance scale" in tile_panel.text_content() and "Signed by" in labels
    narrow = page.evaluate(f"""() => [...document.querySelectorAll(".tile[data-job='{job.id}'] .credentials :is(dd, dt, p)")]
      .filter((node) => node.getClientRects().length && node.getBoundingClientRect().width < 60)
      .map((node) => node.textContent)""")
    assert narrow == []
    assert tile.bounding_box()["height"] <= 900, tile.bounding_box()  # it was 1,700
    tile.scroll_into_view_if_needed()
    screenshot(page, "verify_tile", clip=tile.bounding_box())
    before = answered(page, "page_size")
    page.get_by_role("button", name="Refresh").click()
    page.wait_for_function(f"window.__answered.filter((u) => /page_size/.test(u)).length > {before}")
    settle(page)
    assert tile.locator(".credentials").is_visible()


def test_a_held_job_comes_back_on_reload_reads_as_information_and_a_rejection_is_not_green(
    workers, daphne_server, alice, moderator, browser_page, errors, classifier_mode,  # noqa: F811
):
    from jobs.actions import reject

    page = browser_page
    sign_in(page, daphne_server, alice)
    classifier_mode('json:{"heart": 0.8}')  # the image gate holds every image for review
    prompt = "a pink heart on a white background"
    page.get_by_label("Prompt", exact=True).fill(prompt)
    page.get_by_role("button", name="Generate").click()
    page.wait_for_function("document.getElementById('current-status').textContent === 'review'", timeout=60_000)
    classifier_mode(None)
    job = latest_job(alice)

    def held_reads_as_information():
        assert page.locator("#current-reason").text_content().startswith("Held for review:")
        assert color(page, "#current-reason") != DANGER
        assert color(page, "#current-reason", "backgroundColor") != ERROR_BACKGROUND

    held_reads_as_information()
    page.reload()
    page.wait_for_selector("#current:not([hidden])")
    page.wait_for_function("document.getElementById('current-status').textContent === 'review'")
    assert page.locator("#current-prompt").text_content() == prompt
    held_reads_as_information()
    tile_reason = page.locator(f".gallery .tile[data-job='{job.id}'] .tile-reason")
    tile_reason.wait_for()
    assert tile_reason.evaluate("(node) => getComputedStyle(node).color") != DANGER
    screenshot(page, "held_after_reload")

    off_the_page_loop(reject, job, moderator, "not this time")
    page.wait_for_function("document.getElementById('current-status').textContent === 'blocked'")
    page.wait_for_selector("#decision:not([hidden])")
    assert page.locator("#decision").text_content() == "A moderator decided: not approved."
    assert color(page, "#decision") != OK_GREEN
    assert color(page, "#decision", "backgroundColor") != "rgb(236, 253, 243)"  # the success green's background

    # The appeal: a placeholder about this job (not another shape's), the note shown back, also
    # after a reload (a pending appeal is still the current job).
    placeholder = page.locator("#appeal-note").get_attribute("placeholder")
    assert "circle" not in placeholder and "heart" in placeholder, placeholder
    note = "It is a plain heart shape, nothing else."
    page.get_by_label("Ask a moderator to look again").fill(note)
    page.get_by_role("button", name="Appeal").click()
    page.wait_for_selector("#appeal-box", state="hidden")
    sent = page.locator("#appeal-sent")
    sent.wait_for()
    assert note in sent.text_content()
    screenshot(page, "appeal_note_shown")
    page.reload()
    page.wait_for_selector("#appeal-sent:not([hidden])")
    assert note in sent.text_content() and page.locator("#current-status").text_content() == "blocked"


def test_a_gallery_tile_follows_the_jobs_progress_and_a_running_job_comes_back_on_reload(
    workers, daphne_server, alice, browser_page, errors,  # noqa: F811
):
    page = browser_page
    sign_in(page, daphne_server, alice)
    # The most work one job may ask, cancelled once what the test waits for is seen.
    page.get_by_label("Prompt", exact=True).fill("a slow blue square")
    page.get_by_label("Size").select_option("96x96")
    page.get_by_label("Steps", exact=True).fill(str(settings.IMAGEGEN_MAX_STEPS))
    page.get_by_label("Images", exact=True).fill("4")
    page.get_by_role("button", name="Generate").click()
    page.wait_for_function("document.getElementById('current-status').textContent === 'running'", timeout=60_000)
    job = latest_job(alice)
    thumbs = f".gallery .tile[data-job='{job.id}'] .thumbs"
    page.wait_for_function(f"Number((document.querySelector(\"{thumbs}\") || {{dataset: {{}}}}).dataset.step) >= 3",
                           timeout=60_000)
    step = int(page.get_attribute(thumbs, "data-step"))
    assert page.locator(thumbs).text_content() == f"running {step}/{settings.IMAGEGEN_MAX_STEPS}"
    current = int(page.evaluate("document.getElementById('progress').value"))
    assert current >= step

    page.reload()  # the running job is the current job again, and its tile goes on following it
    page.wait_for_selector("#current:not([hidden])")
    page.wait_for_function("document.getElementById('current-status').textContent === 'running'")
    assert page.locator("#current-prompt").text_content() == "a slow blue square"
    page.wait_for_function(f"Number(document.querySelector(\"{thumbs}\").dataset.step) > {step}", timeout=60_000)
    page.get_by_role("button", name="Cancel").click()
    page.wait_for_function("document.getElementById('current-status').textContent === 'cancelled'", timeout=60_000)
