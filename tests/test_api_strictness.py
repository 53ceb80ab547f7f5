"""Issue 45 item 6: the API refuses what it does not understand. A field an endpoint does not
take is a 400 naming it (the native API's `{field: [messages]}`, OpenAI's `unknown_parameter`
on /v1/images/generations); a value of the wrong JSON type is refused, never coerced (a number
as the prompt, "yes" as a boolean, "20" as a number). Black-box over the real routes: the DRF
test client, and the official `openai` package on an in-process transport (no server, no
workers: nothing here runs a job)."""

from __future__ import annotations

import httpx
import openai
import pytest
from django.conf import settings
from django.test import Client
from rest_framework.test import APIClient

from jobs.models import GenerationJob
from tests.conftest import make_user

pytestmark = pytest.mark.django_db  # not transactional: a submitted job's first stage is sent on commit, never here

PROMPT = "a red circle on a blue background"
# What the page posts (static/imagegen/form.js), every optional field included, and what the CLI
# posts (scripts/imagegen_cli.py): they stay accepted.
PAGE_BODY = {
    "prompt": PROMPT, "width": 64, "height": 64, "steps": 4, "count": 1, "output_format": "png",
    "priority": "interactive", "allow_degrade": False, "rewrite": "off", "quality": "medium",
    "negative_prompt": "blurry", "seed": 7, "guidance_scale": 7.5,
}
CLI_BODY = {"prompt": PROMPT, "count": 1, "width": 64, "height": 96, "negative_prompt": "blurry", "steps": 4,
            "seed": 11, "guidance_scale": 7}


@pytest.fixture
def dora(db):
    return make_user("dora")


@pytest.fixture
def native(dora):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {dora.auth_token.key}")
    return client


@pytest.fixture
def bearer(dora, settings):
    settings.IMAGEGEN_OPENAI_WAIT_SECONDS = 0.2  # a request let through answers a 504 at once, not after 120 s
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {dora.auth_token.key}")
    return client


class DjangoTransport(httpx.BaseTransport):
    """httpx requests answered by Django's test client: the app in this process, inside the
    test's transaction (a bare WSGI handler would close the test's connection after a request)."""

    def __init__(self) -> None:
        self.client = Client()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        skip = {"host", "content-length", "content-type"}
        answer = self.client.generic(
            request.method, request.url.raw_path.decode(), request.read(),
            content_type=request.headers.get("content-type", "application/octet-stream"),
            headers={k: v for k, v in request.headers.items() if k.lower() not in skip},
        )
        return httpx.Response(answer.status_code, headers=list(answer.headers.items()), content=answer.content)


@pytest.fixture
def oai(dora, settings):
    """The official client, talking to the Django app in this process."""
    settings.IMAGEGEN_OPENAI_WAIT_SECONDS = 0.2  # an accepted request answers the 504 naming its job
    return openai.OpenAI(base_url="http://testserver/v1", api_key=dora.auth_token.key, max_retries=0,
                         http_client=httpx.Client(transport=DjangoTransport()))


def submit(client, body):
    return client.post("/api/v1/jobs", body, format="json")


def messages(response, field: str) -> str:
    return " ".join(response.json()[field])


# --- native: unknown fields -------------------------------------------------------------------


def test_an_unknown_field_is_a_400_naming_it_and_nothing_is_made(native):
    response = submit(native, {"prompt": PROMPT, "size": "512x512"})
    assert response.status_code == 400, response.content
    assert set(response.json()) == {"size"}
    said = messages(response, "size").lower()
    assert "unknown field" in said and "width" in said and "height" in said  # what to send instead
    assert GenerationJob.objects.count() == 0


def test_every_unknown_field_is_named_along_with_the_other_field_errors(native):
    response = submit(native, {"prompt": PROMPT, "size": "64x64", "n": 2, "colour": "red", "steps": 0})
    assert response.status_code == 400
    errors = response.json()
    assert {"size", "n", "colour", "steps"} <= set(errors), errors
    assert "unknown field" in messages(response, "colour").lower()
    assert "count" in messages(response, "n")  # the native name of OpenAI's n
    assert "prompt" in messages(response, "colour")  # an unknown field lists what the request takes
    assert GenerationJob.objects.count() == 0


def test_a_response_only_field_sent_in_a_request_is_unknown(native):
    response = submit(native, {"prompt": PROMPT, "status": "done"})
    assert response.status_code == 400 and "status" in response.json()


