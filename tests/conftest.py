"""Fixtures: named users (alice owns, bob is another tenant, mod is a moderator), the tiny
pipeline on disk, and real Celery workers consuming real Redis queues as separate processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from scripts.procs import kill_group, stop_group

pytest_plugins = ["tests.s3_fixtures", "tests.live_server"]

ROOT = Path(__file__).resolve().parent.parent


def _flush_retrying_deadlocks() -> None:
    """Between transactional tests the test database is flushed (TRUNCATE of every table) while
    the session's workers keep running: the reaper's once-a-second pass may hold a row lock on
    one table and want another, and PostgreSQL then picks the flush as the deadlock victim.
    Retry the flush then (a few times), as an operator would; any other error still fails."""
    from django.core.management.commands import flush
    from django.db import OperationalError

    original = flush.Command.handle

    def handle(self, *args, **options):
        for attempt in range(5):
            try:
                return original(self, *args, **options)
            except Exception as exc:  # flush wraps the database error in a CommandError
                cause = exc.__cause__ or exc.__context__
                if attempt == 4 or not (isinstance(cause, OperationalError) and "deadlock" in str(cause)):
                    raise
                time.sleep(0.2 * (attempt + 1))
        return None

    flush.Command.handle = handle


_flush_retrying_deadlocks()


@pytest.fixture(scope="session")
def tiny_model():
    path = Path(settings.IMAGEGEN_MODEL_PATH)
    if not (path / "model_index.json").exists():
        from gpu_tasks.tiny_pipeline import write_tiny_pipeline

        write_tiny_pipeline(path)
    return path


@pytest.fixture(scope="session")
def redis_client():
    from imagegen.redis_client import get_redis

    r = get_redis()
    r.flushdb()
    return r


def _database_url() -> str:
    from django.db import connection

    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] or ""
    if s.get("PASSWORD"):
        auth += f":{s['PASSWORD']}"
    host = s.get("HOST") or "127.0.0.1"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{auth}@{host}{port}/{s['NAME']}"


class Worker:
    def __init__(self, name: str, queues: str, env: dict, log_dir: Path, beat: bool = False, concurrency: int = 0):
        self.name = name
        self.log_path = log_dir / f"worker-{name}.log"
        pool = ["--pool=prefork", "-c", str(concurrency)] if concurrency else ["--pool=solo"]
        cmd = [
            sys.executable, "-m", "celery", "-A", "imagegen", "worker", "-Q", queues, *pool,
            "-n", f"{name}@%h", "--loglevel=INFO", "--without-gossip", "--without-mingle",
        ]
        if beat:
            cmd += ["-B", "--schedule", str(log_dir / f"beat-{name}")]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.log_path.read_text()[-3000:]}")
            if b" ready." in self.log_path.read_bytes():
                return
            time.sleep(0.2)
        raise RuntimeError(f"worker {self.name} not ready:\n{self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the whole process group, as a lost host would."""
        kill_group(self.proc)

    def stop(self) -> None:
        stop_group(self.proc, 15)
        self.log.close()


@pytest.fixture(scope="session")
def worker_env(django_db_setup, django_db_blocker, tiny_model, redis_client):
    with django_db_blocker.unblock():
        url = _database_url()
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "imagegen.settings", "PYTHONUNBUFFERED": "1"}
    return env


def _started_workers(worker_env):
    """A starter of workers on ``queues`` (the solo pool, or ``concurrency`` prefork processes);
    every worker it started is stopped (or reaped, if it was killed) when the fixture ends."""
    started: list[Worker] = []
    log_dir = Path(settings.VAR_DIR)

    def start(name: str, queues: str, beat: bool = False, wait: bool = True, concurrency: int = 0,
              **env_overrides) -> Worker:
        worker = Worker(name, queues, {**worker_env, **env_overrides}, log_dir, beat=beat, concurrency=concurrency)
        started.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop()


