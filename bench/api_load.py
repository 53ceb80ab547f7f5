"""The API tier under an open-loop load: submits and polls at fixed arrival rates, at several
queue depths.

    .venv/bin/python bench/api_load.py [--submit-rates 50,100,200,400] [--poll-rates 50,100,200,400,800]
                                       [--depths 0,1000,10000] [--seconds 8] [--web-processes 0]

The processes `make run` starts (scripts/run.py's web command: uvicorn, IMAGEGEN_WEB_PROCESSES
processes, IMAGEGEN_WEB_THREADS threads each; a cpu/io/classify Celery worker with the reaper; one
GPU worker with the simulated accelerator), a private Redis and SQLite, all on this machine. The
Celery workers run at nice 10: in production they live on other hosts, and here they must not
take the web tier's cores (they still run, and still write to the same database).

Open loop: request k is due at start + k / rate whether or not earlier ones were answered, on
as many keep-alive connections as needed (at most --max-connections; past that a due request
waits for a connection, and that wait counts in its latency). Latency = answer time - due time.

For each queue depth (images queued in the scheduler, prefilled through the real enqueue) and
each rate, a fresh queue is laid, --warmup seconds of load are sent and dropped, then --seconds
are measured: achieved rate (answers per second), p50/p99 latency, status codes, and the web
processes' CPU seconds per answered request. Polls alternate between finished jobs (done, with an
image) and jobs waiting in the queue. Writes bench/results/api_load.json.

--shipped: as `make run` ships rather than with the benchmark's limits off: the request rates
and the prompt-check rate at their defaults (the per-address rate raised: every client here is
loopback), the Celery workers at normal priority (the cpu worker's MiniLM prompt checks share
the cores with the web tier, as on a one-machine install), the default image gate. `--poll-rates
none` measures submits only. The load average is recorded per cell: prefer the ratios between
runs made back to back.

--run-command: the service exactly as `make run` starts it: scripts/run.py itself supervises the
web tier and every worker (cpu with the prompt checks and the reaper, classify, io, webhooks, the
GPU worker with the simulated accelerator), with the shipped limits (the per-address rate raised)
and the user limits at their defaults. Its Redis is the benchmark's private one (make run uses
REDIS_URL when it is set), its database a fresh SQLite file or DATABASE_URL. The prompt checks'
own account (imagegen/timing.py: wall, CPU, statements, round trips, batch size, time since the
submit) is read back per cell: CPU per prompt and the batch sizes the load made.

--breakdown N: instead, N serial submits and N serial polls with IMAGEGEN_SERVER_TIMING on; per
request the client's wall time and the web process's own account (jobs/api/timing.py): wall,
thread CPU, database statements and time, Redis round trips and time, wait for a thread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import fresh_database, pct  # noqa: E402
from scripts.procs import free_port, stop_group  # noqa: E402
from scripts.run import web_command, web_processes  # noqa: E402
from scripts.stack import Stack  # noqa: E402

COLOURS = ["red", "blue", "green", "yellow", "purple", "orange"]
KINDS = ["circle", "square", "triangle"]


# --- the load generator: raw HTTP/1.1 on keep-alive connections (cheap on the client side) ---

IDLE_REUSE_SECONDS = 3.0  # under uvicorn's keep-alive timeout (5 s): never reuse a connection it may close


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.idle_since = time.monotonic()

    async def request(self, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(chunk[:-2])
            body = b"".join(parts)
        else:
            body = b""
        return status, headers, body


def _refusal(status: int, body: bytes) -> str | None:
    """A 429's `limit` (and `pool` for server_busy): why it was refused."""
    if status != 429:
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return "unreadable"
    return ":".join(str(answer[k]) for k in ("limit", "pool") if answer.get(k))