def test_the_bodies_the_page_and_the_cli_send_are_accepted(native):
    for body in (PAGE_BODY, CLI_BODY, {"prompt": PROMPT, "seed": None, "allow_degrade": True, "cancel_after": 60,
                                       "webhook_url": "", "model": "", "output_format": "webp",
                                       "output_compression": 80, "priority": "batch"}):
        response = submit(native, body)
        assert response.status_code == 202, (body, response.content)


# --- native: types ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [42, 4.2, True, ["a red circle"], {"text": "a red circle"}])
def test_the_prompt_must_be_a_json_string(native, value):
    response = submit(native, {"prompt": value})
    assert response.status_code == 400, response.content
    assert "string" in messages(response, "prompt").lower()
    assert GenerationJob.objects.count() == 0


@pytest.mark.parametrize("field, value", [
    ("negative_prompt", 0), ("model", 1), ("webhook_url", ["https://example.com"]), ("quality", 1),
    ("output_format", True), ("priority", 0), ("rewrite", False),
])
def test_other_text_fields_must_be_json_strings(native, field, value):
    response = submit(native, {"prompt": PROMPT, field: value})
    assert response.status_code == 400, response.content
    assert field in response.json() and "string" in messages(response, field).lower()


@pytest.mark.parametrize("value", ["yes", "true", "false", 1, 0, "1", None])
def test_a_boolean_must_be_true_or_false(native, value):
    response = submit(native, {"prompt": PROMPT, "allow_degrade": value})
    assert response.status_code == 400, (value, response.content)
    assert "allow_degrade" in response.json()
    assert GenerationJob.objects.count() == 0


@pytest.mark.parametrize("field, value", [
    ("steps", "20"), ("count", "1"), ("seed", "5"), ("width", "64"), ("guidance_scale", "7.5"),
    ("output_compression", "80"), ("cancel_after", "60"), ("guidance_scale", True), ("steps", True),
    ("steps", [20]), ("steps", 20.5),
])
def test_a_number_must_be_a_json_number(native, field, value):
    response = submit(native, {"prompt": PROMPT, field: value})
    assert response.status_code == 400, (field, value, response.content)
    assert field in response.json()
    assert GenerationJob.objects.count() == 0


def test_an_integer_written_as_a_whole_json_number_is_an_integer(native):
    # JSON has one number type; 20.0 is the integer 20 (JSON Schema's "integer" says the same).
    response = submit(native, {"prompt": PROMPT, "steps": 20.0, "width": 64.0, "height": 64})
    assert response.status_code == 202, response.content
    assert response.json()["steps"] == 20


# --- other native bodies --------------------------------------------------------------------


def test_an_appeal_refuses_unknown_fields_and_a_note_that_is_not_text(native):
    job = submit(native, {"prompt": PROMPT}).json()
    unknown = native.post(f"/api/v1/jobs/{job['id']}/appeal", {"note": "a prop", "urgent": True}, format="json")
    assert unknown.status_code == 400 and "urgent" in unknown.json()
    wrong = native.post(f"/api/v1/jobs/{job['id']}/appeal", {"note": 42}, format="json")
    assert wrong.status_code == 400 and "note" in wrong.json()
    # Known fields pass the body check; this job is not blocked, which is what is refused then.
    fine = native.post(f"/api/v1/jobs/{job['id']}/appeal", {"note": "a prop"}, format="json")
    assert fine.status_code == 400 and fine.json()["status"] == "queued"


# --- the OpenAI-compatible route ------------------------------------------------------------


def test_an_unknown_parameter_is_answered_as_openai_does(bearer):
    response = bearer.post("/v1/images/generations", {"prompt": PROMPT, "foo": 1}, format="json")
    assert response.status_code == 400
    assert response.json() == {"error": {"message": "Unknown parameter: 'foo'.", "type": "invalid_request_error",
                                         "param": "foo", "code": "unknown_parameter"}}
    assert GenerationJob.objects.count() == 0


def test_the_official_client_gets_unknown_parameter_for_an_extra_body_field(oai):
    with pytest.raises(openai.BadRequestError) as raised:
        oai.images.generate(prompt=PROMPT, size="64x64", extra_body={"width": 64})
    assert raised.value.status_code == 400
    assert raised.value.code == "unknown_parameter" and raised.value.param == "width"
    assert raised.value.type == "invalid_request_error"
    assert GenerationJob.objects.count() == 0