# Workers of the session and of module fixtures; a test's own workers (start_worker) stop when
# the test ends, passed or failed, so nothing a test started outlives it.
start_shared_worker = pytest.fixture(_started_workers, scope="session", name="start_shared_worker")
start_worker = pytest.fixture(_started_workers, name="start_worker")


@pytest.fixture(scope="session")
def workers(start_shared_worker):
    """One cpu/io worker and one GPU worker, shared by the session. Neither runs a beat: no timer
    acts between a test's update and its check; a test that needs the reaper asks for `reaper`."""
    cpu = start_shared_worker("cpu", f"{settings.QUEUE_CPU},{settings.QUEUE_IO},{settings.QUEUE_CLASSIFY},{settings.QUEUE_WEBHOOKS}", wait=False)
    gpu = start_shared_worker("gpu1", f"{settings.QUEUE_GPU},{settings.QUEUE_REWRITE}")
    cpu.wait_ready()
    return {"cpu": cpu, "gpu": gpu}


# The shipped video model (docs/video.md) on a GPU lane of its own, for the tests of video jobs.
VIDEO_VERSION = "shapes-v2-motion"
VIDEO_MODEL = ROOT / "models" / VIDEO_VERSION


def video_lane_name() -> str:
    """The video model's lane: <model name>@shapes-v2-motion, the name the session's cpu worker
    admits its jobs to after their prompt check (scheduling/lanes.py lane_of)."""
    return f"{settings.IMAGEGEN_MODEL_NAME}@{VIDEO_VERSION}"


@pytest.fixture(scope="session")
def video_worker(start_shared_worker, workers):
    """A GPU worker serving the video model's lane, shared by the session (one model load; used by
    tests/test_video_jobs.py and tests/test_openai_videos.py)."""
    return start_shared_worker("gpu-video", f"{settings.QUEUE_GPU_PREFIX}{video_lane_name()}",
                               IMAGEGEN_EXTRA_MODELS=f"{VIDEO_VERSION}={VIDEO_MODEL}",
                               IMAGEGEN_FILL_WAIT="0.2", IMAGEGEN_PREVIEW_EVERY="2", IMAGEGEN_PREVIEW_MIN_INTERVAL="0")


@pytest.fixture
def video_lane(transactional_db, video_worker):
    """The video lane's name, with its model selectable in this process too (the submit's catalogue)."""
    from django.test import override_settings

    with override_settings(IMAGEGEN_EXTRA_MODELS={VIDEO_VERSION: str(VIDEO_MODEL)}):
        yield video_lane_name()


@pytest.fixture
def reaper(transactional_db, workers):
    """The reaper while this test runs: `jobs.pipeline.tasks.reap` called in this process every
    IMAGEGEN_REAPER_INTERVAL, as a cpu worker's beat sends it in a deployment. It stops before
    the test's rows are flushed; a pass that fails is logged and the next one runs, as deployed."""
    import logging
    import threading

    from django.db import connections

    from jobs.pipeline.tasks import reap

    stop = threading.Event()

    def loop() -> None:
        try:
            while not stop.wait(settings.IMAGEGEN_REAPER_INTERVAL):
                try:
                    reap()
                except Exception:
                    logging.getLogger("tests.reaper").exception("reaper pass failed")
        finally:
            connections.close_all()

    thread = threading.Thread(target=loop, name="test-reaper", daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=60)


@pytest.fixture
def classifier_mode():
    """The scripted classifier's mode (tests/fake_classifiers), reset around the test."""
    from tests import fake_classifiers

    fake_classifiers.set_mode(None)
    yield fake_classifiers.set_mode
    fake_classifiers.set_mode(None)


@pytest.fixture
def stay_queued(monkeypatch):
    """Jobs submitted in the test are never sent to their first stage: they stay queued. A test
    on a transactional user (alice, bob) commits its jobs, and the session's workers (`workers`,
    started by an earlier test) would otherwise check, generate and finish them while the test
    still counts them as queued."""
    monkeypatch.setattr("jobs.pipeline.stages.send", lambda stage, *args, countdown=None: True)


