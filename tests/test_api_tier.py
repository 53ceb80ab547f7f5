"""The API tier: the wait-estimate summary against the replay, ETags, the fast job JSON, busy and
down answers through the real web server (uvicorn, threads, pools), and make run's web processes."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from rest_framework import serializers as drf_serializers
from rest_framework.renderers import JSONRenderer

from imagegen.redis_client import PREFIX
from jobs.admission import replay
from jobs.admission import summary as queue_summary
from jobs.models import FIRST_STAGE, GeneratedImage, GenerationJob
from jobs.representation import JobSerializer
from scheduling import heartbeats, scheduler
from scheduling.costs import COST_KEY
from scripts.procs import free_port, stop_group
from scripts.run import web_command
from tests.conftest import client_for

ROOT = Path(__file__).resolve().parent.parent
MODEL = "sumtest"


@pytest.fixture
def summary_lane(redis_client, settings):
    """A lane of its own with one live GPU worker and a measured cost model; nothing running."""
    settings.IMAGEGEN_BATCH_CAP = 4
    settings.IMAGEGEN_BATCH_CAPS = {}
    settings.IMAGEGEN_FILL_WAIT = 0.3
    settings.IMAGEGEN_STARVATION_SECONDS = 10.0

    def clean():
        for pattern in (f"{PREFIX}q:{MODEL}v|*", f"{PREFIX}qb:{MODEL}v|*", f"{PREFIX}drr:{MODEL}v|*", f"{PREFIX}shapes:{MODEL}", f"{PREFIX}summary:{MODEL}*",
                        f"{PREFIX}arr:{MODEL}:*", f"{PREFIX}workers:{MODEL}"):
            for key in redis_client.scan_iter(pattern):
                redis_client.delete(key)
        redis_client.delete(COST_KEY)

    clean()
    redis_client.zadd(heartbeats.workers_key(MODEL), {"gpu-a": time.time() + 600, "gpu-b": time.time() + 600})
    yield redis_client
    clean()


SHAPES = [scheduler.shape_key(f"{MODEL}v", 64, 64, 20, 5.0, ""), scheduler.shape_key(f"{MODEL}v", 96, 96, 10, 5.0, ""),
          scheduler.shape_key(f"{MODEL}v", 64, 96, 20, 5.0, "")]


def random_workload(r, rng: random.Random) -> dict[str, list]:
    costs = {}
    for shape in SHAPES:
        base = rng.uniform(0.5, 3.0)
        for size in (1, 2, 4):
            costs[f"{shape}#{size}"] = base * (1 + 0.15 * (size - 1))
        costs[shape] = base / 2
    r.hset(COST_KEY, mapping=costs)
    now = time.time()
    queued: dict[str, list] = {}
    for k in range(rng.randrange(5, 120)):
        shape = rng.choice(SHAPES)
        count = rng.choice([1, 1, 1, 2, 4])
        enqueued_at = now - rng.uniform(0, 8)
        scheduler.enqueue(MODEL, shape, f"w{k}", count, enqueued_at)
        queued.setdefault(shape, []).append((f"w{k}", count, enqueued_at))
    return queued


@pytest.mark.django_db
@pytest.mark.parametrize("seed", range(6))
def test_the_summary_answers_what_the_replay_answers_on_random_workloads(summary_lane, seed):
    """Stated error: a new job's estimate is the replay's, moved by the time since it was made; a
    queued job's is the replay's (the summary replays every job of the bucket at once), and a
    job found by its place alone (joined since) gets the samples' at the sampled places."""
    rng = random.Random(seed)
    random_workload(summary_lane, rng)
    for shape in SHAPES:
        for images in (1, 2):
            replayed = replay.estimate(shape, images, model_name=MODEL)
            summarised = queue_summary.new_job_estimate(shape, images, model_name=MODEL)
            # A forecast arrival (at the rate measured, read a moment later by the second replay)
            # may take a fair-share round's room before the new job: then it moves by one pass of
            # its shape (for a one-image job too, when the arrival lands in the same round).
            one_pass = max(float(v) for k, v in summary_lane.hgetall(COST_KEY).items() if k.startswith(shape + "#"))
            assert summarised.eta_seconds == pytest.approx(replayed.eta_seconds, abs=0.05 + one_pass)
            assert summarised.position == replayed.position
            assert summarised.queued_images == replayed.queued_images

    entries = scheduler.queued_entries(MODEL)
    for shape, bucket in entries.items():
        summary = queue_summary.entry(MODEL, f"bucket|{shape}", lambda s=shape: queue_summary._compute_bucket(s, MODEL))
        places = [p for p, _ in summary["samples"]]
        assert places[0] == 0 and places[-1] == len(bucket) - 1
        for index, (job_id, count, enqueued_at) in enumerate(bucket):
            replayed = replay.estimate(shape, count, enqueued_at=enqueued_at, model_name=MODEL, job_id=job_id)
            summarised = queue_summary.queued_job_estimate(shape, count, enqueued_at, model_name=MODEL, job_id=job_id)
            assert summarised.position == replayed.position  # exact: counted in Redis
            # Nothing runs in this lane, so a fresh replay starts its idle GPUs at its own "now":
            # the summary, made `age` seconds earlier, is that much ahead of it. Each job's ETA is
            # its own from the summary's one replay (fair share does not serve in FIFO order).
            # Forecast arrivals (at the measured rate, which the later replay reads a moment
            # later) overtake a queued job of more images by rounds, so one of them more or less
            # can move it by one pass of its shape.
            slack = time.time() - summary["at"] + 0.05
            one_pass = max(float(v) for k, v in summary_lane.hgetall(COST_KEY).items() if k.startswith(shape + "#"))
            assert summarised.eta_seconds == pytest.approx(replayed.eta_seconds, abs=slack + one_pass)
            if index in places:  # a job that joined since is interpolated between these samples
                # The same forecast arrivals as above can move it by one pass (CI: 5.92 against
                # 6.42 with a slack of 0.06: the replay read the arrival rate a moment later).
                by_place = queue_summary.queued_job_estimate(shape, count, enqueued_at, model_name=MODEL)
                assert by_place.eta_seconds == pytest.approx(replayed.eta_seconds, abs=slack + one_pass)


