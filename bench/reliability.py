"""Fault, load and abuse suite against the real stack (issue 11).

    .venv/bin/python bench/reliability.py            # reduced sizes (what `make test` runs)
    .venv/bin/python bench/reliability.py --full     # full sizes; writes bench/results/reliability.json
    .venv/bin/python bench/reliability.py --only kills,redis --out /tmp/r.json

The stack is scripts/stack.Stack: a private Redis (restartable on its port), the database
(SQLite file, or DATABASE_URL), Celery workers (cpu+io with the reaper beat, GPU workers) and
daphne, each a separate process. This process drives it: submissions through DRF's APIClient
(in-process Django pointed at the same database and Redis, as bench/batching.py does) or, for
the load scenario, over HTTP on loopback to daphne. The image classifier of the GPU workers is
tests.fake_classifiers.Scripted: a real image gate over a classifier whose behaviour this
process scripts through Redis (allow, raise, hang, return nothing, ...).

Scenarios (each returns a dict of counts; see docs/reliability.md):
  kills       SIGKILL GPU workers (whole process group) mid-batch again and again, restarting them
  redis       kill Redis mid-run and start an empty one on the same port
  db          database outage: 503 + Retry-After, never 500, nothing half-written
  classifier  classifier raises / hangs / returns nothing while jobs flow: nothing delivered unchecked
  storage     uploads fail transiently / always: retried, never a row without bytes
  load        rising open-loop submit rates against daphne: 429 + Retry-After past capacity, no 5xx
  fuzz        property-based bodies, headers, query strings and paths (hypothesis): no 5xx, nothing stored
  abuse       per-user limits under concurrency and abuse (bench/reliability_abuse.py)
  watchers    websockets and SSE through a Redis restart, and opened while it is down
The functions that need no stack (db, classifier, storage, fuzz) also run inside pytest against
the test session's own workers (tests/test_reliability.py, tests/test_abuse.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import random
import socket
import sqlite3
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.procs import free_port  # noqa: E402

TERMINAL = ("done", "failed", "blocked", "cancelled")
ALL_SCENARIOS = ("fuzz", "db", "storage", "classifier", "kills", "redis", "load", "abuse", "watchers")

SIZES = {
    "full": {"kill_jobs": 200, "max_kills": 10, "redis_jobs": 40, "classifier_jobs": 40, "fuzz_requests": 10000,
             "rates": [2, 5, 10, 20, 40], "rate_seconds": 4.0, "steps": 12},
    "reduced": {"kill_jobs": 20, "max_kills": 3, "redis_jobs": 12, "classifier_jobs": 12, "fuzz_requests": 1000,
                "rates": [5, 40], "rate_seconds": 2.5, "steps": 12},
}


# ----------------------------------------------------------------------------------------
# helpers (in-process Django must be set up before these are called)
# ----------------------------------------------------------------------------------------


def api_client(token: str):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def user_token(username: str) -> str:
    """A new API token for the user (created if needed); tokens are stored hashed, so each call
    issues one."""
    from django.contrib.auth import get_user_model

    from jobs.access.tokens import issue

    user, _ = get_user_model().objects.get_or_create(username=username)
    return issue(user, name="bench")


def submit_many(client, n: int, tag: str, steps: int, counts=(1, 2), size=(64, 64)) -> list[str]:
    """n jobs with distinct prompts and seeds (no request-hash cache sharing)."""
    rng = random.Random(tag)
    ids = []
    for i in range(n):
        body = {"prompt": f"a red circle on a blue background {tag} {i}", "width": size[0], "height": size[1],
                "steps": steps, "seed": 100000 * (abs(hash(tag)) % 1000) + i, "count": rng.choice(counts)}
        r = client.post("/api/v1/jobs", body, format="json")
        if r.status_code != 202:
            raise RuntimeError(f"submit {i} answered {r.status_code}: {r.content[:300]!r}")
        ids.append(r.json()["id"])
    return ids


def wait_terminal(ids, timeout: float, on_tick=None) -> bool:
    from jobs.models import GenerationJob

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if on_tick is not None:
            on_tick()
        if not GenerationJob.objects.filter(id__in=ids).exclude(status__in=TERMINAL).exists():
            return True
        time.sleep(0.2)
    return False


def audit(ids) -> dict:
    """Counts over a set of accepted jobs: lost (not done), wrong image counts, duplicates,
    rows without bytes, delivered images without an allow verdict."""
    from django.db.models import Count

    from jobs.media.storage import storage_for_tier
    from jobs.models import GeneratedImage, GenerationJob
    from safety.models import SafetyVerdict

    jobs = list(GenerationJob.objects.filter(id__in=ids))
    images = list(GeneratedImage.objects.filter(job_id__in=ids))
    by_status: dict[str, int] = {}
    for job in jobs:
        by_status[job.status] = by_status.get(job.status, 0) + 1
    per_job = {row["job_id"]: row["n"] for row in GeneratedImage.objects.filter(job_id__in=ids).values("job_id").annotate(n=Count("id"))}
    wrong_count = [str(j.id) for j in jobs if j.status == "done" and per_job.get(j.id, 0) != j.count]
    pairs = [(im.job_id, im.index) for im in images]
    keys = [im.storage_key for im in images]
    without_bytes = 0
    for im in images:
        storage = storage_for_tier(im.tier)
        if storage is None or not storage.exists(im.storage_key):
            without_bytes += 1
    allowed = set(SafetyVerdict.objects.filter(job_id__in=ids, stage__in=["image", "human"], decision="allow")
                  .values_list("image_id", flat=True))
    public = [im for im in images if im.tier == "public"]
    unchecked = [im for im in public if im.id not in allowed]
    delivered_not_done = [im for im in public if next(j for j in jobs if j.id == im.job_id).status != "done"]
    return {
        "jobs": len(ids),
        "found": len(jobs),
        "by_status": by_status,
        "lost": len(ids) - by_status.get("done", 0),
        "wrong_image_count": len(wrong_count),
        "duplicated": (len(pairs) - len(set(pairs))) + (len(keys) - len(set(keys))),
        "rows_without_bytes": without_bytes,
        "delivered_unchecked": len(unchecked) + len(delivered_not_done),
        "images": len(images),
        "max_attempts": max((j.attempts for j in jobs), default=0),
        "jobs_with_attempts_ge_2": sum(1 for j in jobs if j.attempts >= 2),
    }


def orphan_objects(ids_images_keys: set[str]) -> int:
    """Objects in the local public/quarantine folders that no row points at (a leak, not a
    correctness failure: e.g. a worker killed between upload and commit)."""
    from django.conf import settings

    from jobs.models import GeneratedImage

    known = set(GeneratedImage.objects.values_list("storage_key", flat=True))
    n = 0
    for base in (Path(settings.MEDIA_ROOT), Path(settings.VAR_DIR) / "quarantine"):
        if base.exists():
            for path in base.rglob("*.png"):
                if str(path.relative_to(base)) not in known:
                    n += 1
    return n


# ----------------------------------------------------------------------------------------
# 1. worker kills (stack)
# ----------------------------------------------------------------------------------------


class GpuPool:
    """GPU workers of a Stack, restarted after each kill as the supervisor does."""

    def __init__(self, stack, n: int):
        from django.conf import settings

        self.stack, self.queue, self.serial = stack, settings.QUEUE_GPU, 0
        self.names: list[str] = []
        for _ in range(n):
            self.spawn()

    def spawn(self) -> str:
        self.serial += 1
        name = f"gpu{self.serial}"
        self.stack.start_worker(name, self.queue)
        self.names.append(name)
        return name

    def worker_id(self, name: str) -> str:
        return f"{socket.gethostname()}:{self.stack.procs[name].pid}"

    def kill_and_restart(self, name: str) -> str:
        self.stack.kill(name)
        self.names.remove(name)
        return self.spawn()


def scenario_kills(stack, client, n_jobs: int, max_kills: int, steps: int, timeout: float = 900.0,
                   n_workers: int = 2) -> dict:
    from jobs.models import GenerationJob

    pool = GpuPool(stack, n_workers)
    ids = submit_many(client, n_jobs, f"kills-{time.time_ns()}", steps)
    kills: list[dict] = []
    rng = random.Random(11)
    last_kill = [0.0]

    def tick():
        if len(kills) >= max_kills or time.monotonic() - last_kill[0] < 2.0:
            return
        for name in list(pool.names):
            wid = pool.worker_id(name)
            running = list(GenerationJob.objects.filter(id__in=ids, status="running", batch__worker=wid)
                           .values_list("id", "progress_step", "batch_id"))
            if running:
                time.sleep(rng.uniform(0.0, 0.3))  # somewhere in the middle of the batch
                still = GenerationJob.objects.filter(id__in=[r[0] for r in running], status="running").count()
                pool.kill_and_restart(name)
                last_kill[0] = time.monotonic()
                kills.append({"worker": wid, "jobs_in_batch": len(running), "still_running_at_kill": still})
                return

    started = time.monotonic()
    finished = wait_terminal(ids, timeout, on_tick=tick)
    result = {"finished_in_time": finished, "seconds": round(time.monotonic() - started, 1), "kills": len(kills),
              "kills_detail": kills, **audit(ids)}
    for name in list(pool.names):
        stack.stop(name)
    return result


# ----------------------------------------------------------------------------------------
# 2. Redis restart (stack)
# ----------------------------------------------------------------------------------------


def scenario_redis(stack, client, n_jobs: int, steps: int, mid_submit: bool, timeout: float = 300.0) -> dict:
    """Submit jobs, kill Redis while they are queued/running (mid_submit: also while some are
    still waiting for their prompt check), start an empty Redis on the same port, and check that
    the reaper rebuilds the queue from the database and the same worker processes finish the
    work (they reconnect)."""
    from jobs.models import Batch, GenerationJob

    pool = GpuPool(stack, 1)
    gpu_name = pool.names[0]
    gpu_pid = stack.procs[gpu_name].pid
    stack.wait_for_gpu_workers(stack.env.get("IMAGEGEN_MODEL_NAME", "shapes"), 1, timeout=180)
    tag = f"redis-{time.time_ns()}"
    ids = submit_many(client, n_jobs // 2, tag + "a", steps)
    if not mid_submit:  # every job past its prompt check and in the (about to be lost) buckets
        deadline = time.monotonic() + 60
        while GenerationJob.objects.filter(id__in=ids, scheduled_at=None, status="queued").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    # mid-run: a batch is on the GPU worker when Redis goes away
    deadline = time.monotonic() + 60
    while not GenerationJob.objects.filter(id__in=ids, status="running").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    restarted_at = time.time()
    before: dict[str, int] = {}
    for status in GenerationJob.objects.filter(id__in=ids).values_list("status", flat=True):
        before[status] = before.get(status, 0) + 1
    stack.restart_redis(down_seconds=1.0)
    # the second half goes in after the restart, through the new, empty Redis
    submitted_after = []
    for _ in range(30):
        try:
            submitted_after = submit_many(client, n_jobs - len(ids), tag + "b", steps)
            break
        except Exception:  # the in-process clients reconnect on their own; retry shortly
            time.sleep(0.5)
    ids += submitted_after
    started = time.monotonic()
    finished = wait_terminal(ids, timeout)
    alive = stack.procs.get(gpu_name) is not None and stack.procs[gpu_name].poll() is None

    import datetime

    after = datetime.datetime.fromtimestamp(restarted_at, tz=datetime.UTC)
    by_original = Batch.objects.filter(jobs__id__in=ids, started_at__gt=after,
                                       worker=f"{socket.gethostname()}:{gpu_pid}").distinct().count()
    result = {"finished_in_time": finished, "seconds_after_restart": round(time.monotonic() - started, 1),
              "status_at_restart": before, "gpu_worker_survived": alive,
              "batches_by_the_same_gpu_worker_after_restart": by_original,
              "workers_reconnected": alive and by_original > 0, **audit(ids)}
    for name in list(pool.names):
        stack.stop(name)
    return result


# ----------------------------------------------------------------------------------------
# 3. database outage (in-process)
# ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def database_unreachable():
    """Point this process's connection at a database that cannot be opened: SQLite, a file in a
    folder that does not exist; PostgreSQL, a closed loopback port."""
    from django.db import connections

    conn = connections["default"]
    conn.close()
    saved = {k: conn.settings_dict.get(k) for k in ("NAME", "HOST", "PORT", "OPTIONS")}
    if conn.vendor == "sqlite":
        conn.settings_dict["NAME"] = "/nonexistent-imagegen-outage/db.sqlite3"
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed_port = s.getsockname()[1]
        conn.settings_dict.update(HOST="127.0.0.1", PORT=str(closed_port),
                                  OPTIONS={**(saved["OPTIONS"] or {}), "connect_timeout": 2})
    try:
        yield
    finally:
        conn.close()
        conn.settings_dict.update(saved)


@contextlib.contextmanager
def database_locked(timeout: float = 1.0):
    """SQLite only: another connection holds an exclusive lock; this process waits `timeout`
    seconds (instead of the app's 30) for it. Writes fail; WAL readers may still read."""
    from django.db import connections

    conn = connections["default"]
    if conn.vendor != "sqlite":
        yield False
        return
    conn.close()
    saved = dict(conn.settings_dict["OPTIONS"])
    conn.settings_dict["OPTIONS"] = {**saved, "timeout": timeout}
    holder = sqlite3.connect(conn.settings_dict["NAME"], timeout=5, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield True
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        conn.close()
        conn.settings_dict["OPTIONS"] = saved


def _outage_requests(token: str, job_id: str | None, session_client=None):
    """(name, callable returning a response) for every API entry point the outage must cover."""
    from django.test import Client

    api = api_client(token)
    body = {"prompt": "a green square during an outage", "width": 64, "height": 64, "steps": 2, "seed": 4242}
    reqs = [
        ("POST /api/v1/jobs", lambda: api.post("/api/v1/jobs", body, format="json")),
        ("GET /api/v1/jobs", lambda: api.get("/api/v1/jobs")),
        ("GET /api/v1/queue", lambda: api.get("/api/v1/queue")),
        ("GET /readyz", lambda: Client().get("/readyz")),
    ]
    if job_id:
        reqs += [
            ("GET /api/v1/jobs/{id}", lambda: api.get(f"/api/v1/jobs/{job_id}")),
            ("POST /api/v1/jobs/{id}/cancel", lambda: api.post(f"/api/v1/jobs/{job_id}/cancel")),
            ("DELETE /api/v1/jobs/{id}", lambda: api.delete(f"/api/v1/jobs/{job_id}")),
            ("GET /api/v1/jobs/{id}/events", lambda: api.get(f"/api/v1/jobs/{job_id}/events")),
        ]
    if session_client is not None:
        reqs.append(("POST /api/v1/jobs (session)", lambda: session_client.post("/api/v1/jobs", body, content_type="application/json")))
    return reqs


def _call(fn) -> tuple[int, dict, str]:
    try:
        r = fn()
    except Exception as exc:  # the test client re-raises what the server would answer 500 to
        return 500, {}, f"{type(exc).__name__}: {exc}"[:300]
    detail = ""
    with contextlib.suppress(Exception):
        detail = json.loads(b"".join(r.streaming_content) if r.streaming else r.content).get("detail", "")
    return r.status_code, {"Retry-After": r.headers.get("Retry-After")}, str(detail)[:300]


def scenario_db_outage(token: str, job_id: str | None = None, session_client=None) -> dict:
    """Every entry point during an outage: 503 + Retry-After + detail (or a 200 read that the
    outage did not touch), never 500; and no job row is added by the submits."""
    from jobs.models import GenerationJob

    def run(mode_cm, mode: str) -> list[dict]:
        out = []
        before = GenerationJob.objects.count()
        with mode_cm as active:
            if active is False:
                return []
            for name, fn in _outage_requests(token, job_id, session_client):
                status, headers, detail = _call(fn)
                out.append({"mode": mode, "request": name, "status": status, "retry_after": headers.get("Retry-After"),
                            "detail": detail})
        after = GenerationJob.objects.count()
        out.append({"mode": mode, "request": "(rows added)", "status": None, "rows_added": after - before})
        return out

    rows = run(database_unreachable(), "unreachable") + run(database_locked(), "locked")
    answered = [r for r in rows if r["status"] is not None]
    return {
        "requests": len(answered),
        "5xx_other_than_503": sum(1 for r in answered if r["status"] >= 500 and r["status"] != 503),
        "503_without_retry_after": sum(1 for r in answered if r["status"] == 503 and not r["retry_after"]
                                       and r["request"] != "GET /readyz"),
        "500": [r["request"] for r in answered if r["status"] == 500],
        "rows_added": sum(r.get("rows_added", 0) for r in rows),
        "detail": rows,
    }


# ----------------------------------------------------------------------------------------
# 4. classifier failures under load (needs a GPU worker with the Scripted classifier)
# ----------------------------------------------------------------------------------------


def scenario_classifier(client, n_jobs: int, steps: int, flip_every: float = 0.7, timeout: float = 300.0) -> dict:
    from tests import fake_classifiers

    modes = [None, "raise", "none", "short", "hang", None, "raise"]
    stop = threading.Event()
    flips = [0]

    def flipper():
        i = 0
        while not stop.is_set():
            fake_classifiers.set_mode(modes[i % len(modes)])
            flips[0] += 1
            i += 1
            stop.wait(flip_every)

    thread = threading.Thread(target=flipper, daemon=True)
    thread.start()
    try:
        ids = submit_many(client, n_jobs, f"clf-{time.time_ns()}", steps, counts=(1, 2, 3))
        finished = wait_terminal(ids, timeout)
    finally:
        stop.set()
        thread.join()
        fake_classifiers.set_mode(None)
    from jobs.models import GeneratedImage, GenerationJob

    res = audit(ids)
    failed = list(GenerationJob.objects.filter(id__in=ids, status="failed"))
    res.update({
        "finished_in_time": finished,
        "mode_flips": flips[0],
        "failed_with_gate_reason": sum(1 for j in failed if "image safety check failed" in j.reason),
        "failed_other": sum(1 for j in failed if "image safety check failed" not in j.reason),
        "public_images_of_failed_jobs": GeneratedImage.objects.filter(job__in=failed, tier="public").count(),
    })
    res["lost"] = res["jobs"] - res["by_status"].get("done", 0) - res["by_status"].get("failed", 0)
    return res


# ----------------------------------------------------------------------------------------
# 5. storage failures (in-process, through the GPU worker's hand-off to quarantine)
# ----------------------------------------------------------------------------------------


def flaky_storage_class():
    from django.core.files.storage import FileSystemStorage

    class FlakyStorage(FileSystemStorage):
        """A real local storage whose first `fail` saves write half a file and raise OSError
        (or `exc`), like a dropped connection mid-upload."""

        def __init__(self, location, fail: int, exc: type[BaseException] = OSError, fail_on_call: int | None = None):
            super().__init__(location=location)
            self.fail, self.exc, self.calls, self.fail_on_call = fail, exc, 0, fail_on_call

        def _save(self, name, content):
            self.calls += 1
            failing = self.calls <= self.fail if self.fail_on_call is None else self.calls >= self.fail_on_call
            if failing:
                path = Path(self.path(name))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content.read()[:7])  # half written
                raise self.exc(f"simulated storage failure on call {self.calls}")
            return super()._save(name, content)

    return FlakyStorage


def _running_job(owner, count: int, tag: str):
    """A job claimed by a batch that has just been denoised (stage generate, attempt 1), of a
    model version no GPU worker serves: a job the reaper requeues stays queued for the scenario
    to see (a worker of the served lane took it again at once, running before it looked)."""
    from django.utils import timezone

    from jobs.models import Batch, GenerationJob, at
    from scheduling.lanes import lane_of

    version = "storage-scenario"
    batch = Batch.objects.create(model_version=version, width=64, height=64, steps=2,
                                 guidance_scale=5.0, size=count, cap=count, lane=lane_of(version))
    return GenerationJob.objects.create(
        owner=owner, prompt=f"storage test {tag}", width=64, height=64, steps=2, guidance_scale=5.0,
        seed=random.randrange(2**31), count=count, model_version=version, **at("generate"),
        attempts=1, started_at=timezone.now(), scheduled_at=timezone.now(), progress_total=2, batch=batch,
        lease_expires_at=timezone.now() + timezone.timedelta(seconds=60),
    )


def scenario_storage(owner, workdir: Path, reap: bool = False) -> dict:
    """The GPU worker's hand-off to quarantine against a storage that fails: (fails N times then
    works, exception type, fail from call k on) x count. The hand-off writes each image once (on S3
    botocore retries transient errors itself); a transient error sends the job back to the queue
    (its lease ends now), never failed; a refusal fails the job. Never a row without
    bytes, never an object left behind. `reap`: the reaper's pass runs right after each
    hand-off (as a reaper running beside it may), and requeues at once a job whose lease the
    hand-off ended."""
    import threading
    from unittest import mock

    from django.utils import timezone
    from PIL import Image

    import jobs.media.storage
    from gpu_tasks import generate
    from gpu_tasks.pipeline import Row
    from jobs import actions
    from jobs.models import GeneratedImage, GenerationJob

    Flaky = flaky_storage_class()
    cases = [
        ("works", dict(fail=0), 2, "handed off"),
        ("one transient error: back to the queue", dict(fail=1), 2, "back to the queue"),
        ("always fails (OSError): back to the queue", dict(fail=10**6), 2, "back to the queue"),
        ("permission denied (not retried)", dict(fail=10**6, exc=PermissionError), 1, "failed"),
        ("second image fails for good", dict(fail=0, fail_on_call=2, exc=PermissionError), 3, "failed"),
    ]
    results = []
    runner = generate.Runner("storage-scenario")
    try:
        for i, (name, kw, count, expect) in enumerate(cases):
            location = workdir / f"storage-case-{i}"
            storage = Flaky(location, **kw)
            job = _running_job(owner, count, name)
            rows = [Row(str(job.id), k, job.prompt, "", job.seed + k) for k in range(count)]
            images = [Image.new("RGB", (64, 64), (k * 40, 0, 0)) for k in range(count)]
            claimed = generate.Claimed(job.batch, [job], {str(job.id): count})
            item = generate.Denoised(claimed, rows, images, set(), time.time(), 0.1)
            canceller = None
            if expect == "cancelled":
                canceller = threading.Timer(1.0, lambda j=job: actions.cancel_job(GenerationJob.objects.get(id=j.id)))
                canceller.start()
            with mock.patch.object(jobs.media.storage, "quarantine_storage", return_value=storage), \
                    mock.patch.object(generate, "quarantine_storage", return_value=storage), \
                    mock.patch.object(generate.stages, "send_next"):
                runner._hand_off(item)
            if reap:
                actions.requeue_expired()
            if canceller is not None:
                canceller.join()
            job.refresh_from_db()
            batch = job.batch  # None: the reaper has already put the job back in the queue
            if batch is not None:
                batch.refresh_from_db()
            made = list(GeneratedImage.objects.filter(job=job))
            files = sorted(str(p.relative_to(location)) for p in location.rglob("*") if p.is_file()) if location.exists() else []
            rows_without_bytes = sum(1 for r in made if not storage.exists(r.storage_key) or storage.size(r.storage_key) != r.byte_size)
            leftover = [f for f in files if f not in {r.storage_key for r in made}]
            status = "handed off" if job.status == "running" and batch is not None and batch.stage == "classify" else job.status
            if status == "running" and job.lease_expires_at is not None and job.lease_expires_at <= timezone.now():
                status = "back to the queue"  # its lease ended now: the reaper requeues it at once, no failure
            elif status == "queued" and batch is None and job.attempts == 1:
                status = "back to the queue"  # the reaper did so already
            results.append({"case": name, "count": count, "status": status, "expected": expect, "reason": job.reason,
                            "rows": len(made), "save_calls": storage.calls, "rows_without_bytes": rows_without_bytes,
                            "leftover_objects": len(leftover), "ok": status == expect and not rows_without_bytes
                            and not leftover and (len(made) == count if expect == "handed off" else len(made) == 0)})
            GenerationJob.objects.filter(id=job.id).delete()
    finally:
        runner.close(timeout=5)
    return {"cases": len(results), "failed_cases": sum(1 for r in results if not r["ok"]),
            "rows_without_bytes": sum(r["rows_without_bytes"] for r in results),
            "leftover_objects": sum(r["leftover_objects"] for r in results), "detail": results}


# ----------------------------------------------------------------------------------------
# 6. load (stack, over HTTP to daphne)
# ----------------------------------------------------------------------------------------


def _pct(values, q: float):
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1)