class OpenLoop:
    def __init__(self, port: int, max_connections: int, timeout: float):
        self.port, self.max_connections, self.timeout = port, max_connections, timeout
        self.idle: list[Conn] = []
        self.opened = 0
        self.freed = asyncio.Condition()

    async def _conn(self) -> Conn:
        while True:
            while self.idle:
                conn = self.idle.pop()
                if time.monotonic() - conn.idle_since < IDLE_REUSE_SECONDS:
                    return conn
                conn.writer.close()
                self.opened -= 1
            if self.opened < self.max_connections:
                self.opened += 1
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                except OSError:
                    self.opened -= 1
                    raise
                return Conn(reader, writer)
            async with self.freed:
                await self.freed.wait()

    async def _release(self, conn: Conn | None, keep: bool) -> None:
        if conn is not None and keep:
            conn.idle_since = time.monotonic()
            self.idle.append(conn)
        elif conn is not None:
            conn.writer.close()
            self.opened -= 1
        async with self.freed:
            self.freed.notify()

    async def one(self, due: float, raw: bytes, out: list) -> None:
        conn = None
        keep = False
        try:
            conn = await self._conn()
            status, headers, body = await asyncio.wait_for(conn.request(raw), self.timeout)
            keep = headers.get("connection", "").lower() != "close"
            out.append((due, time.monotonic() - due, status, headers.get("retry-after"), _refusal(status, body),
                        headers.get("server-timing", "")))
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
            out.append((due, time.monotonic() - due, f"error:{type(exc).__name__}", None))
        finally:
            await self._release(conn, keep)

    async def run(self, rate: float, seconds: float, make_request, rng: random.Random) -> list:
        out: list = []
        tasks = []
        start = time.monotonic() + 0.05
        n = int(rate * seconds)
        for k in range(n):
            due = start + k / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(self.one(due, make_request(rng), out)))
        await asyncio.gather(*tasks)
        return out

    async def close(self) -> None:
        for conn in self.idle:
            conn.writer.close()
        self.idle.clear()


def http(method: str, path: str, token: str, body: bytes = b"", extra: str = "") -> bytes:
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Token {token}\r\n"
            f"Accept: application/json\r\n{extra}")
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + body


# --- the stack ---

def web_cpu_seconds(web: subprocess.Popen, supervised: bool = False) -> float:
    """CPU seconds of the web tier: the uvicorn process and its workers (under scripts/run.py,
    the supervisor's uvicorn child and its workers only)."""
    import psutil

    try:
        root = psutil.Process(web.pid)
        if supervised:
            root = next(p for p in root.children() if "uvicorn" in " ".join(p.cmdline()))
        procs = [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, StopIteration):
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def cpu_by_process(supervisor: subprocess.Popen, redis_pid: int | None) -> dict[str, float]:
    """CPU seconds so far of every process of the stack, by role: make run's children (web and
    each worker, with what they forked), the private Redis, and every PostgreSQL server process
    on the machine (the local server shares the cores)."""
    import psutil

    out: dict[str, float] = {}

    def add(role: str, proc) -> None:
        try:
            t = proc.cpu_times()
            out[role] = out.get(role, 0.0) + t.user + t.system
        except psutil.NoSuchProcess:
            pass

    try:
        children = psutil.Process(supervisor.pid).children()
    except psutil.NoSuchProcess:
        children = []
    for child in children:
        try:
            cmd = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        role = "web" if "uvicorn" in cmd else next((part.split("@")[0] for part in cmd.split() if "@%h" in part), "other")
        for proc in [child, *child.children(recursive=True)]:
            add(role, proc)
    if redis_pid:
        add("redis", psutil.Process(redis_pid))
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] in ("postgres", "postgresql"):
            add("postgresql", proc)
    return out


def wait_until_up(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"the web tier did not come up; see {log}")
        time.sleep(0.2)


