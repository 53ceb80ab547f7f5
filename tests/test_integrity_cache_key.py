"""The request-hash cache key binds the gates themselves (issue 28, item 6): the whole policy
file, the embedder's configuration and the whole model files, not the policy's version string
and the first 64 KiB. A policy edited without a version bump must miss the cache."""

from __future__ import annotations

import json
import shutil

import pytest

from safety.gate_identity import _fingerprint
from tests.conftest import wait_for_status, wait_until_cached
from tests.test_generation import submit

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "a lime triangle on a navy background"


def test_an_edited_policy_without_a_version_bump_misses_the_cache(workers, alice_api, settings, tmp_path, monkeypatch):
    monkeypatch.delenv("IMAGEGEN_SAFETY_POLICY", raising=False)
    original = settings.IMAGEGEN_SAFETY_POLICY
    copy = tmp_path / "policy.json"
    shutil.copyfile(original, copy)
    first = submit(alice_api, seed=5151, steps=2, prompt=PROMPT)
    wait_until_cached(wait_for_status(first["id"], ("done",)))

    settings.IMAGEGEN_SAFETY_POLICY = str(copy)  # the same bytes elsewhere: the same gate
    assert submit(alice_api, seed=5151, steps=2, prompt=PROMPT)["status"] == "done"

    policy = json.loads(copy.read_text())
    category = policy["categories"][0]
    category["description"] = category.get("description", "") + " (tightened)"
    copy.write_text(json.dumps(policy))  # edited, its "version" unchanged
    probe = submit(alice_api, seed=5151, steps=2, prompt=PROMPT)
    assert probe["status"] == "queued", "a request judged by the old policy was served past the edited one"


def test_a_model_file_changed_past_its_first_64_kib_is_another_gate(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    weights = model / "weights.bin"
    weights.write_bytes(b"\0" * (200 * 1024))
    before = _fingerprint(model)
    data = bytearray(weights.read_bytes())
    data[150 * 1024] = 1  # same name, same size, same first 64 KiB
    weights.write_bytes(bytes(data))
    assert _fingerprint(model) != before