def scenario_load(base_url: str, tokens: list[str], rates: list[float], seconds: float, steps: int,
                  max_threads: int = 48) -> dict:
    """Open-loop submits at each rate for `seconds`, spread over users; per rate: answers by
    status, p50/p99 latency of accepted (202) submits, 429s with and without Retry-After."""
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    local = threading.local()

    def client():
        if not hasattr(local, "c"):
            local.c = httpx.Client(base_url=base_url, timeout=30.0)
        return local.c

    def one(i: int, rate: float):
        body = {"prompt": f"a blue triangle under load {rate} {i} {time.time_ns()}", "width": 64, "height": 64,
                "steps": steps, "seed": i}
        headers = {"Authorization": f"Token {tokens[i % len(tokens)]}"}
        t0 = time.perf_counter()
        try:
            r = client().post("/api/v1/jobs", json=body, headers=headers)
        except Exception as exc:
            return ("error", type(exc).__name__, time.perf_counter() - t0, None, None)
        jid = r.json().get("id") if r.status_code == 202 else None
        return (r.status_code, r.headers.get("Retry-After"), time.perf_counter() - t0, jid, None)

    per_rate = []
    accepted_ids: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(max_threads) as pool:
        for rate in rates:
            n = max(1, int(rate * seconds))
            t_start = time.perf_counter()
            futures = []
            for i in range(n):
                delay = t_start + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                futures.append(pool.submit(one, i, rate))
            answers = [f.result() for f in futures]
            codes: dict[str, int] = {}
            for a in answers:
                codes[str(a[0])] = codes.get(str(a[0]), 0) + 1
            ok_lat = [a[2] for a in answers if a[0] == 202]
            accepted_ids += [a[3] for a in answers if a[3]]
            per_rate.append({
                "rate_per_s": rate, "sent": n, "achieved_rate": round(n / max(1e-9, time.perf_counter() - t_start), 1),
                "answers": codes, "accepted": len(ok_lat),
                "p50_ms": _pct(ok_lat, 0.50), "p99_ms": _pct(ok_lat, 0.99),
                "p50_all_ms": _pct([a[2] for a in answers], 0.50), "p99_all_ms": _pct([a[2] for a in answers], 0.99),
                "429": sum(1 for a in answers if a[0] == 429),
                "429_without_retry_after": sum(1 for a in answers if a[0] == 429 and not a[1]),
                "5xx": sum(1 for a in answers if isinstance(a[0], int) and a[0] >= 500),
                "errors": sum(1 for a in answers if a[0] == "error"),
            })
            print(f"  load {rate:>5} req/s: {codes}  p50 {per_rate[-1]['p50_ms']} ms  p99 {per_rate[-1]['p99_ms']} ms", flush=True)
    return {"per_rate": per_rate, "accepted_ids": accepted_ids,
            "5xx": sum(r["5xx"] for r in per_rate), "429": sum(r["429"] for r in per_rate),
            "429_without_retry_after": sum(r["429_without_retry_after"] for r in per_rate),
            "errors": sum(r["errors"] for r in per_rate)}