@pytest.fixture
def moderator(transactional_db):
    """A staff user holding the review permission."""
    from django.contrib.auth.models import Permission

    mod = make_user("mod", is_staff=True)
    mod.user_permissions.add(Permission.objects.get(codename="review_content", content_type__app_label="safety"))
    return mod


@pytest.fixture
def moderator_client(moderator):
    """A Django test client signed in as the moderator (for the admin)."""
    from django.test import Client

    client = Client()
    client.force_login(moderator)
    return client


def make_user(username: str, **extra):
    """A user with a password (`<name>-pw`) and an API token. Tokens are stored hashed, so the
    token in clear is kept on this object only, as `user.auth_token.key` (the attribute the
    tests used when tokens were rest_framework.authtoken rows)."""
    from types import SimpleNamespace

    from django.contrib.auth import get_user_model

    from jobs.access.tokens import issue

    user = get_user_model().objects.create_user(username=username, password=f"{username}-pw", **extra)
    user.auth_token = SimpleNamespace(key=issue(user, name="tests"))
    return user


@pytest.fixture
def alice(transactional_db):
    return make_user("alice")


@pytest.fixture
def bob(transactional_db):
    return make_user("bob")


def client_for(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {user.auth_token.key}")
    return client


@pytest.fixture
def alice_api(alice):
    return client_for(alice)


@pytest.fixture
def bob_api(bob):
    return client_for(bob)


def wait_until(predicate, timeout: float = 60.0, what: str = "the condition", pause: float = 0.1):
    """predicate()'s first truthy value, polled until `timeout`; else AssertionError naming `what`.
    The suite's one generic condition wait (a deadline, never a fixed sleep for work)."""
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not seen within {timeout:g} s")
        time.sleep(pause)  # the poll interval of this condition wait, not a wait for work


def wait_for_status(job_id, statuses=("done", "failed", "blocked", "cancelled", "review"), timeout: float = 180.0):
    from jobs.models import GenerationJob

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = GenerationJob.objects.get(id=job_id)
        if job.status in statuses:
            return job
        if job.status in ("done", "failed", "blocked", "cancelled"):
            raise AssertionError(f"job {job_id} ended {job.status} ({job.reason}), expected {statuses}")
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} still {job.status} after {timeout}s")


def forget_cache(*delivered) -> None:
    """Drop every request-hash cache entry, so an identical request is generated again. The
    publish stage remembers a job just after the commit that makes it done, so the delivered
    jobs (rows or ids) named here are waited for first: otherwise their entries could land
    after the drop."""
    from imagegen.redis_client import PREFIX, get_redis
    from jobs.models import GenerationJob

    for job in delivered:
        wait_until_cached(job if isinstance(job, GenerationJob) else GenerationJob.objects.get(id=job))

    r = get_redis()
    keys = list(r.scan_iter(f"{PREFIX}rc:*"))
    if keys:
        r.delete(*keys)


@contextmanager
def admitted_to(lane: str, held: bool = False):
    """Jobs submitted inside go to this lane only (its own GPU workers, or none at all): the
    prompt gate runs in this process under the lane's model name. `held`: the lane is not woken
    (the job waits in its bucket until `watch_job(..., wake_lane=lane)` has subscribed)."""
    from unittest import mock

    from django.test import override_settings

    from jobs.pipeline import stages
    from jobs.pipeline.tasks import check_prompt

    original = stages.send

    def send(stage, *args, countdown=None):  # the submit's first stage runs here, the rest as routed
        if stage == "prompt":
            check_prompt.run(*args)
            return True
        return original(stage, *args, countdown=countdown)

    stages.send = send
    try:
        with override_settings(IMAGEGEN_MODEL_NAME=lane), mock.patch("scheduling.lanes.wake") if held else nullcontext():
            yield
    finally:
        stages.send = original


