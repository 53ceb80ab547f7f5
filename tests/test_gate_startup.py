"""A misconfigured image gate refuses to start the worker, and /readyz names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_policy_naming_a_label_the_classifier_cannot_produce_refuses_to_start(start_worker, tmp_path, workers):
    policy = json.loads(Path(settings.IMAGEGEN_SAFETY_POLICY).read_text())
    policy["image"]["labels"]["unicorn"] = {"category": "demo_forbidden", "review": 0.5, "block": 0.9}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy))
    worker = start_worker("classify-misconfigured", "classify-misconfigured", wait=False,
                          IMAGEGEN_SAFETY_POLICY=str(path), IMAGEGEN_QUEUE_CLASSIFY="classify-misconfigured")
    assert worker.proc.wait(timeout=120) == 3
    assert b"refusing to start" in worker.log_path.read_bytes()
    body = Client().get("/readyz").json()
    assert "image_gate" in body["failing"] and "unicorn" in body["checks"]["image_gate"]
    # A worker that starts cleanly clears it.
    start_worker("classify-clean", "classify-clean", IMAGEGEN_QUEUE_CLASSIFY="classify-clean").stop()
    assert Client().get("/readyz").json()["checks"]["image_gate"] == "ok"