@pytest.mark.parametrize("param, value, expected", [
    ("prompt", 42, "a string"), ("stream", "yes", "a boolean"), ("n", "2", "an integer"),
    ("size", 64, "a string"), ("user", 5, "a string"), ("output_compression", "80", "an integer"),
    ("quality", 1, "a string"), ("partial_images", True, "an integer"),
])
def test_a_wrong_type_is_invalid_type_naming_the_param(bearer, param, value, expected):
    body = {"prompt": PROMPT, param: value}
    response = bearer.post("/v1/images/generations", body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_type" and error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"Invalid type for '{param}': expected {expected}, but got ")
    assert GenerationJob.objects.count() == 0


def test_the_official_client_gets_invalid_type_for_a_number_as_the_prompt(oai):
    with pytest.raises(openai.BadRequestError) as raised:
        oai.images.generate(prompt=42)  # type: ignore[arg-type]
    assert raised.value.code == "invalid_type" and raised.value.param == "prompt"
    assert "expected a string, but got an integer" in raised.value.message


def test_every_parameter_of_the_images_api_is_still_accepted(oai):
    # Accepted: the job is made and the (0.2 s) wait ends in the 504 naming it.
    with pytest.raises(openai.APIStatusError) as raised:
        oai.images.generate(
            prompt=PROMPT, model=settings.IMAGEGEN_MODEL_VERSION, n=1, size="64x64", quality="medium",
            response_format="url", style="vivid", user="end-user-1", background="opaque", moderation="auto",
            output_compression=80, output_format="webp", stream=False, partial_images=0,
            safety_identifier="hashed-user-1",
        )
    assert raised.value.status_code == 504 and raised.value.code == "timeout", raised.value.body
    job = GenerationJob.objects.get()
    assert str(job.id) in raised.value.message and job.output_format == "webp" and job.output_compression == 80


def test_nulls_are_accepted_where_openai_allows_them(bearer):
    body = {"prompt": PROMPT, "n": None, "size": None, "quality": None, "response_format": None, "style": None,
            "stream": None, "partial_images": None, "output_format": None, "output_compression": None,
            "background": None, "moderation": None, "model": None}
    response = bearer.post("/v1/images/generations", body, format="json")
    assert response.status_code == 504, response.content


@pytest.mark.parametrize("param, value", [("frame_count", 4), ("svg", {"model": "x"})])
def test_a_parameter_openai_defines_that_this_server_cannot_honour_is_unsupported(bearer, param, value):
    response = bearer.post("/v1/images/generations", {"prompt": PROMPT, param: value}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unsupported_parameter" and error["param"] == param


def test_no_answer_names_an_internal_class(bearer, native):
    answers = [
        bearer.post("/v1/images/generations", {"prompt": PROMPT, "foo": 1}, format="json"),
        bearer.post("/v1/images/generations", {"prompt": 42}, format="json"),
        submit(native, {"prompt": PROMPT, "size": "64x64", "steps": "4", "allow_degrade": "yes"}),
    ]
    for response in answers:
        text = response.content.decode()
        for name in ("Serializer", "GenerationJob", "Field", "ErrorDetail"):
            assert name not in text, text


# --- the schema -------------------------------------------------------------------------------


def test_the_schema_says_request_bodies_take_no_other_fields():
    document = APIClient().get("/api/schema/", {"format": "json"}).json()
    schemas = document["components"]["schemas"]
    for path, method in (("/api/v1/jobs", "post"), ("/v1/images/generations", "post"),
                         ("/api/v1/jobs/{job_id}/appeal", "post")):
        ref = document["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        component = schemas[ref.rsplit("/", 1)[-1]]
        assert component.get("additionalProperties") is False, (path, component)
    generation = schemas["ImageGenerationRequest"]["properties"]
    assert {"style", "safety_identifier", "stream", "partial_images", "moderation"} <= set(generation)
    assert generation["stream"]["type"] == "boolean" and generation["prompt"]["type"] == "string"


def test_unknown_field_names_are_echoed_safely_and_their_count_is_bounded(native):
    raw = b'{"prompt": "a red circle", "\\ud800odd": 1, "' + b"k" * 5000 + b'": 2}'
    response = native.generic("POST", "/api/v1/jobs", raw, content_type="application/json")
    assert response.status_code == 400, response.content[:300]  # a lone surrogate in a name is not a 500
    assert len(response.content) < 2000
    many = {"prompt": PROMPT, **{f"extra{i}": i for i in range(5000)}}
    response = submit(native, many)
    assert response.status_code == 400
    errors = response.json()
    assert "extra0" in errors and len(response.content) < 20_000
    assert "more unknown fields" in " ".join(errors["non_field_errors"])
