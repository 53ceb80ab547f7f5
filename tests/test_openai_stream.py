"""`stream: true` on the OpenAI-compatible route, consumed by the official `openai` client
(unmodified) against a live daphne with real workers: gated previews as partial images, one
completed event per image, refusals as an error event the client raises; quality tiers,
output formats, moderation details and JSON 404s under /v1."""

from __future__ import annotations

import base64
import hashlib
import io
import json

import httpx
import openai
import pytest
from PIL import Image
from rest_framework.test import APIClient

from jobs.media.encoding import read_parameters
from tests.conftest import make_user

PROMPT = "a red circle on a blue background"
MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "jpeg": b"\xff\xd8\xff"}

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def oai(daphne_server, workers, alice):
    return openai.OpenAI(base_url=f"{daphne_server.url}/v1", api_key=alice.auth_token.key, max_retries=0, timeout=90)


def is_format(data: bytes, fmt: str) -> bool:
    if fmt == "webp":
        return data[:4] == b"RIFF" and data[8:12] == b"WEBP"
    return data.startswith(MAGIC[fmt])


def test_the_official_client_streams_gated_previews_then_the_completed_images(oai, classifier_mode):
    from openai.types import ImageGenCompletedEvent, ImageGenPartialImageEvent

    from jobs.models import GenerationJob

    stream = oai.images.generate(prompt=PROMPT, size="64x64", n=2, quality="high", output_format="webp",
                                 output_compression=80, partial_images=2, stream=True)
    events = list(stream)
    partials = [e for e in events if isinstance(e, ImageGenPartialImageEvent)]
    completed = [e for e in events if isinstance(e, ImageGenCompletedEvent)]
    assert [type(e) for e in events] == [ImageGenPartialImageEvent] * len(partials) + [ImageGenCompletedEvent] * 2
    # Previews come every 4 steps at most every 0.25 s: over 40 steps ("high") at least one is past
    # the first threshold (step 14); never more than asked for.
    assert 1 <= len(partials) <= 2
    assert [p.partial_image_index for p in partials] == list(range(len(partials)))
    for p in partials:
        assert (p.type, p.size, p.output_format, p.quality, p.background) == (
            "image_generation.partial_image", "64x64", "webp", "high", "opaque")
        data = base64.b64decode(p.b64_json)
        assert is_format(data, "webp")
        with Image.open(io.BytesIO(data)) as im:
            assert max(im.size) <= 128
    job = GenerationJob.objects.filter(owner__username="alice").latest("created_at")
    assert job.steps == 40 and job.status == "done" and job.output_format == "webp"
    stored = {im.index: im for im in job.images.all()}
    for index, event in enumerate(completed):
        assert (event.type, event.size, event.output_format) == ("image_generation.completed", "64x64", "webp")
        assert event.usage.input_tokens == event.usage.input_tokens_details.text_tokens == len(PROMPT.split())
        data = base64.b64decode(event.b64_json)
        assert is_format(data, "webp")
        assert hashlib.sha256(data).hexdigest() == stored[index].sha256  # the delivered file itself
        assert read_parameters(data)["Seed"] == str(job.seed + index)


def test_a_blocked_prompt_arrives_as_an_error_event_the_client_raises(oai):
    stream = oai.images.generate(prompt="a yellow star", size="64x64", partial_images=1, stream=True)
    with pytest.raises(openai.APIError) as raised:
        list(stream)
    error = raised.value
    assert not isinstance(error, openai.APIStatusError)  # the stream had started: an event, not a status
    assert error.code == "moderation_blocked" and error.param == "prompt"
    assert error.body["moderation_details"]["stage"] == "input"
    assert error.body["moderation_details"]["categories"]  # the policy's category that stopped it


def test_a_preview_the_image_gate_blocks_never_reaches_the_stream(oai, classifier_mode):
    classifier_mode('json:{"star": 0.99}')  # every picture, previews included, is judged a star
    stream = oai.images.generate(prompt=PROMPT, size="64x64", quality="high", partial_images=3, stream=True)
    seen = []
    with pytest.raises(openai.APIError) as raised:
        for event in stream:
            seen.append(event)
    assert seen == []  # no partial image: the gate judged each preview and withheld it
    assert raised.value.code == "moderation_blocked"
    details = raised.value.body["moderation_details"]
    assert details["stage"] == "output" and details["categories"]


def test_stream_without_partial_images_and_each_output_format_without_streaming(oai, daphne_server):
    from openai.types import ImageGenCompletedEvent

    events = list(oai.images.generate(prompt=PROMPT, size="96x64", output_format="jpeg", stream=True))
    assert len(events) == 1 and isinstance(events[0], ImageGenCompletedEvent)
    assert is_format(base64.b64decode(events[0].b64_json), "jpeg")

    for fmt in ("png", "jpeg", "webp"):
        result = oai.images.generate(prompt=PROMPT, size="64x64", output_format=fmt, quality="low")
        assert result.output_format == fmt and result.size == "64x64"
        url = result.data[0].url
        assert url.endswith("." + fmt)
        fetched = httpx.get(url, timeout=10)
        assert fetched.status_code == 200 and fetched.headers["content-type"] == f"image/{fmt}"
        assert is_format(fetched.content, fmt)
        assert read_parameters(fetched.content)["Steps"] == "8"  # quality low


# --- in-process: no workers needed ------------------------------------------------------------


@pytest.fixture
def dave_bearer(transactional_db):
    dave = make_user("dave")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {dave.auth_token.key}")
    return client


def test_unknown_routes_under_v1_answer_openai_shaped_json(dave_bearer):
    for method, path in (("get", "/v1/nope"), ("post", "/v1/images/edits"), ("get", "/v1/")):
        response = getattr(dave_bearer, method)(path)
        assert response.status_code == 404 and response["Content-Type"] == "application/json"
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "unknown_url"
        assert path in error["message"]
    assert APIClient().get("/v1/nothing/here").json()["error"]["code"] == "unknown_url"  # no key: still JSON
    strict = APIClient(enforce_csrf_checks=True)  # a POST without a CSRF token (any API client's)
    assert strict.post("/v1/0", {}, format="json").status_code == 404


def test_bad_stream_and_format_options_are_400_naming_the_field(dave_bearer):
    for body, param in (
        ({"partial_images": 4, "stream": True}, "partial_images"),
        ({"output_format": "gif"}, "output_format"),
        ({"output_compression": 101, "output_format": "jpeg"}, "output_compression"),
        ({"quality": "ultra"}, "quality"),
        ({"background": "transparent"}, "background"),
    ):
        response = dave_bearer.post("/v1/images/generations", {"prompt": PROMPT, **body}, format="json")
        assert response.status_code == 400, body
        assert response.json()["error"]["param"] == param, response.json()


def test_quality_maps_to_the_documented_step_tiers(dave_bearer, settings):
    from jobs.models import GenerationJob

    settings.IMAGEGEN_OPENAI_WAIT_SECONDS = 0.05  # the job is never run here: only its row matters
    for quality, steps in (("low", 8), ("medium", 20), ("standard", 20), ("high", 40), ("hd", 40),
                           ("auto", settings.IMAGEGEN_DEFAULT_STEPS)):
        response = dave_bearer.post("/v1/images/generations", {"prompt": PROMPT, "quality": quality}, format="json")
        assert response.status_code == 504, response.content
        job_id = json.loads(response.content)["error"]["message"].split()[1]
        assert GenerationJob.objects.get(id=job_id).steps == steps, quality