def watch_job(job_id: str, on_event=None, timeout: float = 60.0, wake_lane: str = "") -> list[dict]:
    """Every event of a job from now until its final status, through the real channel layer.
    One coroutine does the subscribing and every receive on a layer of its own: a layer's locks
    bind to the first event loop that uses them, and each async_to_sync call gets a new loop, so
    the process-wide layer an earlier test used cannot be reused here. `wake_lane`: the job was
    admitted held (`admitted_to(lane, held=True)`) and its lane is woken once the subscription is
    in place, so no event of it comes before the watcher listens (a fill wait long enough to
    subscribe was one piece of work assumed to outrun another)."""
    import asyncio

    from asgiref.sync import async_to_sync, sync_to_async
    from channels import DEFAULT_CHANNEL_LAYER
    from channels.layers import channel_layers

    from jobs.models import GenerationJob
    from jobs.realtime import events

    seen: list[dict] = []

    async def run() -> None:
        layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
        channel = await layer.new_channel()
        group = events.group_name(job_id)
        await layer.group_add(group, channel)
        if wake_lane:
            from scheduling import lanes

            await sync_to_async(lanes.wake)(wake_lane)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                try:
                    message = await asyncio.wait_for(layer.receive(channel), timeout=2)
                except TimeoutError:
                    status = await sync_to_async(lambda: GenerationJob.objects.get(id=job_id).status)()
                    if status not in ("queued", "running"):
                        return
                    continue
                event = message["event"]
                seen.append(event)
                if on_event is not None:
                    await sync_to_async(on_event)(event)
                if event["type"] == "status" and event["status"] not in ("queued", "running"):
                    return
        finally:
            await layer.group_discard(group, channel)

    async_to_sync(run)()
    return seen


def wait_until_cached(job, timeout: float = 10.0) -> None:
    """The publish stage remembers a delivered job's images in the request-hash cache just
    after the commit that makes it done: wait for that before relying on a hit."""
    from jobs.media import cache

    deadline = time.monotonic() + timeout
    while not cache.lookup(job) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cache.lookup(job), "the delivered job was never remembered in the cache"


# --- The suite's three layers (docs/testing.md) ----------------------------------------------
# unit         a stage's logic called directly, on rollback transactions: the database and Redis
#              of the run only; no process started, no other socket (a guard fails it otherwise)
# integration  real workers on real queues, a transactional database, servers, S3, the browser
# fault        kills, restarts, outages, fleets and `make run` itself
# A test's layer follows from what it uses (its fixtures) and, for faults, from its module or
# name; a marker written on the test wins. `once` marks fault tests that use neither the run's
# database nor its Redis (they build their own): CI runs them in one of its two passes.
LAYERS = ("unit", "integration", "fault")
FAULT_MODULES = {"test_fleet", "test_run_command", "test_rabbitmq_broker", "test_watchers", "test_reliability",
                 "test_worker_liveness", "test_stage_leases"}
ONCE_MODULES = {"test_fleet", "test_run_command"}
FAULT_WORDS = ("kill", "restart", "_dies_", "outage", "redis_down", "redis_is_down", "store_down")
INTEGRATION_FIXTURES = {
    "workers", "start_worker", "worker_env", "daphne_server", "seaweed", "s3", "s3_stage_worker", "s3_gpu_worker",
    "browser_page", "busy_server", "transactional_db", "live_server", "tiny_model",
}


def _module(item) -> str:
    return item.module.__name__.rsplit(".", 1)[-1] if item.module else ""


def layer_of(item) -> str:
    for name in LAYERS:
        if item.get_closest_marker(name):
            return name
    if _module(item) in FAULT_MODULES or any(word in item.name for word in FAULT_WORDS):
        return "fault"
    django_db = item.get_closest_marker("django_db")
    transactional = django_db is not None and (django_db.kwargs.get("transaction") or
                                               (django_db.args and django_db.args[0]))
    if transactional or INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "integration"
    return "unit"


