"""The page offers what the API offers, in Debian's chromium (Playwright) against daphne and
real workers: the model and the quality tier (with each one's steps, the wait estimate and the
quota the priority draws on), the priority, the revised prompt when a job has one, and a
"verify" link per image that shows its content credentials. Each choice reaches the job.
Screenshots of each state go to test-artifacts/ (docs/screenshots/ with IMAGEGEN_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.conf import settings

from jobs.api.openai.compat import steps_for, variant_for
from jobs.models import GenerationJob
from scheduling.lanes import gpu_queue, lane_of
from tests.browser import screenshot, sign_in
from tests.live_server import start_daphne, stop_daphne
from tests.test_served_models import FAST, fast_model  # noqa: F401  (the fixture)
from tests.test_web_page import browser_page  # noqa: F401  (the fixture)
from tests.test_web_states import errors  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def two_model_server(fast_model, workers, worker_env, start_worker):  # noqa: F811
    """daphne and a GPU worker that serve the default model and a second one (tiny-fast)."""
    extra = f"{FAST}={fast_model}"
    worker = start_worker("gpu-page", f"{settings.QUEUE_GPU},{gpu_queue(lane_of(FAST))}", IMAGEGEN_EXTRA_MODELS=extra)
    server = start_daphne({**worker_env, "IMAGEGEN_EXTRA_MODELS": extra}, Path(settings.VAR_DIR), name="daphne-two-models")
    yield server
    stop_daphne(server)
    worker.stop()


def form_shot(page, name: str) -> None:
    """The form card alone (a small PNG)."""
    screenshot(page, name, full_page=True, clip=page.locator("#generate").locator("xpath=..").bounding_box())


def latest(user) -> GenerationJob:
    return GenerationJob.objects.filter(owner=user).latest("created_at")


def wait_done(page) -> None:
    page.wait_for_function("document.getElementById('current-status').textContent === 'done'", timeout=60_000)
    page.wait_for_selector("#results img.final")


def test_model_quality_and_priority_reach_the_job_with_what_each_costs(two_model_server, alice, browser_page, errors):  # noqa: F811
    page = browser_page
    sign_in(page, two_model_server, alice)
    info = page.locator("#choice-info")
    # The estimate and the quota arrive from the API: the hint says what the default costs.
    page.wait_for_function("/ready in|No GPU worker/.test(document.getElementById('choice-time').textContent)")
    page.wait_for_function("/of your \\d+ interactive images a day/.test(document.getElementById('choice-cost').textContent)")
    default_steps = settings.IMAGEGEN_DEFAULT_STEPS
    assert f"{default_steps} steps per image" in info.text_content()
    assert [o for o in page.locator("#model option").all_text_contents()] == [settings.IMAGEGEN_MODEL_VERSION, "fast"]
    assert page.locator("#quality option").all_text_contents() == ["Default", "Low", "Medium", "High"]
    form_shot(page, "choices")

    # The second model at its high tier, as batch work: its steps in the form and in the hint.
    page.get_by_label("Prompt", exact=True).fill("a green square")
    page.get_by_label("Model").select_option(FAST)
    page.get_by_label("Quality").select_option("high")
    high_fast = steps_for("high", FAST)
    assert page.input_value("#steps") == str(high_fast) == "4"
    page.get_by_label("Priority").select_option("batch")
    page.wait_for_function("/of your \\d+ batch images a day/.test(document.getElementById('choice-cost').textContent)")
    assert info.get_attribute("data-model") == FAST and info.get_attribute("data-steps") == "4"
    assert "fast, high quality: 4 steps per image" in info.text_content()
    form_shot(page, "choice_fast_high_batch")
    page.get_by_role("button", name="Generate").click()
    wait_done(page)
    job = latest(alice)
    assert (job.model_version, job.steps, job.priority, job.scheduler) == (FAST, 4, "batch", variant_for("high", FAST))

    # The default model at its low tier: the tier's steps and its levers reach the job.
    page.get_by_label("Model").select_option(settings.IMAGEGEN_MODEL_VERSION)
    page.get_by_label("Quality").select_option("low")
    page.get_by_label("Priority").select_option("interactive")
    low = steps_for("low", settings.IMAGEGEN_MODEL_VERSION)
    assert page.input_value("#steps") == str(low)
    levers = variant_for("low", settings.IMAGEGEN_MODEL_VERSION)
    assert levers and f"({levers})" in info.text_content()
    page.get_by_role("button", name="Generate").click()
    page.wait_for_function(f"window.imagegen.current.job && window.imagegen.current.job.id !== '{job.id}'")
    wait_done(page)
    job = latest(alice)
    assert (job.model_version, job.steps, job.priority, job.scheduler) == (settings.IMAGEGEN_MODEL_VERSION, low, "interactive", levers)


def test_verify_shows_the_signer_what_was_asserted_and_that_it_verifies(workers, daphne_server, alice, browser_page, errors):  # noqa: F811
    page = browser_page
    sign_in(page, daphne_server, alice)
    page.get_by_label("Prompt", exact=True).fill("a red circle on a blue background")
    page.get_by_label("Seed").fill("31")
    page.get_by_label("Format").select_option("jpeg")
    page.get_by_role("button", name="Generate").click()
    wait_done(page)
    job = latest(alice)
    page.locator("#results a.verify").first.click()
    panel = page.locator("#results .credentials").first
    page.wait_for_function("document.querySelector('#results .credentials').dataset.state === 'Trusted'")
    text = panel.text_content()
    assert "✓ Verified" in text and "Signed by" in text
    assert "c2pa.created" in text and "trainedAlgorithmicMedia" in text and f"by {job.model_version}" in text
    assert str(job.id) in text and "31" in text  # the request's parameters, as asserted
    screenshot(page, "verified", full_page=True, clip=page.locator("#current").bounding_box())

    # The gallery's copy of the link checks the same file.
    tile = page.locator(f".gallery .tile[data-job='{job.id}']")
    tile.locator("a.verify").click()
    page.wait_for_function(f"document.querySelector(\".tile[data-job='{job.id}'] .credentials\").dataset.state === 'Trusted'")


def test_a_revised_prompt_in_the_job_is_shown_beside_the_prompt(workers, daphne_server, alice, browser_page, errors):  # noqa: F811
    """The native API does not rewrite prompts today (its jobs carry no revised_prompt); the page
    shows one when the job JSON has it. The server's answers are real, with the field added."""
    page = browser_page
    sign_in(page, daphne_server, alice)
    revised = "a red circle, centred, on a flat blue background"

    def add_revised(route):
        response = route.fetch()
        try:
            data = response.json()
        except ValueError:
            return route.fulfill(response=response)
        for job in data.get("results", [data]) if isinstance(data, dict) else []:
            if isinstance(job, dict) and "prompt" in job:
                job["revised_prompt"] = revised
        route.fulfill(response=response, body=json.dumps(data), headers={**response.headers, "content-type": "application/json"})

    page.route("**/api/v1/jobs**", add_revised)   # the submit and every poll of the job
    page.get_by_label("Prompt", exact=True).fill("a red circle")
    page.get_by_role("button", name="Generate").click()
    page.wait_for_selector("#current-revised:not([hidden])")
    # it stays through the job's events (they carry the status, not the prompts)
    page.wait_for_function("document.getElementById('current-status').textContent === 'done'", timeout=60_000)
    assert page.locator("#current-revised-text").text_content() == revised
    assert page.locator("#current-revised").is_visible()
    wait_done(page)
    page.wait_for_selector(".gallery .tile-revised")
    assert page.locator(".gallery .tile-revised").first.text_content() == f"revised: {revised}"
    screenshot(page, "revised_prompt", full_page=True, clip=page.locator("#current").bounding_box())
