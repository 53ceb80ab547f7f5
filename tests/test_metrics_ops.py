"""Metrics across processes, health and readiness, structured logs, the dashboard, the forecast."""

from __future__ import annotations

import json
import logging
import re
import time

import pytest
from django.core.management import call_command
from django.test import Client

from imagegen.logs import JsonFormatter
from scheduling.forecast import Inputs, forecast
from tests.conftest import make_user, wait_for_status
from tests.test_generation import submit

pytestmark = pytest.mark.django_db(transaction=True)


def scrape() -> str:
    response = Client().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return response.content.decode()


def value(text: str, name: str, labels: str = "") -> float:
    any_labels = r"(\{[^}]*\})?"
    label_part = re.escape(labels) if labels else any_labels
    pattern = "^" + re.escape(name) + label_part + r" ([0-9.e+-]+)$"
    values = [float(m.group(m.lastindex)) for m in re.finditer(pattern, text, re.M)]
    return sum(values)


def test_metrics_move_after_a_job_although_the_work_happened_in_a_worker(workers, alice_api):
    before = scrape()
    job = submit(alice_api, steps=5, seed=31337, prompt="a metrics circle")
    wait_for_status(job["id"], ("done",))
    deadline = time.monotonic() + 120  # the publish stage counts after its commit
    while value(after := scrape(), "imagegen_submit_to_done_seconds_count") <= value(before, "imagegen_submit_to_done_seconds_count"):
        assert time.monotonic() < deadline, "the metrics never moved"
        time.sleep(0.1)
    for name in ("imagegen_images_generated_total", "imagegen_batches_total", "imagegen_gpu_seconds_total",
                 "imagegen_batch_size_count", "imagegen_queue_wait_seconds_count",
                 "imagegen_submit_to_done_seconds_count", "imagegen_classifier_seconds_count",
                 "imagegen_attempts_total"):
        assert value(after, name) > value(before, name), name
    assert re.search(r'^imagegen_jobs_total\{status="done",version="tiny-random"\} [1-9]', after, re.M)
    assert value(after, "imagegen_safety_decisions_total") >= 1
    for gauge in ("imagegen_gpu_workers", "imagegen_queued_gpu_seconds_per_gpu", "imagegen_review_queue_depth",
                  "imagegen_stored_bytes", "imagegen_views_per_image_count"):
        assert re.search(rf"^{gauge}", after, re.M), gauge


def test_a_shed_submit_is_counted(workers, alice_api, settings):
    before = value(scrape(), "imagegen_shed_total")
    settings.IMAGEGEN_MAX_QUEUE_WAIT = 0.001
    assert alice_api.post("/api/v1/jobs", {"prompt": "a cat"}, format="json").status_code == 429
    assert value(scrape(), "imagegen_shed_total") == before + 1


def test_readyz_is_ready_with_a_live_gpu_worker(workers):
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["checks"] == {"database": "ok", "redis": "ok", "image_gate": "ok", "model": "ok", "gpu_workers": "ok"}
    assert Client().get("/healthz").status_code == 200


def test_readyz_names_redis_when_it_is_unreachable(transactional_db, monkeypatch):
    import redis

    from imagegen import redis_client as redis_conn

    monkeypatch.setattr(redis_conn, "_client", redis.Redis.from_url("redis://127.0.0.1:1/0", socket_timeout=0.5))
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert "redis" in response.json()["failing"]


def test_readyz_names_the_gpu_workers_when_none_is_alive(transactional_db, settings):
    settings.IMAGEGEN_MODEL_NAME = "a-model-nobody-serves"
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["failing"] == ["gpu_workers"]


def test_logs_are_one_json_object_a_line_with_job_and_batch_ids():
    record = logging.LogRecord("gpu_tasks.batch", logging.INFO, __file__, 1, "batch %s done", ("b1",), None)
    record.job_id, record.batch_id, record.stage = "j1", "b1", "deliver"
    line = JsonFormatter().format(record)
    entry = json.loads(line)
    assert entry["message"] == "batch b1 done" and entry["job_id"] == "j1" and entry["batch_id"] == "b1"
    assert entry["stage"] == "deliver" and "\n" not in line


def test_the_dashboard_is_staff_only_and_shows_live_figures(workers, transactional_db):
    from imagegen.dashboard import record_sample

    record_sample()
    record_sample()
    staff = make_user("ops", is_staff=True)
    client = Client()
    client.force_login(staff)
    page = client.get("/staff/dashboard")
    assert page.status_code == 200
    html = page.content.decode()
    assert "queued images" in html and "<polyline" in html
    outsider = Client()
    outsider.force_login(make_user("eve"))
    assert outsider.get("/staff/dashboard").status_code == 302


def test_the_forecast_reproduces_the_worked_estimate():
    r = forecast(Inputs(images_per_day=50_000_000, gpu_hour_price=2, steps=30, step_seconds_batch1=0.040,
                        step_seconds_best=0.040, best_batch=1, utilization=0.5))
    assert r["batch_1"]["gpu_seconds_per_image"] == pytest.approx(1.2)
    assert r["batch_1"]["busy_gpus"] == pytest.approx(694.4, abs=0.1)
    assert r["batch_1"]["fleet_gpus"] == pytest.approx(1388.9, abs=0.1)
    assert r["batch_1"]["cost_per_image"] == pytest.approx(0.000667, abs=1e-6)
    assert r["what_if"]["steps_halved"]["busy_gpus"] == pytest.approx(347.2, abs=0.1)


def test_the_forecast_command_with_a_given_step_time(capsys):
    call_command("forecast", "--step-ms", "40", "--steps", "30", "--images-per-day", "50000000",
                 "--utilization", "0.5", "--gpu-hour-price", "2", "--json")
    r = json.loads(capsys.readouterr().out)
    assert round(r["batch_1"]["busy_gpus"]) == 694 and round(r["batch_1"]["fleet_gpus"]) == 1389


def test_a_measured_forecast_on_the_tiny_model_runs_in_under_a_minute(tiny_model, capsys):
    started = time.monotonic()
    call_command("forecast", "--images-per-day", "1000000", "--gpu-hour-price", "2", "--steps", "4",
                 "--batches", "1,2", "--json")
    elapsed = time.monotonic() - started
    r = json.loads(capsys.readouterr().out)
    assert set(r["measured"]["seconds_per_image_step"]) == {"1", "2"}
    assert r["batch_1"]["gpu_seconds_per_image"] > 0 and r["storage_bytes_per_day"] > 0
    assert elapsed < 60
