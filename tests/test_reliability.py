"""The fault suite at reduced size (issue 11), through the session's real workers and Redis:
worker kills mid-batch, a database outage, a failing image classifier under load, failing
uploads, rising load against daphne, and a Redis restart (a Redis and workers of its own, so it runs
whatever REDIS_URL the suite has).
The same scenario code runs at full size with `python bench/reliability.py --full`.
Deselect with `-k "not reliability"` or `--deselect tests/test_reliability.py`."""

from __future__ import annotations

import os
import time

import pytest
from django.conf import settings
from django.test import Client, override_settings

from bench import reliability as rel
from jobs.models import GenerationJob, at
from tests import fake_classifiers
from tests.conftest import wait_for_status
from tests.live_server import start_daphne, stop_daphne

pytestmark = pytest.mark.django_db(transaction=True)



class FixtureStack:
    """What bench.reliability.GpuPool needs from a Stack, over conftest's start_worker."""

    def __init__(self, start_worker):
        self.start, self.workers, self.procs, self.started = start_worker, {}, {}, False
        self.env = {"IMAGEGEN_MODEL_NAME": settings.IMAGEGEN_MODEL_NAME}

    def start_worker(self, name, queues, beat=False, **env):
        # The first victim is ready before any job goes in; restarts come up in the background.
        worker = self.start(name, queues, beat=beat, wait=not self.workers and not self.started, **env)
        self.started = True
        self.workers[name], self.procs[name] = worker, worker.proc
        return worker.proc

    def kill(self, name):
        self.procs.pop(name, None)
        self.workers.pop(name).kill()

    def stop(self, name):
        self.procs.pop(name, None)
        self.workers.pop(name).stop()


@pytest.fixture
def classifier_off():
    fake_classifiers.set_mode(None)
    yield
    fake_classifiers.set_mode(None)


def test_sigkill_of_gpu_workers_mid_batch_again_and_again_loses_and_duplicates_nothing(workers, reaper, start_worker, alice_api, classifier_off):
    # The session's gpu1 keeps running; the victims are killed mid-batch and restarted.
    stack = FixtureStack(start_worker)
    serial = iter(range(1000))
    orig_spawn = rel.GpuPool.spawn

    def spawn(pool):  # unique node names next to the session's gpu1
        name = f"victim{next(serial)}"
        pool.stack.start_worker(name, pool.queue)
        pool.names.append(name)
        return name

    rel.GpuPool.spawn = spawn
    try:
        result = rel.scenario_kills(stack, alice_api, n_jobs=8, max_kills=2, steps=16, timeout=150, n_workers=1)
    finally:
        rel.GpuPool.spawn = orig_spawn
    assert result["finished_in_time"], result
    assert result["kills"] >= 1, result
    assert result["lost"] == 0 and result["wrong_image_count"] == 0, result
    assert result["duplicated"] == 0 and result["rows_without_bytes"] == 0, result
    assert result["delivered_unchecked"] == 0, result
    assert result["max_attempts"] >= 2, result


def test_a_database_outage_answers_503_with_retry_after_and_writes_nothing(alice, alice_api):
    job = GenerationJob.objects.create(owner=alice, prompt="probe", width=64, height=64, steps=2, guidance_scale=5.0,
                                       seed=1, model_version="tiny-random", stage="prompt")
    session = Client()
    session.force_login(alice)
    result = rel.scenario_db_outage(alice.auth_token.key, job_id=str(job.id), session_client=session)
    by = {(r["mode"], r["request"]): r for r in result["detail"]}
    post = by[("unreachable", "POST /api/v1/jobs")]
    assert post["status"] == 503 and post["retry_after"] and "database" in post["detail"], post
    assert by[("unreachable", "(rows added)")]["rows_added"] == 0
    if ("locked", "POST /api/v1/jobs") in by:  # SQLite only: another writer holds the lock
        # Not an outage: the database answers, a writer holds it past the wait. That is the
        # server being busy (429 server_busy, a short Retry-After), as with a full pool.
        post = by[("locked", "POST /api/v1/jobs")]
        assert post["status"] == 429 and post["retry_after"] and "busy" in post["detail"], post
        assert by[("locked", "(rows added)")]["rows_added"] == 0
    for name in ("GET /api/v1/jobs", "GET /api/v1/jobs/{id}", "POST /api/v1/jobs/{id}/cancel", "DELETE /api/v1/jobs/{id}",
                 "POST /api/v1/jobs (session)"):
        r = by[("unreachable", name)]
        assert r["status"] == 503 and r["retry_after"], r
    assert by[("unreachable", "GET /readyz")]["status"] == 503
    assert GenerationJob.objects.filter(id=job.id, status="queued").exists()  # cancel/delete changed nothing
    assert GenerationJob.objects.count() == 1


