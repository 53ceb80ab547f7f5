"""The OpenAPI document's components are generated from serializers (jobs/api/schema.py), the
document is still valid OpenAPI 3, and the JSON the API really returns (a job, its images, a
status event, an error) validates against the components it names."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import jsonschema
import pytest
from django.utils import timezone
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from jobs.models import GeneratedImage, GenerationJob
from tests.conftest import client_for

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.django_db


@pytest.fixture
def document():
    response = APIClient().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return response.json()


def _to_json_schema(node, schemas):
    """OpenAPI 3.0 schema -> JSON Schema: $refs inlined, `nullable` as a null type."""
    if isinstance(node, list):
        return [_to_json_schema(n, schemas) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _to_json_schema(schemas[node["$ref"].rsplit("/", 1)[-1]], schemas)
    out = {k: _to_json_schema(v, schemas) for k, v in node.items() if k not in ("nullable", "readOnly", "writeOnly",
                                                                               "discriminator", "example")}
    if node.get("nullable"):
        out = {"anyOf": [out, {"type": "null"}]}
    return out


def conforms(instance, component: str, document) -> None:
    schemas = document["components"]["schemas"]
    jsonschema.validate(instance, _to_json_schema(copy.deepcopy(schemas[component]), schemas))


def test_the_document_is_valid_openapi_3(document):
    validate_schema(document)
    assert document["openapi"].startswith("3.")


def test_the_shapes_are_serializers_not_schema_literals():
    """Only the shapes a serializer cannot state are written out: FieldErrors (a map of field ->
    messages), OpenAIError (with its example) and JobEvent (a oneOf of the event components)."""
    from jobs.api import schema

    tree = ast.parse((ROOT / "jobs" / "api" / "schema.py").read_text())
    literal = sorted(
        t.id for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
        for t in node.targets if isinstance(t, ast.Name) and t.id.endswith("_SCHEMA")
    )
    assert literal == ["FIELD_ERRORS_SCHEMA", "JOB_EVENT_SCHEMA", "OPENAI_ERROR_SCHEMA"]
    generated = schema.serializer_components(schema.StatusEventSerializer, schema.ReadinessSerializer)
    assert set(generated) == {"StatusEvent", "JobImage", "Readiness"}
    assert generated["StatusEvent"]["properties"]["type"] == {"type": "string", "enum": ["status"]}


def test_what_the_api_returns_matches_the_components(document, alice):
    from jobs.representation import status_event

    job = GenerationJob.objects.create(owner=alice, prompt="a red circle", width=64, height=64, steps=2,
                                       guidance_scale=5.0, seed=2**40, model_version="tiny-random", stage="done",
                                       progress_total=2, progress_step=2, started_at=timezone.now(),
                                       finished_at=timezone.now())
    GeneratedImage.objects.create(job=job, index=0, seed=2**40, storage_key="i/" + "b" * 32 + ".png", width=64,
                                  height=64, byte_size=10, sha256="0" * 64)
    api = client_for(alice)
    body = api.get(f"/api/v1/jobs/{job.id}").json()
    assert body["images"], body
    conforms(body, "Job", document)
    conforms(body["images"][0], "JobImage", document)
    conforms(status_event(job), "StatusEvent", document)
    conforms(status_event(job), "JobEvent", document)
    conforms({"type": "progress", "job": str(job.id), "step": 1, "total": 2}, "ProgressEvent", document)
    missing = api.get("/api/v1/jobs/00000000-0000-0000-0000-000000000000")
    assert missing.status_code == 404
    conforms(missing.json(), "ErrorDetail", document)
    with pytest.raises(jsonschema.ValidationError):
        conforms({**status_event(job), "type": "nonsense"}, "StatusEvent", document)