@pytest.mark.django_db
def test_a_costly_summary_is_answered_while_one_background_refresh_recomputes_it(summary_lane, monkeypatch):
    # No cpu worker's refresher (a session's workers may run one): this process refreshes it.
    monkeypatch.setattr(queue_summary, "_alive_key", lambda: f"{PREFIX}summary-refresher-of-nobody")
    random_workload(summary_lane, random.Random(99))
    shape = SHAPES[0]
    first = queue_summary.entry(MODEL, f"new|{shape}|1", lambda: queue_summary._compute_new(shape, 1, MODEL))
    # Make the stored entry look stale and costly (a long queue): the next request must not
    # replay in its own time, but answer from it and have it refreshed in the background.
    stale = {**first, "at": first["at"] - 12, "cost": 0.5}  # fresh for 20 x 0.5 s: stale, costly
    summary_lane.hset(f"{PREFIX}summary:{MODEL}", f"new|{shape}|1", json.dumps(stale))
    calls = []

    def compute():
        calls.append(time.time())
        return queue_summary._compute_new(shape, 1, MODEL)

    answered = queue_summary.entry(MODEL, f"new|{shape}|1", compute)
    assert answered["at"] == stale["at"]  # the stale entry, at once
    deadline = time.monotonic() + 120
    while not calls or json.loads(summary_lane.hget(f"{PREFIX}summary:{MODEL}", f"new|{shape}|1"))["at"] == stale["at"]:
        assert time.monotonic() < deadline, "the background refresh never ran"
        time.sleep(0.02)
    assert len(calls) == 1


def make_job(owner, status="done", **extra) -> GenerationJob:
    return GenerationJob.objects.create(owner=owner, prompt="a red circle", width=64, height=64, steps=2,
                                        guidance_scale=5.0, seed=1, model_version="tiny-random", stage=FIRST_STAGE[status],
                                        progress_total=2, **extra)


def test_the_fast_job_json_is_what_drf_would_render(alice):
    from django.utils import timezone

    done = make_job(alice, started_at=timezone.now(), finished_at=timezone.now(), progress_step=2, degraded=True,
                    requested_steps=9)
    GeneratedImage.objects.create(job=done, index=0, seed=1, storage_key="i/" + "a" * 32 + ".png", width=64, height=64,
                                  byte_size=10, sha256="0" * 64)
    blocked = make_job(alice, status="blocked", reason="no", blocked_stage="prompt", appealed_at=timezone.now(), appeal_note="x")
    queued = make_job(alice, status="queued", output_format="jpeg", output_compression=80)
    from unittest import mock

    for job in GenerationJob.objects.filter(id__in=[done.id, blocked.id, queued.id]).select_related("batch"):
        # The fast path is the one taken (a field added to Meta alone silently falls back to
        # DRF's generic path, a third of a submit's CPU: that happened once, unnoticed).
        with mock.patch.object(drf_serializers.ModelSerializer, "to_representation",
                               side_effect=AssertionError("the generic path ran")):
            fast = JobSerializer(job).data
        generic = drf_serializers.ModelSerializer.to_representation(JobSerializer(job), job)
        assert JSONRenderer().render(fast) == JSONRenderer().render(generic)