# ----------------------------------------------------------------------------------------
# 7. bad input (in-process, hypothesis)
# ----------------------------------------------------------------------------------------


def fuzz_strategies():
    from hypothesis import strategies as st

    odd_text = st.one_of(
        st.text(max_size=40),
        st.sampled_from(["", " ", "\x00", "a\x00b", "\u202e\u202dabc", "\u200f\u200e", "😀" * 50, "e\u0301" * 30,
                         "\ufeff", "\uffff", "\U0010ffff", "a" * 2001, "b" * 100000, "\r\n\r\n", "<script>", "' OR 1=1 --",
                         "%00", "../../etc/passwd", "{{7*7}}", "\\ud800"]),
        st.text(alphabet=st.characters(codec="utf-8"), min_size=1990, max_size=2010),
    )
    numbers = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, -1, 64, 96, 2**31, 2**32, 2**63, 10**30]),
                        st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([64.0, 64.5, 1e308, -0.0]))
    scalar = st.one_of(st.none(), st.booleans(), numbers, odd_text)
    value = st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                         max_leaves=8)
    fields = ["prompt", "negative_prompt", "width", "height", "steps", "seed", "count", "guidance_scale", "allow_degrade",
              "owner", "owner_id", "status", "id"]
    good = {"prompt": st.just("a red circle"), "width": st.just(64), "height": st.just(64), "steps": st.just(2)}
    body = st.one_of(
        st.dictionaries(st.sampled_from(fields), value, max_size=8),
        st.fixed_dictionaries(good, optional={f: value for f in fields if f not in good}),
        value,
    )
    return st, odd_text, body