def start_run_command(stack: Stack, port: int, timeout: float = 300.0) -> subprocess.Popen:
    """scripts/run.py (what `make run` runs) on `port`, with the stack's environment; returns
    once it says it is ready (/readyz 200: the GPU worker up, the prompt filter loaded)."""
    log = stack.var / "run.log"
    proc = subprocess.Popen([sys.executable, "scripts/run.py"], cwd=ROOT, env={**stack.env, "PORT": str(port)},
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not (stack.var / "run-info.txt").exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            stop_group(proc, 30)
            raise RuntimeError(f"make run did not become ready; see {log}")
        time.sleep(0.5)
    return proc


def make_users(n: int) -> list[tuple[int, str]]:
    from django.contrib.auth.models import User

    from jobs.access.tokens import issue

    names = [f"load{k}" for k in range(n)]
    existing = set(User.objects.filter(username__in=names).values_list("username", flat=True))
    User.objects.bulk_create([User(username=name) for name in names if name not in existing])
    users = list(User.objects.filter(username__in=names).order_by("id"))
    return [(u.id, issue(u, name="api-load")) for u in users]


def reset_queue() -> None:
    """No queued work: queued rows cancelled, the scheduler's buckets, summary and pending prompt
    checks dropped (as after a drain), so each cell starts from the depth it asks for."""
    from django.conf import settings

    from imagegen.redis_client import PREFIX, get_redis
    from jobs.models import GenerationJob, at

    GenerationJob.objects.filter(status="queued").update(**at("cancelled"), reason="bench reset")
    r = get_redis()
    for pattern in (f"{PREFIX}q:*", f"{PREFIX}shapes:*", f"{PREFIX}summary:*", f"{PREFIX}arr:*"):
        keys = list(r.scan_iter(pattern))
        if keys:
            r.delete(*keys)
    r.delete(settings.QUEUE_CPU)  # the broker's list of prompt checks not yet taken


def prefill(images: int, users: list[tuple[int, str]], rng: random.Random) -> list[tuple[str, str]]:
    """`images` one-image jobs queued in the scheduler (rows + the real enqueue), spread over the
    size menu; returns (job id, owner's token) of each."""
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from jobs.actions import shape_of
    from jobs.models import GenerationJob
    from scheduling import lanes, scheduler

    now = timezone.now()
    jobs = []
    for k in range(images):
        w, h = rng.choice(settings.IMAGEGEN_SIZE_MENU)
        owner = users[k % len(users)]
        jobs.append(GenerationJob(
            owner_id=owner[0], prompt=f"a {rng.choice(COLOURS)} {rng.choice(KINDS)} prefill {k}", width=w, height=h,
            steps=20, guidance_scale=settings.IMAGEGEN_DEFAULT_GUIDANCE, seed=rng.randrange(2**31), count=1,
            model_version=settings.IMAGEGEN_MODEL_VERSION, progress_total=20,
            scheduled_at=now - timedelta(seconds=images - k) / 1000,
        ))
    GenerationJob.objects.bulk_create(jobs, batch_size=2000)
    lane = lanes.lane_of(settings.IMAGEGEN_MODEL_VERSION)
    for job in jobs:
        scheduler.enqueue(lane, shape_of(job), str(job.id), 1, job.scheduled_at.timestamp(), owner=str(job.owner_id))
    from imagegen.redis_client import PREFIX, get_redis

    r = get_redis()
    arrivals = list(r.scan_iter(f"{PREFIX}arr:*"))  # a prefill is a backlog, not an arrival rate
    if arrivals:
        r.delete(*arrivals)
    return [(str(j.id), users[k % len(users)][1]) for k, j in enumerate(jobs)]


def done_jobs(n: int, users: list[tuple[int, str]]) -> list[tuple[str, str]]:
    """`n` finished jobs with one delivered image each (rows only: a poll never reads bytes)."""
    import hashlib
    import uuid

    from django.conf import settings
    from django.utils import timezone

    from jobs.models import GeneratedImage, GenerationJob, at

    now = timezone.now()
    jobs = [GenerationJob(owner_id=users[k % len(users)][0], prompt=f"a done job {k}", width=64, height=64, steps=20,
                          guidance_scale=5.0, seed=k, count=1, model_version=settings.IMAGEGEN_MODEL_VERSION,
                          **at("done"), progress_step=20, progress_total=20, scheduled_at=now, started_at=now,
                          finished_at=now) for k in range(n)]
    GenerationJob.objects.bulk_create(jobs)
    GeneratedImage.objects.bulk_create([
        GeneratedImage(job=j, index=0, seed=j.seed, storage_key=f"i/{uuid.uuid4().hex}.png", width=64, height=64,
                       byte_size=1000, sha256=hashlib.sha256(str(j.id).encode()).hexdigest()) for j in jobs])
    return [(str(j.id), users[k % len(users)][1]) for k, j in enumerate(jobs)]


def figures(answers: list, seconds: float, cpu: float) -> dict:
    latencies = [a[1] for a in answers]
    codes: dict[str, int] = {}
    for a in answers:
        codes[str(a[2])] = codes.get(str(a[2]), 0) + 1
    answered = [a for a in answers if isinstance(a[2], int)]
    span = (max(a[0] + a[1] for a in answers) - min(a[0] for a in answers)) if answers else seconds
    no_retry_after = sum(1 for a in answers if a[2] in (429, 503) and not a[3])
    refusals: dict[str, int] = {}
    for a in answers:
        if len(a) > 4 and a[4]:
            refusals[a[4]] = refusals.get(a[4], 0) + 1
    return {
        "sent": len(answers),
        "achieved_per_s": round(len(answered) / max(span, 1e-9), 1),
        "ok_per_s": round(sum(1 for a in answered if 200 <= a[2] < 300) / max(span, 1e-9), 1),
        "p50_ms": round(1000 * (pct(latencies, 0.5) or 0), 1),
        "p99_ms": round(1000 * (pct(latencies, 0.99) or 0), 1),
        "max_ms": round(1000 * max(latencies, default=0), 1),
        "codes": dict(sorted(codes.items())),
        "5xx": sum(n for c, n in codes.items() if c.startswith("5")),
        "429_or_503_without_retry_after": no_retry_after,
        "refused_by": dict(sorted(refusals.items())),
        "web_cpu_ms_per_request": round(1000 * cpu / max(1, len(answered)), 2),
        "by_second": by_second(answers),
        "slowest": [{"at_s": round(a[0] - min(b[0] for b in answers), 2), "ms": round(1000 * a[1], 1),
                     "server": server_timing(a[5]) if len(a) > 5 and a[5] else None}
                    for a in sorted(answers, key=lambda a: -a[1])[:8]],
    }


def by_second(answers: list) -> list[dict]:
    """Per second of sending: requests sent, their p50 and worst latency (ms): a tail made by a
    stall shows as one bad second, a tail made by saturation as every second."""
    if not answers:
        return []
    start = min(a[0] for a in answers)
    out: dict[int, list[float]] = {}
    for a in answers:
        out.setdefault(int(a[0] - start), []).append(a[1])
    return [{"second": k, "sent": len(v), "p50_ms": round(1000 * (pct(v, 0.5) or 0), 1),
             "max_ms": round(1000 * max(v), 1)} for k, v in sorted(out.items())]


def server_timing(header: str) -> dict[str, float]:
    """{name: ms, name_n: count} from `total;dur=9.1, db;dur=1.9;desc="10", ...`."""
    out: dict[str, float] = {}
    for part in header.split(","):
        fields = [f.strip() for f in part.split(";")]
        name = fields[0]
        for f in fields[1:]:
            key, _, value = f.partition("=")
            if key == "dur":
                out[name] = float(value)
            elif key == "desc":
                out[name + "_n"] = float(value.strip('"'))
    return out


def prompt_checks(since: int = 0) -> dict:
    """The prompt checks' own account (IMAGEGEN_SERVER_TIMING records, imagegen/timing.py), from
    record `since` on: those that ran the encoder (with their batch size) apart from those that
    found their verdict already recorded by another's batch; CPU per prompt over all of them."""
    from imagegen.timing import read_records

    rows = list(reversed(read_records("prompt_check")))[since:]
    ran = [r for r in rows if "batch" in r]
    rest = [r for r in rows if "batch" not in r]

    def p50(items, key):
        return round(pct([r.get(key, 0.0) for r in items], 0.5) or 0.0, 2)

    prompts = sum(r["batch"] for r in ran)
    out: dict = {"checks": len(rows), "encoder_passes": len(ran), "prompts_in_passes": prompts,
                 "cpu_ms_per_prompt": round(sum(r["cpu_s"] for r in rows) / max(1, len(rows)), 2),
                 "batch_p50": p50(ran, "batch"), "batch_max": max((r["batch"] for r in ran), default=0)}
    for name, items in (("encoder_pass", ran), ("verdict_found", rest)):
        out[name] = {k: {"p50": p50(items, k), "p90": round(pct([r.get(k, 0.0) for r in items], 0.9) or 0.0, 2)}
                     for k in ("wall_s", "cpu_s", "db_s", "db_n", "redis_s", "redis_n", "waited_s")} if items else {}
    return out


def wait_for_prompt_checks(n: int, timeout: float = 120.0) -> None:
    from imagegen.redis_client import get_redis
    from imagegen.timing import records_key

    deadline = time.monotonic() + timeout
    while get_redis().llen(records_key("prompt_check")) < n and time.monotonic() < deadline:
        time.sleep(0.2)


def breakdown(port: int, users: list[tuple[int, str]], finished: list[tuple[str, str]], menu, n: int,
              rng: random.Random) -> dict:
    """N serial submits (the first five warm the processes and are dropped; the jobs stay queued
    and the simulated GPU drains them) and N serial polls of finished jobs: the client's wall time and
    the web process's own account of each (Server-Timing), medians and p90."""
    import httpx

    rows: dict[str, list[dict]] = {"submit": [], "poll": []}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        for i in range(n + 5):
            w, h = rng.choice(menu)
            user = users[i % len(users)]
            began = time.perf_counter()
            answer = client.post("/api/v1/jobs", headers={"Authorization": f"Token {user[1]}"},
                                 json={"prompt": f"a {rng.choice(COLOURS)} {rng.choice(KINDS)} {rng.randrange(10**9)}",
                                       "width": w, "height": h, "steps": 20})
            client_ms = (time.perf_counter() - began) * 1000
            if i >= 5 and answer.status_code == 202:
                rows["submit"].append({"client": client_ms, **server_timing(answer.headers.get("server-timing", ""))})
        for i in range(n + 5):
            job_id, token = finished[i % len(finished)]
            began = time.perf_counter()
            answer = client.get(f"/api/v1/jobs/{job_id}", headers={"Authorization": f"Token {token}"})
            client_ms = (time.perf_counter() - began) * 1000
            if i >= 5 and answer.status_code == 200:
                rows["poll"].append({"client": client_ms, **server_timing(answer.headers.get("server-timing", ""))})
    out: dict = {"load_average_1m": round(os.getloadavg()[0], 2)}
    for kind, items in rows.items():
        keys = sorted({k for row in items for k in row})
        out[kind] = {"n": len(items), **{k: {"p50": round(pct([r.get(k, 0.0) for r in items], 0.5) or 0.0, 2),
                                            "p90": round(pct([r.get(k, 0.0) for r in items], 0.9) or 0.0, 2)} for k in keys}}
    return out


def main() -> None:
    # A PostgreSQL DATABASE_URL: the run gets a database of its own on that server.
    with fresh_database(os.environ.get("DATABASE_URL")) as url:
        if url:
            os.environ["DATABASE_URL"] = url
        run()


def run() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--submit-rates", default="50,100,200,400")
    p.add_argument("--poll-rates", default="50,100,200,400,800")
    p.add_argument("--depths", default="0,1000,10000")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--web-processes", type=int, default=0, help="0: as make run (one per core)")
    p.add_argument("--web-threads", type=int, default=8)
    p.add_argument("--users", type=int, default=200)
    p.add_argument("--poll-targets", type=int, default=200, help="finished and queued jobs each")
    p.add_argument("--max-connections", type=int, default=512)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "api_load.json"))
    p.add_argument("--shipped", action="store_true",
                   help="limits, worker priority and image gate as make run ships them (see the docstring)")
    p.add_argument("--run-command", action="store_true",
                   help="drive scripts/run.py (make run) itself, limits as shipped (see the docstring)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting for every process of the stack (e.g. IMAGEGEN_MAX_QUEUE_WAIT=3600: the GPU's "
                        "honest queue-wait limit out of the way, to measure the web tier and the prompt checks)")
    p.add_argument("--breakdown", type=int, default=0,
                   help="N: only the per-request breakdown of N serial submits and N polls (Server-Timing)")
    a = p.parse_args()

    a.shipped = a.shipped or a.run_command
    if a.shipped:  # imagegen/settings.py's defaults (Stack turns them off otherwise), one address for all
        shipped = {"IMAGEGEN_THROTTLE_SUBMIT": "120/min", "IMAGEGEN_THROTTLE_READ": "600/min",
                   "IMAGEGEN_THROTTLE_STREAM": "60/min", "IMAGEGEN_THROTTLE_IP": "1000000/min",
                   "IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE": "60", "IMAGEGEN_USER_MAX_IN_REVIEW": "5"}
    else:
        shipped = {"IMAGEGEN_IMAGE_CLASSIFIER": "none"}
    # make run's user limits are its defaults; the other modes raise them out of the way
    raised = {} if a.run_command else {
        "IMAGEGEN_USER_MAX_IN_FLIGHT": "1000000", "IMAGEGEN_USER_MAX_IMAGES_PER_DAY": "100000000",
        "IMAGEGEN_MAX_QUEUED_IMAGES": "100000000", "IMAGEGEN_MAX_QUEUE_WAIT": "1e12"}
    stack = Stack(IMAGEGEN_ACCELERATOR="simulated", IMAGEGEN_LOG_LEVEL="WARNING", IMAGEGEN_LOG_FORMAT="plain", **shipped,
                  **raised, IMAGEGEN_WEB_PROCESSES=str(a.web_processes), IMAGEGEN_WEB_THREADS=str(a.web_threads),
                  IMAGEGEN_SERVER_TIMING="1" if a.breakdown or a.run_command else "0",
                  **dict(item.split("=", 1) for item in a.env))
    stack.apply_to_this_process()
    import django

    django.setup()
    from django.conf import settings

    rng = random.Random(a.seed)
    port = free_port()
    result: dict = {"command": "python bench/api_load.py " + " ".join(sys.argv[1:]), "settings": vars(a),
                    "web_processes": web_processes(stack.env), "web_threads": a.web_threads, "cores": os.cpu_count(),
                    "cells": []}
    web = None
    from imagegen.timing import read_records
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        if a.run_command:
            web = start_run_command(stack, port)
        else:
            stack.manage("migrate", "--noinput")
            cpu = stack.start_worker("cpu", f"{settings.QUEUE_CPU},{settings.QUEUE_IO},{settings.QUEUE_CLASSIFY},{settings.QUEUE_WEBHOOKS}", beat=True)
            gpu = stack.start_worker("gpu0", settings.QUEUE_GPU)
            for proc in ([] if a.shipped else [cpu, gpu]):
                os.setpriority(os.PRIO_PROCESS, proc.pid, 10)
            log = open(stack.var / "web.log", "ab")
            web = subprocess.Popen(web_command(stack.env, str(port)), cwd=ROOT, env=stack.env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
            wait_until_up(port, web, stack.var / "web.log")
            stack.wait_for_gpu_workers(settings.IMAGEGEN_MODEL_NAME, 1)
        users = make_users(a.users)
        finished = done_jobs(a.poll_targets, users)
        menu = settings.IMAGEGEN_SIZE_MENU

        def submit(r: random.Random) -> bytes:
            w, h = r.choice(menu)
            body = json.dumps({"prompt": f"a {r.choice(COLOURS)} {r.choice(KINDS)} on a grey background {r.randrange(10**9)}",
                               "width": w, "height": h, "steps": 20}).encode()
            return http("POST", "/api/v1/jobs", r.choice(users)[1], body)

        async def cell(kind: str, rate: float, make) -> dict:
            load = OpenLoop(port, a.max_connections, a.timeout)
            await load.run(rate, a.warmup, make, rng)
            cpu0 = web_cpu_seconds(web, a.run_command)
            roles0 = cpu_by_process(web, stack.redis.pid if stack.redis else None) if a.run_command else {}
            began = time.monotonic()
            answers = await load.run(rate, a.seconds, make, rng)
            spent = web_cpu_seconds(web, a.run_command) - cpu0
            await load.close()
            f = figures(answers, a.seconds, spent)
            if a.run_command:  # where the two cores went while the load was sent (cores busy, by role)
                elapsed = time.monotonic() - began
                roles1 = cpu_by_process(web, stack.redis.pid if stack.redis else None)
                f["cores_by_process"] = {k: round((roles1[k] - roles0.get(k, 0.0)) / elapsed, 3) for k in sorted(roles1)}
            return f

        if a.breakdown:
            result["breakdown"] = breakdown(port, users, finished, menu, a.breakdown, rng)
            if a.run_command:  # every submit's check, and the serial ones ran one prompt a pass
                wait_for_prompt_checks(a.breakdown + 5)
                result["breakdown"]["prompt_check"] = prompt_checks()
            print(json.dumps(result["breakdown"], indent=2), flush=True)
        for depth in ([] if a.breakdown else [int(d) for d in a.depths.split(",")]):
            for kind, rates in (("poll", a.poll_rates), ("submit", a.submit_rates)):
                for rate in [float(x) for x in rates.split(",") if x and x != "none"]:
                    reset_queue()
                    queued = prefill(max(depth, a.poll_targets if kind == "poll" else depth), users, rng)
                    targets = queued[:: max(1, len(queued) // a.poll_targets)][: a.poll_targets] + finished

                    def poll(r: random.Random, targets=targets) -> bytes:
                        job_id, token = r.choice(targets)
                        return http("GET", f"/api/v1/jobs/{job_id}", token)

                    time.sleep(1.0)  # let the summary settle, as it would in steady traffic
                    checks_before = len(read_records("prompt_check"))
                    f = asyncio.run(cell(kind, rate, submit if kind == "submit" else poll))
                    if a.run_command and kind == "submit":
                        wait_for_prompt_checks(checks_before + f["codes"].get("202", 0), timeout=60)
                        f["prompt_check"] = prompt_checks(checks_before)
                    f.update(kind=kind, offered_per_s=rate, depth=depth, queued_at_start=len(queued),
                             load_average_1m=round(os.getloadavg()[0], 2))
                    result["cells"].append(f)
                    print(f"{kind:6} depth {depth:>5} offered {rate:>5.0f}/s: achieved {f['achieved_per_s']:>6}/s "
                          f"(2xx {f['ok_per_s']}/s) "
                          f"p50 {f['p50_ms']:>7} ms p99 {f['p99_ms']:>7} ms codes {f['codes']} "
                          f"web cpu {f['web_cpu_ms_per_request']} ms/req load {f['load_average_1m']} refused by {f['refused_by']}", flush=True)
                    if "prompt_check" in f:
                        pc = f["prompt_check"]
                        print(f"       prompt checks: {pc['checks']} ({pc['encoder_passes']} encoder passes, batch p50 "
                              f"{pc['batch_p50']} max {pc['batch_max']}), {pc['cpu_ms_per_prompt']} ms CPU per prompt", flush=True)
                    if "cores_by_process" in f:
                        print(f"       cores busy, by process: {f['cores_by_process']}", flush=True)
    finally:
        if web is not None:
            stop_group(web, 30)  # scripts/run.py stops what it started, then itself
        stack.close()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
