"""The simulated accelerator and the fleet simulation."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gpu_tasks.pipeline import Row, preview_size
from gpu_tasks.simulated import SimulatedModel, step_seconds

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))


def test_the_simulated_accelerator_sleeps_by_its_cost_model_and_makes_deterministic_pixels(settings):
    settings.IMAGEGEN_SIM_STEP_MS = 5.0
    settings.IMAGEGEN_SIM_BATCH_MARGINAL = 0.5
    model = SimulatedModel()
    rows = [Row("j", i, "a red circle", "", 10 + i) for i in range(4)]
    started = time.monotonic()
    images = model.generate(rows, 64, 64, 8, 5.0)
    elapsed = time.monotonic() - started
    expected = 8 * step_seconds(4, 64, 64)
    assert expected == pytest.approx(8 * 0.005 * 2.5)
    assert elapsed >= expected * 0.9  # it sleeps its cost model's time (an upper bound would time the machine)
    again = model.generate(rows[:1], 64, 64, 2, 5.0)
    assert np.array_equal(np.asarray(images[0]), np.asarray(again[0]))
    assert not np.array_equal(np.asarray(images[0]), np.asarray(images[1]))
    preview = model.preview_images(rows, [0], 64, 64)[0]
    assert preview.size == preview_size(64, 64)
    assert np.asarray(preview).std() > 0, "a picture, not a blank"


def test_the_simulated_loop_stops_when_asked(settings):
    settings.IMAGEGEN_SIM_STEP_MS = 1.0
    seen = []
    result = SimulatedModel().generate([Row("j", 0, "p", "", 1)], 64, 64, 50, 5.0, lambda s, t, _: seen.append(s) or s == 3)
    assert result is None and seen == [1, 2, 3]


def test_the_fleet_simulation_reproduces_the_back_of_envelope_busy_gpus():
    from fleet_sim import simulate

    r = simulate(gpus=40, images_per_day=2e6, hours=2, gpu_s_per_image=1.2, marginal=1.0, cap=8,
                 fill_wait=0.3, starvation=10.0, max_wait=120.0, degrade_steps=8, degrade_share=0.5)
    # 2M images x 1.2 GPU-s / 86,400 s = 27.8 busy GPUs on average over a day; two hours of a
    # diurnal curve sit below or above the mean, so compare the offered load with its own curve.
    assert r["expected_busy_gpus"] == pytest.approx(27.78, abs=0.01)
    assert r["accepted_jobs"] > 0 and r["images_done"] > 0
    assert 0 < r["utilisation"] <= 1
    assert r["busy_gpus"] <= r["offered_busy_gpus_mean"] * 1.01
    assert r["wait_p99_s"] >= r["wait_p50_s"] >= 0
    assert 0 < r["mean_fill"] <= 1


def test_a_full_day_of_traffic_offers_the_expected_gpu_load():
    from fleet_sim import rate_curve

    rel = rate_curve(24)
    assert rel.mean() == pytest.approx(1.0)
    assert rel.max() > 2 and rel.min() < 0.5  # a diurnal peak with bursts, and a trough


def test_simulated_pictures_are_at_the_requested_size_and_cost_what_real_ones_cost_to_encode(settings):
    """Flat colours compress to almost nothing, which would hide the cost of encoding and
    uploading; the simulated pictures must weigh what a generated image weighs (a real model's
    1024x1024 output is 1-2 MB as PNG)."""
    import io

    from gpu_tasks.simulated import picture

    small = picture(Row("j", 0, "a red circle", "", 1), 64, 96)
    assert small.size == (64, 96) and small.mode == "RGB"
    big = picture(Row("j", 0, "a red circle", "", 1), 1024, 1024)
    buf = io.BytesIO()
    big.save(buf, format="PNG")
    assert 1_000_000 < len(buf.getvalue()) < 3_000_000
    other = np.asarray(picture(Row("j", 1, "a red circle", "", 2), 1024, 1024), dtype=np.int16)
    assert np.abs(np.asarray(big, dtype=np.int16) - other).mean() > 10  # not one picture shifted
