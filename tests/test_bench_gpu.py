"""bench/gpu.py at tiny size on CPU, as CI runs it: every figure for every batch size, for raw
diffusers and the service's GPU worker on the same pipeline, and the worker's images equal in
pixels to raw diffusers' for the same rows and seeds (the worker must not change the picture)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BATCHES = ("1", "4", "8")
HANDOFF_PARTS = ("encode", "credentials", "store", "handoff_db", "total")


def _positive(value) -> bool:
    return isinstance(value, float | int) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench-gpu") / "gpu-cpu-tiny.json"
    # As CI's command runs it from a clean shell: none of the suite's settings (its fake classifier,
    # six-second leases, ...); the bench builds its own stack (a private Redis, a SQLite file).
    ours = ("IMAGEGEN_", "REDIS_URL", "DATABASE_URL", "CELERY_", "DJANGO_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    done = subprocess.run([sys.executable, "bench/gpu.py", "--device", "cpu", "--tiny", "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.integration
def test_the_report_names_the_device_and_the_families(report):
    assert "CPU" in report["device"] and report["tiny"] is True
    assert set(report["families"]) == {"sd15", "sdxl"}
    assert report["batches"] == [1, 4, 8]


@pytest.mark.integration
@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_every_batch_size_has_every_figure_for_raw_diffusers_and_the_service(report, family):
    by_batch = report["families"][family]["levers"]["off"]
    assert sorted(by_batch, key=int) == list(BATCHES)
    for batch, e in by_batch.items():
        raw, on, off = e["raw"], e["service"], e["service_previews_off"]
        for figure in ("pass_seconds", "s_per_step", "images_per_gpu_second"):
            assert _positive(raw[figure]) and _positive(on[figure]) and _positive(off[figure]), (batch, figure)
        for run in (on, off):
            assert run["batch_sizes"] == [int(batch)] and run["passes"] == report["service_passes"]
            assert 0 < run["duty_cycle"] <= 1
            assert all(_positive(run["handoff_s_per_image"][part]) for part in HANDOFF_PARTS), run["handoff_s_per_image"]
            assert run["handoff_queue_wait_seconds"] >= 0
        assert on["previews_per_pass"] >= 1 and _positive(on["preview_making_seconds_per_pass"])
        assert off["previews_per_pass"] == 0
        assert math.isfinite(e["preview_cost_s_per_step"]) and _positive(e["service_over_raw"])


@pytest.mark.integration
@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_the_service_makes_the_same_pixels_as_raw_diffusers(report, family):
    for batch, e in report["families"][family]["levers"]["off"].items():
        assert e["pixels"] == {"images": int(batch), "max_abs_diff": 0, "equal": True}, batch


@pytest.mark.integration
@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_a_lever_not_measured_says_why(report, family):
    levers = report["families"][family]["levers"]
    assert "skipped on CPU" in levers["compile"]["unsupported"]
    assert "first-block" in levers["first-block"]["unsupported"]  # the worker refuses it for a UNet family