RAW_BODIES = [
    b'{"prompt": "\\ud800 lone surrogate", "width": 64, "height": 64}',
    b'{"prompt": "ok", "negative_prompt": "\\udfff", "width": 64, "height": 64}',
    b'{"prompt": "a", "prompt": "b", "width": 64, "width": 95, "height": 64}',
    b'{"prompt": "nan", "guidance_scale": NaN, "width": 64, "height": 64}',
    b'{"prompt": "inf", "guidance_scale": Infinity}',
    b'{"prompt": "huge", "guidance_scale": 1e999, "width": 64, "height": 64}',
    b'{"prompt": "huge", "seed": 1' + b"0" * 5000 + b'}',
    b'{"prompt": "deep", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"prompt": "\x00"}', b"\xff\xfe\x00garbage", b"", b"null", b"[]", b"123", b'"string"', b"{", b'{"prompt": }',
    b'{"prompt": "trailing", "width": 64,}',
]


def scenario_fuzz(token: str, n_requests: int, seed: int = 0) -> dict:
    """Random bodies (JSON and raw), content types, Authorization headers, query strings on
    GET /api/v1/jobs (cursor!) and paths under /api/v1/jobs/. No 5xx; every non-202 submit
    leaves the row count unchanged; every 202 adds exactly one job, owned by the caller."""
    from hypothesis import HealthCheck, Phase, given
    from hypothesis import seed as hseed
    from hypothesis import settings as hsettings
    from rest_framework.test import APIClient

    from jobs.models import GenerationJob, at

    st, odd_text, body = fuzz_strategies()
    stats = {"requests": 0, "5xx": 0, "by_status": {}, "rows_from_invalid": 0, "accepted": 0, "accepted_bad_owner": 0,
             "failures": []}
    owner_id = __import__("jobs.access.tokens", fromlist=["user_for_token"]).user_for_token(token).pk

    def record(what: str, call) -> int:
        stats["requests"] += 1
        try:
            r = call()
            status = r.status_code
            if getattr(r, "streaming", False):
                r.close()
        except Exception as exc:  # the test client re-raises view exceptions (a 500 in production)
            status = 500
            what += f" raised {type(exc).__name__}: {str(exc)[:200]}"
        stats["by_status"][str(status)] = stats["by_status"].get(str(status), 0) + 1
        if status >= 500:
            stats["5xx"] += 1
            if len(stats["failures"]) < 20:
                stats["failures"].append(f"{status} {what}"[:500])
        return status

    def authed():
        c = APIClient()
        c.credentials(HTTP_AUTHORIZATION=f"Token {token}")
        return c

    def submit(what, call):
        before = GenerationJob.objects.count()
        newest = GenerationJob.objects.order_by("-created_at").values_list("id", flat=True).first()
        status = record(what, call)
        added = GenerationJob.objects.count() - before
        if status == 202:
            stats["accepted"] += 1
            job = GenerationJob.objects.order_by("-created_at").first()
            if added != 1 or job is None or job.id == newest or job.owner_id != owner_id:
                stats["accepted_bad_owner"] += 1
            # keep the user under the in-flight limit: the fuzz is about input, not admission
            GenerationJob.objects.filter(owner_id=owner_id, status__in=["queued", "running"]).update(**at("cancelled"))
        elif added:
            stats["rows_from_invalid"] += added
            if len(stats["failures"]) < 20:
                stats["failures"].append(f"{status} stored {added} rows: {what}"[:500])

    budget = {"n": n_requests}
    content_types = st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain",
                                     "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                     "application/json; charset=bogus", "application/json; charset=utf-16", "", "*/*",
                                     "application/xml"])
    auth_headers = st.one_of(
        st.sampled_from(["", "Token", "Token ", "Token  x", "Token a b", "Bearer " + token, "token " + token, "Token " + token + "x",
                         "Basic Zm9vOmJhcg==", "Token " + "a" * 5000, "Token \u00ff\u00fe", "Digest x", "Token 'OR 1=1--"]),
        st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=60),
    )
    query = st.dictionaries(st.sampled_from(["cursor", "page_size", "ordering", "status", "page", "limit", "x", "owner"]),
                            st.one_of(odd_text, st.integers().map(str), st.sampled_from(
                                ["cD0yMDI0LTAxLTAx", "cD1nYXJiYWdl", "bz05OTk5OTk5", "cj0xJnA9eA==", "!!!", "", "cD0=",
                                 "bz0xJnI9MSZwPTIwMjAtMDEtMDErMDA6MDA6MDA=", "cD0yMDIwLTEzLTQ1"])), max_size=3)
    path_tail = st.one_of(st.text(max_size=40), st.uuids().map(str), st.sampled_from(
        ["", "/", "00000000-0000-0000-0000-000000000000", "../", "%00", "x/cancel", "..%2f..%2fadmin", "1 OR 1=1", "\u202e"]))
    subpath = st.sampled_from(["", "/cancel", "/appeal", "/events", "/x"])
    method = st.sampled_from(["get", "post", "delete", "put", "patch", "options", "head"])

    @hsettings(max_examples=max(1, n_requests), deadline=None, database=None, derandomize=False,
               suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    @given(kind=st.integers(0, 9), body=body, raw=st.one_of(st.sampled_from(RAW_BODIES), st.binary(max_size=200)),
           ctype=content_types, auth=auth_headers, q=query, tail=path_tail, sub=subpath, m=method)
    def one(kind, body, raw, ctype, auth, q, tail, sub, m):
        if budget["n"] <= 0:
            return
        budget["n"] -= 1
        if kind <= 2:
            submit(f"POST json {body!r}"[:400], lambda: authed().post("/api/v1/jobs", body, format="json"))
        elif kind == 3:
            submit(f"POST raw {raw!r} as {ctype!r}"[:400],
                   lambda: authed().generic("POST", "/api/v1/jobs", raw, content_type=ctype))
        elif kind == 4:
            try:
                data = json.dumps(body, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")
            except (TypeError, ValueError):
                data = raw
            submit(f"POST {ctype!r} {data[:200]!r}", lambda: authed().generic("POST", "/api/v1/jobs", data, content_type=ctype))
        elif kind == 5:
            def call():
                c = APIClient()
                c.credentials(HTTP_AUTHORIZATION=auth) if auth else None
                return c.post("/api/v1/jobs", {"prompt": "a red circle", "width": 64, "height": 64, "steps": 2}, format="json")
            before = GenerationJob.objects.count()
            status = record(f"POST with Authorization {auth!r}", call)
            if status != 202 and GenerationJob.objects.count() != before:
                stats["rows_from_invalid"] += 1
            if status == 202:
                GenerationJob.objects.filter(owner_id=owner_id, status__in=["queued", "running"]).update(**at("cancelled"))
        elif kind == 6:
            record(f"GET /api/v1/jobs?{q!r}", lambda: authed().get("/api/v1/jobs", q))
        elif kind == 7:
            from urllib.parse import quote

            path = "/api/v1/jobs/" + quote(tail, safe="/%") + sub
            record(f"{m.upper()} {path!r}", lambda: getattr(authed(), m)(path))
        elif kind == 8:
            record(f"GET /api/v1/jobs with Authorization {auth!r}",
                   lambda: (lambda c: (c.credentials(HTTP_AUTHORIZATION=auth), c.get("/api/v1/jobs", q))[1])(APIClient()))
        else:
            record(f"GET /api/v1/queue?{q!r}", lambda: authed().get("/api/v1/queue", q))

    for round_ in range(50):
        if budget["n"] <= 0:
            break
        before = budget["n"]
        hseed(seed * 1000 + round_)(one)()
        if budget["n"] == before:
            break
    return stats


# ----------------------------------------------------------------------------------------
# the command
# ----------------------------------------------------------------------------------------


def build_stack(steps: int):
    from scripts.stack import Stack

    env = {
        "IMAGEGEN_TORCH_THREADS": "1",
        "IMAGEGEN_IMAGE_CLASSIFIER": "python:tests.fake_classifiers:Scripted",
        "IMAGEGEN_CLASSIFIER_TIMEOUT": "2",
        "IMAGEGEN_LEASE_SECONDS": "4",
        "IMAGEGEN_REAPER_INTERVAL": "1",
        "IMAGEGEN_MAX_ATTEMPTS": "10",  # the kill loop is adversarial; bounded attempts are tested in test_batching
        "IMAGEGEN_FILL_WAIT": "0.2",
        "IMAGEGEN_BATCH_CAP": "4",
        "IMAGEGEN_DEFAULT_STEPS": str(steps),
        "IMAGEGEN_MAX_QUEUE_WAIT": "100000",  # the fault scenarios queue everything; load sets its own
        "IMAGEGEN_USER_MAX_IN_FLIGHT": "100000",
        "IMAGEGEN_USER_MAX_IMAGES_PER_DAY": "1000000",
        "IMAGEGEN_MAX_QUEUED_IMAGES": "100000",
        # ... and send far more than a person would, as one user, from 127.0.0.1: the abuse
        # limits are off here; the abuse scenario starts a web process with them on.
        "IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE": "0",
        "IMAGEGEN_USER_MAX_IN_REVIEW": "100000",
        "IMAGEGEN_USER_MAX_STREAMS": "100000",
        "IMAGEGEN_THROTTLE_SUBMIT": "off", "IMAGEGEN_THROTTLE_READ": "off", "IMAGEGEN_THROTTLE_STREAM": "off",
        "IMAGEGEN_THROTTLE_IP": "off",
        "IMAGEGEN_LOG_FORMAT": "plain",
        "IMAGEGEN_CDN_PURGE_HOOK": "tests.fake_classifiers:record_purge",
    }
    stack = Stack(**env)
    from gpu_tasks.tiny_pipeline import write_tiny_pipeline

    model = write_tiny_pipeline(stack.var / "models" / "tiny-random")
    stack.env["IMAGEGEN_MODEL_PATH"] = str(model)
    stack.env["IMAGEGEN_MODEL_VERSION"] = "tiny-random"
    return stack


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="full sizes (200+ jobs with kills, 10,000 fuzz requests, ...)")
    parser.add_argument("--only", default=",".join(ALL_SCENARIOS), help="comma-separated scenarios")
    parser.add_argument("--merge", action="store_true", help="keep the other scenarios already in the output file")
    parser.add_argument("--out", default="", help="JSON result path (default bench/results/reliability.json with --full, "
                                                  "var/reliability-reduced.json without)")
    args = parser.parse_args(argv)
    size = SIZES["full" if args.full else "reduced"]
    only = [s for s in args.only.split(",") if s]
    unknown = set(only) - set(ALL_SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}")

    stack = build_stack(size["steps"])
    stack.apply_to_this_process()
    import django

    django.setup()
    from django.conf import settings

    result: dict = {"command": "python bench/reliability.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                    "size": "full" if args.full else "reduced", "parameters": size,
                    "database": settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1], "scenarios": {}}
    t_all = time.monotonic()
    try:
        stack.manage("migrate", "--noinput")
        token = user_token("reliability")
        client = api_client(token)
        stack.start_worker("cpu", f"{settings.QUEUE_CPU},{settings.QUEUE_IO},{settings.QUEUE_CLASSIFY},{settings.QUEUE_WEBHOOKS}", beat=True)
        for name in ALL_SCENARIOS:
            if name not in only:
                continue
            t0 = time.monotonic()
            print(f"== {name}", flush=True)
            if name == "fuzz":
                res = scenario_fuzz(user_token("fuzzer"), size["fuzz_requests"])
            elif name == "db":
                res = scenario_db_outage(token, job_id=submit_many(client, 1, "db-probe", 2)[0])
            elif name == "storage":
                from django.contrib.auth import get_user_model

                res = scenario_storage(get_user_model().objects.get(username="reliability"), stack.var / "storage-cases")
            elif name == "classifier":
                pool = GpuPool(stack, 1)
                stack.wait_for_gpu_workers(settings.IMAGEGEN_MODEL_NAME, 1, timeout=180)
                res = scenario_classifier(client, size["classifier_jobs"], steps=4)
                for n in list(pool.names):
                    stack.stop(n)
            elif name == "kills":
                res = scenario_kills(stack, client, size["kill_jobs"], size["max_kills"], size["steps"])
            elif name == "redis":
                res = scenario_redis(stack, client, size["redis_jobs"], size["steps"], mid_submit=args.full)
            elif name == "load":
                res = run_load(stack, size)
            elif name == "abuse":
                from bench.reliability_abuse import scenario_abuse

                res = scenario_abuse(stack, size)
            elif name == "watchers":
                from bench.reliability_abuse import scenario_watchers

                res = scenario_watchers(stack, size)
            res["seconds"] = round(time.monotonic() - t0, 1)
            result["scenarios"][name] = res
            print(json.dumps(summary_of(name, res)), flush=True)
    finally:
        stack.close()
    result["seconds"] = round(time.monotonic() - t_all, 1)
    result["summary"] = {n: summary_of(n, r) for n, r in result["scenarios"].items()}
    result["figures"] = figures_of(result["scenarios"])
    out = Path(args.out) if args.out else (ROOT / "bench" / "results" / "reliability.json" if args.full else ROOT / "var" / "reliability-reduced.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.merge and out.exists():
        old = json.loads(out.read_text())
        result["scenarios"] = {**old.get("scenarios", {}), **result["scenarios"]}
        result["summary"] = {n: summary_of(n, r) for n, r in result["scenarios"].items()}
        result["figures"] = figures_of(result["scenarios"])
        result["command"] = old.get("command", "") + " ; " + result["command"]
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {out}")
    return result


def run_load(stack, size) -> dict:
    from django.conf import settings

    from jobs.models import GenerationJob, at

    pool = GpuPool(stack, 1)
    port = free_port()
    stack.start_web(port, IMAGEGEN_MAX_QUEUE_WAIT="5", IMAGEGEN_USER_MAX_IN_FLIGHT="1000")
    import httpx

    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("daphne did not come up")
        time.sleep(0.3)
    stack.wait_for_gpu_workers(settings.IMAGEGEN_MODEL_NAME, 1, timeout=180)
    tokens = [user_token(f"load{i}") for i in range(6)]
    # warm the cost model with one measured batch, so estimates are measured, not the prior
    warm = submit_many(api_client(tokens[0]), 2, f"warm-{time.time_ns()}", size["steps"])
    wait_terminal(warm, 120)
    res = scenario_load(f"http://127.0.0.1:{port}", tokens, size["rates"], size["rate_seconds"], size["steps"])
    ids = res.pop("accepted_ids")
    drained = wait_terminal(ids, 600 if size is SIZES["full"] else 150)
    a = audit(ids)
    res.update({"accepted_total": len(ids), "drained": drained, "accepted_lost": a["lost"], "duplicated": a["duplicated"],
                "delivered_unchecked": a["delivered_unchecked"]})
    if not drained:
        GenerationJob.objects.filter(id__in=ids, status__in=["queued", "running"]).update(**at("cancelled"))
    for n in list(pool.names):
        stack.stop(n)
    stack.stop("web")
    return res


def figures_of(scenarios: dict) -> dict:
    """The headline counts across scenarios: jobs, kills, lost, duplicated, delivered unchecked, 5xx."""
    sc = scenarios
    fault = [sc[n] for n in ("kills", "redis", "classifier") if n in sc]
    return {
        "jobs": sum(r.get("jobs", 0) for r in fault) + sc.get("load", {}).get("accepted_total", 0),
        "kills": sc.get("kills", {}).get("kills", 0),
        "lost": sum(r.get("lost", 0) for r in fault) + sc.get("load", {}).get("accepted_lost", 0),
        "lost_by_scenario": {n: sc[n].get("lost", sc[n].get("accepted_lost")) for n in ("kills", "redis", "classifier", "load") if n in sc},
        "duplicated": sum(r.get("duplicated", 0) for r in fault) + sc.get("load", {}).get("duplicated", 0),
        "delivered_unchecked": sum(r.get("delivered_unchecked", 0) for r in fault) + sc.get("load", {}).get("delivered_unchecked", 0),
        "5xx": {"load": sc.get("load", {}).get("5xx"), "fuzz": sc.get("fuzz", {}).get("5xx"),
                "db_outage_non_503": sc.get("db", {}).get("5xx_other_than_503")},
        "fuzz_requests": sc.get("fuzz", {}).get("requests"),
        "rows_without_bytes": sum(r.get("rows_without_bytes", 0) for r in fault) + sc.get("storage", {}).get("rows_without_bytes", 0),
        "latency_ms_by_rate": [{"rate_per_s": x["rate_per_s"], "p50": x["p50_ms"], "p99": x["p99_ms"], "answers": x["answers"]}
                               for x in sc.get("load", {}).get("per_rate", [])],
    }


def summary_of(name: str, r: dict) -> dict:
    keys = {
        "kills": ["jobs", "kills", "lost", "duplicated", "wrong_image_count", "rows_without_bytes", "delivered_unchecked",
                  "max_attempts", "jobs_with_attempts_ge_2", "finished_in_time", "seconds"],
        "redis": ["jobs", "lost", "duplicated", "delivered_unchecked", "workers_reconnected", "finished_in_time",
                  "seconds_after_restart"],
        "classifier": ["jobs", "delivered_unchecked", "public_images_of_failed_jobs", "failed_with_gate_reason", "failed_other",
                       "lost", "mode_flips", "by_status"],
        "db": ["requests", "5xx_other_than_503", "503_without_retry_after", "rows_added"],
        "storage": ["cases", "failed_cases", "rows_without_bytes", "leftover_objects"],
        "load": ["5xx", "429", "429_without_retry_after", "errors", "accepted_total", "accepted_lost", "duplicated",
                 "delivered_unchecked"],
        "fuzz": ["requests", "5xx", "rows_from_invalid", "accepted", "accepted_bad_owner", "by_status"],
        "abuse": ["concurrent_submits", "prompt_check_rate_off", "prompt_check_rate_on", "websockets_on_one_job"],
        "watchers": ["jobs", "statuses", "ws", "sse", "opened_while_redis_down"],
    }[name]
    out = {k: r.get(k) for k in keys}
    if name == "load":
        out["per_rate"] = [{k: x[k] for k in ("rate_per_s", "sent", "answers", "p50_ms", "p99_ms")} for x in r["per_rate"]]
    return out


def violations(result: dict) -> list[str]:
    """The invariants a run broke (the command exits 1 when there is any)."""
    f = figures_of(result["scenarios"])
    out = [f"{k}={f[k]}" for k in ("lost", "duplicated", "delivered_unchecked", "rows_without_bytes") if f[k]]
    out += [f"5xx in {k}: {v}" for k, v in f["5xx"].items() if v]
    storage = result["scenarios"].get("storage", {})
    if storage.get("failed_cases"):
        out.append(f"storage cases failed: {storage['failed_cases']} (leftover objects {storage.get('leftover_objects')})")
    return out


if __name__ == "__main__":
    broken = violations(main())
    if broken:
        print("invariants broken: " + "; ".join(broken))
    sys.exit(1 if broken else 0)
