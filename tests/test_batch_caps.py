"""`manage.py measure_batch_caps`: step time by batch size -> caps and fill wait; a model whose
batch gain is flat gets cap 1 and no fill wait. Measured on the simulated accelerator, whose
batch cost is a setting, and on a tiny family pipeline from disk."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.test import override_settings

from gpu_tasks import pipeline
from gpu_tasks.tiny_pipeline import write_tiny_family


@pytest.fixture
def fresh_model(monkeypatch):
    monkeypatch.setattr(pipeline, "_loaded", {})


def profile(tmp_path, **options) -> dict:
    out = tmp_path / "profile.json"
    call_command("measure_batch_caps", steps=2, batches="1,2,4", images=4, sizes="64x64", out=str(out), **options)
    return json.loads(out.read_text())


@pytest.mark.parametrize(("marginal", "batches"), [(1.0, False), (0.05, True)])
def test_the_batch_gain_decides_the_cap_and_the_fill_wait(tmp_path, fresh_model, marginal, batches):
    with override_settings(IMAGEGEN_ACCELERATOR="simulated", IMAGEGEN_SIM_STEP_MS=60.0,
                           IMAGEGEN_SIM_BATCH_MARGINAL=marginal):
        result = profile(tmp_path)
    size = result["sizes"]["64x64"]
    assert (size["suggested_cap"] > 1) is batches  # a flat gain: cap 1
    assert (size["suggested_fill_wait"] > 0) is batches  # ... and no fill wait
    assert result["IMAGEGEN_BATCH_CAPS"] == f"64x64:{size['suggested_cap']}"
    assert set(size["ms_per_step"]) == {"1", "2", "4"}


def test_a_family_pipeline_on_disk_gets_a_profile(tmp_path):
    model = write_tiny_family(tmp_path / "pixart", "pixart")
    result = profile(tmp_path, model=str(model))
    assert result["family"] == "pixart"
    assert result["sizes"]["64x64"]["suggested_cap"] in (1, 2, 4)
    assert all(ms > 0 for ms in result["sizes"]["64x64"]["ms_per_step"].values())
