"""Issue 45, item 7: every path under /api/ and /v1/ answers JSON for 404 and 405, no answer
names an internal model class, and `Authorization: Bearer <token>` works on the native routes as
on the OpenAI ones. Black-box over daphne (the session's server)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from jobs.access import tokens
from tests.conftest import make_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("method, path", [
    ("GET", "/api/v1/jobs/not-a-uuid"),
    ("GET", "/api/v1/images/xyz/credentials"),
    ("GET", "/api/v1/nope"),
    ("GET", f"/api/v1/jobs/{uuid.UUID(int=7)}"),  # a well-formed id nobody owns
    ("GET", f"/api/v1/images/{uuid.UUID(int=7)}/credentials"),
    ("GET", f"/api/v1/jobs/{uuid.UUID(int=7)}/events"),  # the event stream (an async view)
    ("DELETE", "/api/v1/queue"),  # 405
    ("PUT", "/api/v1/jobs"),
    ("GET", "/v1/nope"),
])
def test_api_paths_answer_json_errors_that_name_no_model(daphne_server, method, path):
    user = make_user(f"json-errors-{uuid.uuid4().hex[:8]}")
    answer = httpx.request(method, daphne_server.url + path, headers={"Authorization": f"Token {tokens.issue(user)}"},
                           timeout=30)
    assert answer.status_code in (404, 405), (answer.status_code, answer.text[:300])
    assert answer.headers["content-type"].startswith("application/json"), answer.text[:300]
    text = answer.text
    for internal in ("GenerationJob", "GeneratedImage", "ApiToken", "Batch"):
        assert internal not in text, text


def test_a_bearer_token_works_on_the_native_routes(daphne_server):
    user = make_user("bearer-native")
    token = tokens.issue(user)
    answer = httpx.get(daphne_server.url + "/api/v1/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert answer.status_code == 200, answer.text[:300]
    refused = httpx.get(daphne_server.url + "/api/v1/jobs", headers={"Authorization": "Bearer nope"}, timeout=30)
    assert refused.status_code == 401
