"""docs/api.md names what the service serves: its table of served models (which is the default,
each one's default steps, allowed steps and guidance) and its table of quality tiers (the model
and steps a tier runs with, and its levers) match the catalogue that `make run` serves, read
through the real routes (GET /api/v1/queue, GET /v1/models) and the submit's own validation.

The service is configured here exactly as `make run` configures it: imagegen/settings.py is
read again with none of the suite's IMAGEGEN_* overrides (the suite serves a tiny random model),
and every IMAGEGEN_* setting it yields is applied for the test."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
API_DOC = ROOT / "docs" / "api.md"

pytestmark = pytest.mark.django_db


def shipped_settings(monkeypatch) -> dict:
    """The IMAGEGEN_* settings of a fresh checkout's `make run` (the var folder stays the test's)."""
    for name in list(os.environ):
        if name.startswith(("IMAGEGEN_", "DJANGO_")) and name != "IMAGEGEN_VAR_DIR":
            monkeypatch.delenv(name)
    spec = importlib.util.spec_from_file_location("imagegen_shipped_settings", ROOT / "imagegen" / "settings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: getattr(module, name) for name in dir(module) if name.startswith("IMAGEGEN_") and name != "IMAGEGEN_VAR_DIR"}


@pytest.fixture
def as_shipped(settings, monkeypatch):
    from scheduling import catalogue

    shipped = shipped_settings(monkeypatch)
    monkeypatch.undo()  # the environment back as the suite had it; the settings below stay
    for name, value in shipped.items():
        setattr(settings, name, value)
    catalogue._catalogue.cache_clear()  # built from settings the cache key does not name (the default steps)
    yield shipped
    catalogue._catalogue.cache_clear()


def table_after(text: str, heading: str) -> list[dict[str, str]]:
    """The first Markdown table after the heading line `heading`, as one dict per row keyed by
    the header's cells (backticks and bold stripped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == heading), None)
    assert start is not None, f"docs/api.md has no heading {heading!r}"
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip().replace("`", "").replace("**", "") for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert len(rows) > 2, f"no table under {heading!r}"
    header, body = rows[0], rows[2:]
    return [dict(zip(header, row, strict=True)) for row in body]


def documented_models() -> dict[str, dict]:
    """docs/api.md's "Served models" table: model -> default, steps (default, min, max), guidance."""
    out = {}
    for row in table_after(API_DOC.read_text(), "### Served models"):
        steps = re.fullmatch(r"(\d+) \((\d+)-(\d+)\)", row["steps: default (allowed)"])
        assert steps, f"steps of {row['model']} not as 'N (MIN-MAX)': {row['steps: default (allowed)']!r}"
        out[row["model"]] = {
            "default": row["default"] == "yes",
            "default_steps": int(steps[1]), "min_steps": int(steps[2]), "max_steps": int(steps[3]),
            "guidance_scale": float(row["guidance"]),
            "negative_prompt": row["negative prompt"] == "yes",
        }
    return out


def documented_tiers() -> dict[str, dict]:
    """docs/api.md's "Quality tiers" table: each `quality` value (aliases split) -> model, steps, levers."""
    out = {}
    for row in table_after(API_DOC.read_text(), "### Quality tiers"):
        for quality in re.findall(r"[a-z]+", row["quality"].split("(")[0]):
            out[quality] = {"model": row["model"], "steps": int(row["steps"]),
                            "levers": "" if row["levers"] in ("none", "-") else row["levers"]}
    return out


@pytest.fixture
def alice_token(db) -> str:
    from tests.conftest import make_user

    return make_user("alice").auth_token.key


def test_the_served_models_table_names_what_make_run_serves(as_shipped, alice_token):
    from rest_framework.test import APIClient

    from scheduling import catalogue

    client = APIClient()
    served = client.get("/api/v1/queue", HTTP_AUTHORIZATION=f"Token {alice_token}").json()["models"]
    listed = [m["id"] for m in client.get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {alice_token}").json()["data"]]
    assert listed == [m["version"] for m in served]
    documented = documented_models()
    assert sorted(documented) == sorted(listed), "docs/api.md's served models against GET /v1/models"
    for model in served:
        doc = documented[model["version"]]
        got = {"default": model["default"], "default_steps": model["default_steps"], "min_steps": model["min_steps"],
               "max_steps": model["max_steps"], "guidance_scale": float(model["guidance_scale"]),
               "negative_prompt": catalogue.served()[model["version"]].negative_prompt}
        assert doc == got, f"docs/api.md on {model['version']} against GET /api/v1/queue"
    [default] = [name for name, doc in documented.items() if doc["default"]]
    assert default == as_shipped["IMAGEGEN_MODEL_VERSION"] == catalogue.default().version


def test_the_quality_tiers_table_gives_the_model_steps_and_levers_a_tier_runs_with(as_shipped):
    """Each `quality` of a submit naming no model, validated as POST /api/v1/jobs validates it."""
    from jobs.api.serializers import JobCreateSerializer

    documented = documented_tiers()
    assert set(documented) == {"auto", "low", "medium", "standard", "high", "hd"}
    for quality, doc in documented.items():
        submit = JobCreateSerializer(data={"prompt": "a red circle on a blue background", "quality": quality})
        assert submit.is_valid(), submit.errors
        got = submit.validated_data
        ran = {"model": got.get("model") or as_shipped["IMAGEGEN_MODEL_VERSION"], "steps": got["steps"],
               "levers": got.get("variant", "")}
        assert doc == ran, f"docs/api.md on quality {quality!r}"


def test_a_tier_on_a_named_model_runs_the_steps_and_levers_the_doc_says(as_shipped):
    from jobs.api.serializers import JobCreateSerializer

    said = re.findall(r'`"model": "([\w.-]+)", "quality":\s+"(\w+)"` runs (\d+) steps with the CFG cutoff',
                      API_DOC.read_text())
    assert said, "docs/api.md gives no example of a tier on a named model"
    for model, quality, steps in said:
        submit = JobCreateSerializer(data={"prompt": "a red circle", "model": model, "quality": quality})
        assert submit.is_valid(), submit.errors
        ran = submit.validated_data
        assert (ran["model"], ran["steps"]) == (model, int(steps)), f"docs/api.md on {model} at quality {quality!r}"
        assert ran["variant"].startswith("cfg-cutoff="), ran["variant"]


def test_every_model_name_in_the_api_doc_and_the_readme_is_served(as_shipped):
    """No retired or misspelt version in the prose either (shapes-v1 as the default, say)."""
    from scheduling import catalogue

    served = set(catalogue.served())
    for doc in (API_DOC, ROOT / "README.md"):
        named = set(re.findall(r"\bshapes-v\d+(?:-lcm)?\b", doc.read_text()))
        assert named and named <= served, f"{doc.name} names {sorted(named - served)}, not served"


def test_the_doc_says_which_model_a_job_naming_none_runs_on(as_shipped):
    text = API_DOC.read_text()
    default = as_shipped["IMAGEGEN_MODEL_VERSION"]
    said = re.findall(r"[Aa] job naming no model runs on `([\w.-]+)`", text)
    assert said == [default], f"docs/api.md says a job naming no model runs on {said}, the service runs it on {default}"