def test_a_job_get_carries_an_etag_and_answers_304_while_it_has_not_changed(alice):
    job = make_job(alice, status="running", progress_step=1)
    api = client_for(alice)
    first = api.get(f"/api/v1/jobs/{job.id}")
    etag = first["ETag"]
    assert first.status_code == 200 and etag.startswith('"')
    again = api.get(f"/api/v1/jobs/{job.id}", HTTP_IF_NONE_MATCH=etag)
    assert again.status_code == 304 and again.content == b"" and again["ETag"] == etag
    assert api.get(f"/api/v1/jobs/{job.id}", HTTP_IF_NONE_MATCH=f'"other", W/{etag}').status_code == 304
    GenerationJob.objects.filter(id=job.id).update(progress_step=2)
    changed = api.get(f"/api/v1/jobs/{job.id}", HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200 and changed["ETag"] != etag and changed.json()["progress"]["step"] == 2


# --- through the real web server ---

def start_web(env: dict, **overrides: str) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    log_path = Path(settings.VAR_DIR) / f"web-{port}.log"
    full = {**env, "IMAGEGEN_WEB_PROCESSES": "1", **overrides}
    proc = subprocess.Popen(web_command(full, str(port)), cwd=ROOT, env=full, stdout=open(log_path, "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url, log_path
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_group(proc, 5)
            raise RuntimeError(log_path.read_text()[-3000:])
        time.sleep(0.1)


async def burst(url: str, token: str, n: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        async def one(i: int) -> httpx.Response:
            return await client.post("/api/v1/jobs", json={"prompt": f"a red circle {i}", "steps": 2},
                                     headers={"Authorization": f"Token {token}"})
        return await asyncio.gather(*(one(i) for i in range(n)))


def assert_no_5xx_but_503_and_all_refusals_say_when(answers: list[httpx.Response], allowed: set[int]) -> dict[int, int]:
    codes: dict[int, int] = {}
    for a in answers:
        codes[a.status_code] = codes.get(a.status_code, 0) + 1
        assert a.status_code in allowed, (a.status_code, a.text[:300])
        if a.status_code in (429, 503):
            assert int(a.headers["Retry-After"]) >= 1
            assert a.json()["detail"]
    return codes


def test_a_burst_that_exhausts_the_pools_is_answered_429_with_retry_after_never_500(worker_env, alice, monkeypatch):
    # One Redis connection for eight threads and 1 ms to wait for it: many requests cannot get
    # one in time (busy: 429); none may turn into a 500 or a 503 (Redis is up).
    proc, url, log_path = start_web(worker_env, IMAGEGEN_WEB_THREADS="8", IMAGEGEN_WEB_BACKLOG="200",
                                    IMAGEGEN_REDIS_POOL_SIZE="1", IMAGEGEN_REDIS_POOL_TIMEOUT="0.001",
                                    IMAGEGEN_USER_MAX_IN_FLIGHT="100000")
    try:
        codes = assert_no_5xx_but_503_and_all_refusals_say_when(asyncio.run(burst(url, alice.auth_token.key, 40)), {202, 429})
        assert codes.get(429, 0) >= 1, (codes, log_path.read_text()[-2000:])
    finally:
        stop_group(proc, 10)
    # Past threads + backlog, the process sheds at once with 429 instead of queueing.
    proc, url, _ = start_web(worker_env, IMAGEGEN_WEB_THREADS="2", IMAGEGEN_WEB_BACKLOG="2",
                             IMAGEGEN_USER_MAX_IN_FLIGHT="100000")
    try:
        codes = assert_no_5xx_but_503_and_all_refusals_say_when(asyncio.run(burst(url, alice.auth_token.key, 40)), {202, 429})
        assert codes.get(429, 0) >= 1 and codes.get(202, 0) >= 1, codes
    finally:
        stop_group(proc, 10)


def test_with_redis_down_the_answer_is_503_with_retry_after(worker_env, alice):
    proc, url, _ = start_web(worker_env, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", CELERY_BROKER_URL=f"redis://127.0.0.1:{free_port()}/0")
    try:
        codes = assert_no_5xx_but_503_and_all_refusals_say_when(asyncio.run(burst(url, alice.auth_token.key, 4)), {503})
        assert codes == {503: 4}
    finally:
        stop_group(proc, 10)
    GenerationJob.objects.filter(owner=alice).delete()


def test_make_runs_web_processes_come_up_and_serve_rest_and_server_sent_events(worker_env, alice):
    import psutil

    job = make_job(alice, status="done")
    proc, url, _ = start_web(worker_env, IMAGEGEN_WEB_PROCESSES="2")
    try:
        deadline = time.monotonic() + 120
        while len(psutil.Process(proc.pid).children()) < 2:  # uvicorn's supervisor and its 2 workers
            assert time.monotonic() < deadline
            time.sleep(0.1)
        headers = {"Authorization": f"Token {alice.auth_token.key}"}
        with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
            for _ in range(6):  # new connections: the kernel spreads them over both processes
                with httpx.Client(base_url=url, headers=headers, timeout=10) as fresh:
                    assert fresh.get(f"/api/v1/jobs/{job.id}").json()["status"] == "done"
            events = client.get(f"/api/v1/jobs/{job.id}/events")  # an async view, on the event loop
            assert events.status_code == 200 and events.headers["content-type"].startswith("text/event-stream")
            assert '"status": "done"' in events.text
            assert client.get("/api/v1/queue").status_code == 200
    finally:
        stop_group(proc, 10)


@pytest.mark.django_db
def test_a_cheap_new_job_entry_outdated_by_a_submit_is_recomputed_by_the_refresher_not_the_request(summary_lane, monkeypatch):
    # "Cheap" is a measured cost under SYNC_BUDGET; on a loaded machine this replay can take
    # longer, so the budget is raised rather than the machine timed.
    monkeypatch.setattr(queue_summary, "SYNC_BUDGET", 10.0)
    random_workload(summary_lane, random.Random(5))
    shape = SHAPES[1]
    field, key = f"new|{shape}|1", f"{PREFIX}summary:{MODEL}"

    def compute():
        return queue_summary._compute_new(shape, 1, MODEL)

    first = queue_summary.entry(MODEL, field, compute, shape=shape)
    summary_lane.set(queue_summary._alive_key(), "1", px=5000)  # a refresher is alive
    time.sleep(queue_summary.CHANGE_FACTOR * first["cost"] + 0.001)
    same = queue_summary.entry(MODEL, field, compute, shape=shape)
    if time.time() - first["at"] <= queue_summary.FRESH_FACTOR * first["cost"]:
        assert same["at"] == first["at"]  # nothing accepted since: still fresh
    queue_summary.note_submit(shape, MODEL)
    answered = queue_summary.entry(MODEL, field, compute, shape=shape)
    assert answered["at"] == first["at"]  # answered as it was: no replay in the request
    assert summary_lane.hget(key, f"want|{field}") is not None
    assert queue_summary.refresh_wanted(MODEL) == 1
    assert json.loads(summary_lane.hget(key, field))["at"] > first["at"]
    assert queue_summary.refresh_wanted(MODEL) == 0  # done: the want is older than the entry
    summary_lane.delete(queue_summary._alive_key())


@pytest.mark.django_db
def test_the_refresher_recomputes_the_costly_entries_requests_found_stale_and_only_those(summary_lane):
    random_workload(summary_lane, random.Random(7))
    key = f"{PREFIX}summary:{MODEL}"
    made = {}
    for shape in SHAPES[:2]:
        first = queue_summary.entry(MODEL, f"new|{shape}|1", lambda s=shape: queue_summary._compute_new(s, 1, MODEL), shape=shape)
        made[shape] = {**first, "at": first["at"] - 12, "cost": 0.5}  # stale and costly
        summary_lane.hset(key, f"new|{shape}|1", json.dumps(made[shape]))
    summary_lane.set(queue_summary._alive_key(), "1", px=5000)  # a refresher is alive: requests leave it the work
    wanted = SHAPES[0]
    answer = queue_summary.new_job_estimate(wanted, 1, model_name=MODEL)
    assert answer.position == made[wanted]["position"]  # answered from the stale entry, no replay here
    assert json.loads(summary_lane.hget(key, f"new|{wanted}|1"))["at"] == made[wanted]["at"]
    assert queue_summary.refresh_wanted(MODEL) == 1
    assert json.loads(summary_lane.hget(key, f"new|{wanted}|1"))["at"] > made[wanted]["at"]
    assert json.loads(summary_lane.hget(key, f"new|{SHAPES[1]}|1"))["at"] == made[SHAPES[1]]["at"]  # nobody asked
    summary_lane.delete(queue_summary._alive_key())


def test_the_summary_refresher_takes_at_most_its_share_of_a_core():
    """After a pass that cost c CPU seconds the refresher waits c x (1/share - 1): a burst that
    outdates every cheap entry at each submit cannot take the prompt checks' core (issue 48)."""
    assert queue_summary.refresher_wait(0.0) == queue_summary.REFRESH_EVERY  # idle: as often as before
    busy = 0.02
    assert busy / (busy + queue_summary.refresher_wait(busy)) == pytest.approx(queue_summary.REFRESHER_SHARE)
    assert queue_summary.refresher_wait(100.0) < queue_summary.ALIVE_TTL  # its liveness never lapses between passes
