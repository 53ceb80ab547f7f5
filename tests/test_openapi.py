"""The OpenAPI schema and the docs page; schemathesis fuzzes the live API against the schema."""

from __future__ import annotations

import re

import httpx
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from rest_framework.test import APIClient
from schemathesis import GenerationMode

from jobs.api.schema import url_routes
from tests.conftest import make_user, wait_for_status

# Routes that are not part of the API: the admin and staff pages, the sign-in pages, the end
# users' page, and the schema/docs routes themselves.
NOT_API = re.compile(r"^/(admin/|staff/|accounts/|api/schema/$|api/docs/$|favicon\.ico$|$)")


@pytest.fixture(scope="module")
def schema_json(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        response = APIClient().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return response.json()


def test_schema_is_valid_openapi_3_and_lists_every_route(schema_json):
    try:  # the fuller validator when installed, else drf-spectacular's JSON-schema check
        from openapi_spec_validator import validate
    except ImportError:
        from drf_spectacular.validation import validate_schema as validate

    validate(schema_json)  # raises on an invalid document
    assert schema_json["openapi"].startswith("3.")
    documented = set(schema_json["paths"])
    routes = {path for path in url_routes() if not NOT_API.match(path)}
    assert routes - documented == set(), "routes missing from the schema"
    assert documented - routes == set(), "schema paths that are not routes"

    ops = {(path, method) for path, item in schema_json["paths"].items() for method in item}
    assert {("/api/v1/jobs", "post"), ("/api/v1/jobs", "get"), ("/api/v1/jobs/{job_id}/cancel", "post"),
            ("/api/v1/jobs/{job_id}/events", "get"), ("/v1/images/generations", "post"), ("/v1/models", "get")} <= ops


def test_schema_describes_errors_events_and_auth(schema_json):
    paths, components = schema_json["paths"], schema_json["components"]
    create = paths["/api/v1/jobs"]["post"]["responses"]
    assert {"202", "400", "401", "429", "503"} <= set(create)
    assert "Retry-After" in create["429"]["headers"] and "Retry-After" in create["503"]["headers"]
    assert create["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/FieldErrors"}
    assert {"202", "404", "409"} <= set(paths["/api/v1/jobs/{job_id}/cancel"]["post"]["responses"])

    events = paths["/api/v1/jobs/{job_id}/events"]["get"]
    assert "text/event-stream" in events["responses"]["200"]["content"]
    assert {"StatusEvent", "ProgressEvent", "PreviewEvent", "JobEvent"} <= set(components["schemas"])
    assert components["schemas"]["PreviewEvent"]["properties"]["type"]["enum"] == ["preview"]

    generations = paths["/v1/images/generations"]["post"]
    assert {"200", "400", "401", "429", "500", "504"} <= set(generations["responses"])
    assert generations["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/OpenAIError")
    assert generations["security"] == [{"bearerAuth": []}]
    assert components["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer", "description": components["securitySchemes"]["bearerAuth"]["description"],
    }
    job = components["schemas"]["Job"]["properties"]
    assert job["images"]["items"] == {"$ref": "#/components/schemas/JobImage"}
    assert set(job["progress"]["properties"]) == {"step", "total"}


@pytest.mark.django_db
def test_schema_and_docs_need_no_auth_and_load_nothing_external():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token stale-or-wrong")  # still served
    schema = client.get("/api/schema/")
    assert schema.status_code == 200 and yaml.safe_load(schema.content)["openapi"].startswith("3.")
    docs = client.get("/api/docs/")
    assert docs.status_code == 200 and docs["Content-Type"].startswith("text/html")
    html = docs.content.decode()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "external asset in the docs page"
    assert "cdn." not in html and "jsdelivr" not in html
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html


# --- schemathesis against the live server --------------------------------------------------

FUZZ_EXCLUDED = {
    ("GET", "/api/v1/jobs/{job_id}/events"),  # a stream that lasts as long as the job
    ("POST", "/v1/images/generations"),  # waits for the generation
    # A fuzzed id can be the fuzzer's own token: revoked, every later operation is a 401 (which one
    # depends on the ids the run's earlier tests took). Checked below on a token issued for it.
    ("DELETE", "/api/v1/account/tokens/{token_id}"),
}
# Also invalid bodies (schemathesis's negative mode), where no path parameter can be malformed
# into a route that does not exist.
NEGATIVE_TOO = {"POST /api/v1/jobs"}
CHECKS = [
    getattr(schemathesis.checks, name)
    for name in ("not_a_server_error", "status_code_conformance", "content_type_conformance",
                 "response_schema_conformance", "response_headers_conformance")
]


@pytest.fixture
def fuzzer(transactional_db, daphne_server, workers):  # noqa: F811
    user = make_user("fuzzer")
    yield user
    # Cancel what the fuzzing submitted, so the shared workers don't spend the session on it.
    from jobs import actions
    from jobs.models import GenerationJob

    for job in GenerationJob.objects.filter(owner=user).exclude(status__in=["done", "blocked", "failed", "cancelled"]):
        actions.cancel_job(job)


@pytest.mark.django_db(transaction=True)
def test_schemathesis_live(daphne_server, fuzzer):  # noqa: F811
    # The served schema, with the docs pages reachable too (static assets through whitenoise).
    docs = httpx.get(f"{daphne_server.url}/api/docs/", timeout=10)
    asset = re.search(r'src="([^"]+swagger-ui-bundle\.js)"', docs.text).group(1)
    assert httpx.get(daphne_server.url + asset, timeout=10).status_code == 200

    schema = schemathesis.openapi.from_url(f"{daphne_server.url}/api/schema/?format=json")
    token = fuzzer.auth_token.key
    # Real objects for the operations that fuzzing alone only meets as 404s: a done job (with an
    # image) and a blocked one.
    native = httpx.Client(base_url=daphne_server.url, headers={"Authorization": f"Token {token}"}, timeout=30)
    done = native.post("/api/v1/jobs", json={"prompt": "a red circle on a blue background", "seed": 3}).json()
    blocked = native.post("/api/v1/jobs", json={"prompt": "a yellow star"}).json()
    wait_for_status(done["id"], ("done",))
    wait_for_status(blocked["id"], ("blocked",))
    image = native.get(f"/api/v1/jobs/{done['id']}").json()["images"][0]
    image_key, image_id = image["url"].rsplit("/", 1)[1], image["id"]
    checked: list[str] = []
    failures: list[str] = []
    seen: dict[str, set[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) in FUZZ_EXCLUDED:
            continue
        label = f"{operation.method.upper()} {operation.path}"
        keyword = "Bearer" if operation.path.startswith("/v1/") else "Token"
        headers = {"Authorization": f"{keyword} {token}"}

        strategy = operation.as_strategy()
        if label in NEGATIVE_TOO:
            strategy = strategy | operation.as_strategy(generation_mode=GenerationMode.NEGATIVE)

        @given(case=strategy)
        @hsettings(
            max_examples=15, derandomize=True, deadline=None, database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def run(case):
            # Called right below, inside this iteration: the loop variables are the current ones.
            response = case.call_and_validate(base_url=daphne_server.url, headers=headers, checks=CHECKS, timeout=30)  # noqa: B023
            seen.setdefault(label, set()).add(response.status_code)  # noqa: B023

        try:
            run()
        except (Exception, BaseExceptionGroup) as exc:  # collect all operations' findings, then fail once
            failures.append(f"{label}: {exc}")
        checked.append(label)
    # The same checks on real objects, for every operation on a job (a DELETE last) and the image.
    real_cases = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if "{job_id}" in operation.path:
            for job_id in (done["id"], blocked["id"]):
                real_cases.append(operation.Case(path_parameters={"job_id": job_id}))
        elif "{key}" in operation.path:
            real_cases.append(operation.Case(path_parameters={"key": image_key}))
        elif "{image_id}" in operation.path:
            real_cases.append(operation.Case(path_parameters={"image_id": image_id}))
        elif "{token_id}" in operation.path:
            spare = native.post("/api/v1/account/tokens", json={"name": "to revoke"}).json()
            real_cases.append(operation.Case(path_parameters={"token_id": spare["id"]}))
    real_cases.sort(key=lambda case: case.operation.method.upper() == "DELETE")
    for case in real_cases:
        label = f"{case.operation.method.upper()} {case.operation.path}"
        try:
            response = case.call_and_validate(
                base_url=daphne_server.url, headers={"Authorization": f"Token {token}"}, checks=CHECKS, timeout=30
            )
            seen.setdefault(label, set()).add(response.status_code)
        except (Exception, BaseExceptionGroup) as exc:
            failures.append(f"{label} (a real object): {exc}")
    print("schemathesis status codes:", {op: sorted(codes) for op, codes in seen.items()})
    assert len(checked) >= 6, checked
    assert not failures, "\n\n".join(failures)
    # The auth header worked: real answers, not just 401s.
    assert 202 in seen["POST /api/v1/jobs"] and 200 in seen["GET /api/v1/jobs"] and 200 in seen["GET /v1/models"]
    assert 200 in seen["GET /api/v1/jobs/{job_id}"] and 200 in seen["GET /api/v1/jobs/{job_id}/events"]
    assert 200 in seen["GET /media/i/{key}"] and 409 in seen["POST /api/v1/jobs/{job_id}/cancel"]
    assert seen["DELETE /api/v1/account/tokens/{token_id}"] == {204}