def test_the_event_stream_answers_503_during_a_database_outage(alice):
    job = GenerationJob.objects.create(owner=alice, prompt="probe", width=64, height=64, steps=2, guidance_scale=5.0,
                                       seed=1, model_version="tiny-random", stage="prompt")
    result = rel.scenario_db_outage(alice.auth_token.key, job_id=str(job.id))
    assert result["500"] == [], result["500"]


def test_the_middleware_turns_database_errors_of_plain_views_into_503(alice):
    job = GenerationJob.objects.create(owner=alice, prompt="probe", width=64, height=64, steps=2, guidance_scale=5.0,
                                       seed=1, model_version="tiny-random", stage="prompt")
    with override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, "jobs.api.errors.ServiceUnavailableMiddleware"]):
        result = rel.scenario_db_outage(alice.auth_token.key, job_id=str(job.id))
    assert result["500"] == [] and result["5xx_other_than_503"] == 0, result["detail"]
    assert result["503_without_retry_after"] == 0 and result["rows_added"] == 0


def test_a_failing_classifier_under_load_never_delivers_an_unchecked_image(workers, alice_api, classifier_off):
    result = rel.scenario_classifier(alice_api, n_jobs=8, steps=2, flip_every=0.5, timeout=150)
    assert result["finished_in_time"], result
    assert result["delivered_unchecked"] == 0 and result["public_images_of_failed_jobs"] == 0, result
    assert result["failed_other"] == 0 and result["lost"] == 0, result  # every job: done, or failed by the gate
    assert result["rows_without_bytes"] == 0


def test_failing_quarantine_writes_send_the_job_back_to_the_queue_and_never_leave_a_row_without_bytes(alice, tmp_path):
    result = rel.scenario_storage(alice, tmp_path)
    for case in result["detail"]:
        assert case["status"] == case["expected"], case
        assert case["rows_without_bytes"] == 0, case
        assert case["rows"] == (case["count"] if case["expected"] == "handed off" else 0), case
    assert result["detail"][0]["save_calls"] == 2  # each image written once: no retry loop at this level
    assert result["detail"][1]["save_calls"] <= 2  # a transient error is not retried here: the job is made again


def test_a_job_the_reaper_requeues_right_after_a_failed_hand_off_counts_as_back_in_the_queue(alice, tmp_path):
    """The reaper (the beat of any cpu worker) may run between the hand-off and the look at the
    job: the lease the hand-off ended lets it requeue the job at once, batch and all."""
    result = rel.scenario_storage(alice, tmp_path, reap=True)
    assert [case["status"] for case in result["detail"]] == [case["expected"] for case in result["detail"]], result
    assert result["failed_cases"] == 0, result


def test_a_failed_upload_leaves_no_object_behind(alice, tmp_path):
    assert rel.scenario_storage(alice, tmp_path)["leftover_objects"] == 0


def test_past_capacity_submits_get_429_with_retry_after_and_never_5xx(workers, worker_env, start_worker, transactional_db):
    env = {**worker_env, "IMAGEGEN_MAX_QUEUE_WAIT": "3", "IMAGEGEN_USER_MAX_IN_FLIGHT": "1000"}
    server = start_daphne(env, settings.VAR_DIR, name="daphne-load", collectstatic=False)
    try:
        tokens = [rel.user_token(f"load{i}") for i in range(4)]
        result = rel.scenario_load(server.url, tokens, rates=[4, 40], seconds=2.0, steps=12, max_threads=24)
    finally:
        stop_daphne(server)
        GenerationJob.objects.filter(status__in=["queued", "running"]).update(**at("cancelled"))
    assert result["5xx"] == 0 and result["errors"] == 0, result
    assert result["429_without_retry_after"] == 0, result
    low, high = result["per_rate"]
    assert low["answers"].get("202", 0) > 0, low
    assert high["429"] > 0, high  # past capacity: shed, not queued without limit
    assert high["p99_ms"] is not None