def pytest_collection_modifyitems(config, items):
    layers = {}
    for item in items:
        layer = layers[item.nodeid] = layer_of(item)
        if not item.get_closest_marker(layer):
            item.add_marker(layer)
        if layer == "fault" and _module(item) in ONCE_MODULES:
            item.add_marker("once")
    if hasattr(config, "workerinput"):
        # A pytest-xdist worker (`make test` runs three, --dist loadfile): the longest files first,
        # so the fleets and `make run` overlap everything else and the unit layer fills the tail.
        items.sort(key=lambda item: (_module(item) not in ONCE_MODULES, -LAYERS.index(layers[item.nodeid])))
    else:
        # One process (make test-fast, or -n 0): cheapest first (a stable sort: each layer keeps
        # the files' order): a broken decision shows in the first minute, not after the fleets.
        items.sort(key=lambda item: LAYERS.index(layers[item.nodeid]))


def _allowed_addresses() -> set[tuple[str, int]]:
    """The run's own database and Redis: the only sockets a unit test may open."""
    from urllib.parse import urlsplit

    from django.db import connection

    allowed = set()
    redis = urlsplit(os.environ.get("REDIS_URL", ""))
    if redis.port:
        allowed.add((redis.hostname or "127.0.0.1", redis.port))
    s = connection.settings_dict
    if not s["ENGINE"].endswith("sqlite3"):
        allowed.add((s.get("HOST") or "127.0.0.1", int(s.get("PORT") or 5432)))
    return {(("127.0.0.1" if host == "localhost" else host), port) for host, port in allowed}


class LayerViolation(AssertionError):
    pass


@pytest.fixture(autouse=True)
def _unit_layer_guard(request, monkeypatch):
    """A unit test that starts a process or connects anywhere but the run's database and Redis
    fails here: it belongs to the integration layer (mark it so, or give it the fixture it needs)."""
    if not request.node.get_closest_marker("unit"):  # added at collection (pytest_collection_modifyitems)
        yield
        return
    import socket

    allowed = _allowed_addresses()

    def guarded(connect):
        def checked(sock, address):
            if isinstance(address, tuple) and len(address) >= 2:
                host = "127.0.0.1" if address[0] in ("localhost", "::1") else address[0]
                if (host, int(address[1])) not in allowed:
                    raise LayerViolation(f"a unit test connected to {address}: mark it integration")
            return connect(sock, address)
        return checked

    def no_process(*args, **kwargs):
        raise LayerViolation(f"a unit test started a process ({args[1] if len(args) > 1 else kwargs.get('args')}): "
                             "mark it integration")

    monkeypatch.setattr(socket.socket, "connect", guarded(socket.socket.connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guarded(socket.socket.connect_ex))
    monkeypatch.setattr(subprocess.Popen, "__init__", no_process)
    yield


# Each layer's count, summed test time and ten slowest tests, at the end of every run (under
# pytest-xdist the controller sees every worker's reports).
_TIMES: dict[str, list] = {}


def pytest_runtest_logreport(report):
    layer = next((name for name in LAYERS if name in report.keywords), None)
    if layer is not None:
        _TIMES.setdefault(report.nodeid, [layer, 0.0])[1] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _TIMES:
        return
    terminalreporter.section("layers (sum of setup, call and teardown)")
    for layer in LAYERS:
        tests = sorted(((t, nodeid) for nodeid, (name, t) in _TIMES.items() if name == layer), reverse=True)
        if not tests:
            continue
        terminalreporter.write_line(f"{layer}: {len(tests)} tests, {sum(t for t, _ in tests):.0f} s; slowest:")
        for t, nodeid in tests[:10]:
            terminalreporter.write_line(f"  {t:6.1f} s  {nodeid}")


def pytest_sessionfinish(session, exitstatus):
    # A failed run keeps this process's var folder (worker logs, storage) for reading; a passed
    # one's is removed at exit (tests/settings.py).
    import tests.settings as test_settings

    if exitstatus != 0 or session.testsfailed:
        test_settings.KEEP_VAR = True
        var = os.environ.get("IMAGEGEN_VAR_DIR", "")
        if var:
            session.config.get_terminal_writer().line(f"kept for reading: {var}")