class _HttpApi:
    """The submit interface bench.reliability uses, over HTTP to a daphne of the private stack."""

    def __init__(self, base_url: str, token: str):
        import httpx

        self.client = httpx.Client(base_url=base_url, headers={"Authorization": f"Token {token}"}, timeout=30)

    def post(self, path: str, body: dict, format: str = "json"):
        return self.client.post(path, json=body)


def test_a_redis_restart_mid_run_loses_no_job_and_the_workers_reconnect(transactional_db, alice, start_worker, tmp_path):
    """A deployment slice with a Redis of its own (whatever REDIS_URL the suite has): web, cpu/io/
    classify worker and GPU worker on a lane of their own; that Redis is killed mid-batch (all
    scheduler state, broker queues and channel layer lost) and started again, empty, on the
    same port."""
    from scripts.private_redis import start

    redis_proc, url = start(tmp_path / "redis")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    env = {"REDIS_URL": url, "IMAGEGEN_MODEL_NAME": "redisrestart"}
    cpu = start_worker("restart-cpu", f"{settings.QUEUE_CPU},{settings.QUEUE_IO},{settings.QUEUE_CLASSIFY},{settings.QUEUE_WEBHOOKS}", beat=True,
                       wait=False, **env)
    gpu = start_worker("restart-gpu", f"{settings.QUEUE_GPU_PREFIX}redisrestart", **env)
    cpu.wait_ready()
    from tests.conftest import _database_url

    web = start_daphne({**os.environ, "DATABASE_URL": _database_url(), "DJANGO_SETTINGS_MODULE": "imagegen.settings",
                        **env}, tmp_path, name="restart-web")
    api = _HttpApi(web.url, alice.auth_token.key)
    try:
        ids = rel.submit_many(api, 6, f"redis-{time.time_ns()}", steps=16)
        deadline = time.monotonic() + 120  # mid-run: a batch is on the GPU worker when Redis goes
        while not GenerationJob.objects.filter(id__in=ids, status="running").exists():
            assert time.monotonic() < deadline, "no batch started"
            time.sleep(0.05)
        redis_proc.kill()
        redis_proc.wait()
        time.sleep(1.0)  # the outage under test: Redis stays away a second (not a synchronisation)
        redis_proc, _ = start(tmp_path / "redis", port=port)
        more = []
        for _ in range(30):
            try:
                more = rel.submit_many(api, 4, f"redis-after-{time.time_ns()}", steps=16)
                break
            except Exception:
                time.sleep(0.5)
        assert more, "no submit succeeded after the restart"
        ids += more
        assert rel.wait_terminal(ids, 120), "jobs still unfinished 120 s after the Redis restart"
        result = rel.audit(ids)
        assert result["duplicated"] == 0 and result["delivered_unchecked"] == 0, result
        assert gpu.proc.poll() is None and cpu.proc.poll() is None
        # the same worker processes reconnected: new work still flows through them
        job = rel.submit_many(api, 1, f"after-{time.time_ns()}", steps=2)[0]
        assert wait_for_status(job, ("done",), timeout=60).status == "done"
        failed = list(GenerationJob.objects.filter(id__in=ids).exclude(status="done"))
        assert result["lost"] == 0, [(j.status, j.reason) for j in failed]
    finally:
        stop_daphne(web)
        gpu.stop()
        cpu.stop()
        redis_proc.terminate()


def test_a_broker_outage_at_commit_answers_consistently(alice_api):
    from unittest import mock

    from kombu.exceptions import OperationalError

    body = {"prompt": "a red circle while the broker is down", "width": 64, "height": 64, "steps": 2, "seed": 9}
    with mock.patch("imagegen.stage_table.current_app.send_task", side_effect=OperationalError("broker down")):
        response = alice_api.post("/api/v1/jobs", body, format="json")
    assert response.status_code in (202, 503), response.status_code  # never a 500
    rows = GenerationJob.objects.filter(prompt=body["prompt"]).count()
    # 202 and a job that the reaper will re-check, or 503 and nothing stored: not 503 and a job
    assert (response.status_code, rows) in ((202, 1), (503, 0)), (response.status_code, rows)
