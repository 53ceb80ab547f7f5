"""A burst of one-image jobs through the fleet's load balancer, faults while it runs, and the
audit afterwards (tests/test_fleet.py asserts on it, bench/fleet.py reports it), and the doors
the fleet keeps shut between its hosts, tried before the burst (Fleet.doors()).

Clients are what users run: token auth, an Idempotency-Key on every submit (a submit whose web
host died is sent again and answers with the same job), previews watched over SSE and websockets
that reconnect through the load balancer until they see the terminal status. The audit reads the
database (a one-off on a host, through Django), both buckets (S3) and /metrics through the load
balancer, and fetches every done image's bytes through the load balancer.
"""

from __future__ import annotations

import hashlib
import json
import random
import ssl
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field

import httpx

from scripts.fleet import PUBLIC_BUCKET, QUARANTINE_BUCKET, Fleet

TERMINAL = {"done", "blocked", "failed", "cancelled"}
# Held for a moderator: not terminal and not delivered, but settled as far as the burst goes
# (nothing in the fleet moves it on; a person does).
SETTLED = TERMINAL | {"review"}

# The environment the fleet's hosts get for a burst: the abuse limits are for people, not for
# twenty scripted users behind one address; the scrape sees rows at once; short leases so a
# host's loss is noticed within the test.
BURST_ENV = {
    "IMAGEGEN_THROTTLE_SUBMIT": "off", "IMAGEGEN_THROTTLE_READ": "off", "IMAGEGEN_THROTTLE_STREAM": "off",
    "IMAGEGEN_THROTTLE_IP": "off", "IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE": "0", "IMAGEGEN_USER_MAX_IN_REVIEW": "100000",
    "IMAGEGEN_USER_MAX_STREAMS": "100000", "IMAGEGEN_USER_MAX_IN_FLIGHT": "64", "IMAGEGEN_METRICS_CACHE_SECONDS": "0",
    "IMAGEGEN_LEASE_SECONDS": "8", "IMAGEGEN_REAPER_INTERVAL": "2", "IMAGEGEN_PROMPT_CHECK_RESEND_SECONDS": "15",
    "IMAGEGEN_STAGE_RESEND_SECONDS": "20", "IMAGEGEN_STAGE_RETRY_MAX_BACKOFF": "4", "IMAGEGEN_SIM_STEP_MS": "60",
    "IMAGEGEN_BATCH_CAP": "4", "IMAGEGEN_FILL_WAIT": "0.3", "IMAGEGEN_MAX_QUEUE_WAIT": "100000",
    "IMAGEGEN_CACHE_ENABLED": "false", "IMAGEGEN_LOG_LEVEL": "WARNING",
}

PROMPTS = ["a red circle on a blue background", "a green square on a white background",
           "a yellow triangle on a black background", "two blue circles on a grey background",
           "a purple star on an orange background", "a white square on a red background"]


@dataclass
class Burst:
    jobs: int = 48
    users: int = 6
    steps: int = 12
    submit_seconds: float = 50.0
    sse_share: float = 0.3
    ws_share: float = 0.3
    deadline: float = 240.0
    faults: bool = True
    # Which faults of the schedule to run, by name ("kill gpu1", "restart redis", ...); None: all.
    fault_names: tuple[str, ...] | None = None
    add_gpu: bool = True
    log: list[str] = field(default_factory=list)


class Run:
    def __init__(self, fleet: Fleet, burst: Burst):
        self.fleet, self.burst = fleet, burst
        self.ca = str(fleet.ca_file)
        self.lock = threading.Lock()
        self.submitted: dict[str, dict] = {}  # job id -> {user, submitted_at}
        self.submit_errors: list[str] = []
        self.submit_outages: list[tuple[float, float | None]] = []  # (first failed attempt, accepted) of submits that failed
        self.warm_up_retries: list[str] = []  # warm-up submits accepted only after a lost try (no answer, 5xx)
        self.watch: dict[str, dict] = {}  # job id -> {kind, terminal: [statuses], reconnects, previews}
        self.finished: dict[str, tuple[str, float]] = {}  # job id -> (status, first seen terminal)
        self.faults: list[dict] = []
        self.stop = threading.Event()
        self.t0 = time.time()

    def note(self, text: str) -> None:
        line = f"{time.time() - self.t0:6.1f}s {text}"
        self.burst.log.append(line)
        print(line, flush=True)

    # --- users ---

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.fleet.url, verify=self.ca, timeout=httpx.Timeout(15.0, connect=3.0))

    def submit(self, http: httpx.Client, headers: dict, body: dict) -> tuple[dict | None, float | None, str]:
        """One submit as a client that keeps its work does: sent again under its Idempotency-Key
        through lost answers, 5xx and 429s (bounded: ~60 s). (the job or None, when the first try
        failed or None, the refusal of a 4xx)."""
        key = str(uuid.uuid4())
        failed_at = None
        for _attempt in range(40):
            try:
                res = http.post("/api/v1/jobs", json=body, headers={**headers, "Idempotency-Key": key})
                if res.status_code in (200, 202):  # 200: the answer to an earlier try of this key
                    return res.json(), failed_at, ""
                if res.status_code == 429:
                    time.sleep(min(5.0, float(res.headers.get("Retry-After", "1"))))
                    continue
                if res.status_code < 500:
                    return None, failed_at, f"{res.status_code} {res.text[:200]}"
            except httpx.HTTPError:
                pass
            failed_at = failed_at or time.time()
            time.sleep(0.5)
        return None, failed_at, ""

    def submit_all(self, user: str, token: str, n: int, spacing: float) -> None:
        headers = {"Authorization": f"Token {token}"}
        with self.client() as http:
            for i in range(n):
                if self.stop.is_set():
                    return
                body = {"prompt": random.choice(PROMPTS), "width": 64, "height": 64, "steps": self.burst.steps, "count": 1}
                job, failed_at, refused = self.submit(http, headers, body)
                if refused:
                    self.submit_errors.append(f"{user}: {refused}")
                if failed_at is not None:
                    with self.lock:
                        self.submit_outages.append((failed_at, time.time() if job is not None else None))
                if job is None:
                    self.submit_errors.append(f"{user}: submit {i} never accepted")
                    continue
                with self.lock:
                    self.submitted[job["id"]] = {"user": user, "submitted_at": time.time()}
                share = random.random()
                if share < self.burst.sse_share:
                    threading.Thread(target=self.watch_sse, args=(job["id"], token), daemon=True).start()
                elif share < self.burst.sse_share + self.burst.ws_share:
                    threading.Thread(target=self.watch_ws, args=(job["id"], token), daemon=True).start()
                time.sleep(spacing * random.uniform(0.5, 1.5))

    def _watched(self, job_id: str, kind: str) -> dict:
        with self.lock:
            return self.watch.setdefault(job_id, {"kind": kind, "terminal": [], "reconnects": 0, "previews": 0, "connects": 0,
                                                  "outages": []})

    def _dropped(self, w: dict) -> None:
        """The stream ended before the terminal status: an outage until the next connection's
        first event (the current state, sent first). A reconnect that fails too (the balancer
        still sending it to the dead host) is the same outage, not a new one."""
        w["reconnects"] += 1
        if not (w["outages"] and w["outages"][-1][1] is None):
            w["outages"].append([time.time(), None])

    def _event(self, w: dict, event: dict) -> bool:
        if w["outages"] and w["outages"][-1][1] is None:
            w["outages"][-1][1] = time.time()
        if event.get("type") == "preview":
            w["previews"] += 1
        if event.get("type") == "status" and event.get("status") in TERMINAL:
            w["terminal"].append(event["status"])
            return True
        return False

    def watch_sse(self, job_id: str, token: str) -> None:
        w = self._watched(job_id, "sse")
        deadline = time.monotonic() + self.burst.deadline
        while time.monotonic() < deadline and not self.stop.is_set():
            w["connects"] += 1
            try:
                with httpx.stream("GET", f"{self.fleet.url}/api/v1/jobs/{job_id}/events", headers={"Authorization": f"Token {token}"},
                                  verify=self.ca, timeout=httpx.Timeout(30.0, connect=3.0)) as res:
                    if res.status_code != 200:
                        raise httpx.HTTPError(f"SSE {res.status_code}")
                    for line in res.iter_lines():
                        if line.startswith("data:") and self._event(w, json.loads(line[5:])):
                            return
            except (httpx.HTTPError, json.JSONDecodeError):
                pass
            self._dropped(w)
            time.sleep(0.5)

    def watch_ws(self, job_id: str, token: str) -> None:
        from websockets.exceptions import WebSocketException
        from websockets.sync.client import connect

        w = self._watched(job_id, "websocket")
        context = ssl.create_default_context(cafile=self.ca)
        deadline = time.monotonic() + self.burst.deadline
        while time.monotonic() < deadline and not self.stop.is_set():
            w["connects"] += 1
            try:
                with connect(f"{self.fleet.ws_url}/ws/jobs/{job_id}/", ssl=context, open_timeout=5, close_timeout=2,
                             additional_headers={"Authorization": f"Token {token}"}) as ws:
                    while True:
                        if self._event(w, json.loads(ws.recv(timeout=30))):
                            return
            except (OSError, TimeoutError, WebSocketException, json.JSONDecodeError):
                pass
            self._dropped(w)
            time.sleep(0.5)

    def poll(self, user: str, token: str) -> None:
        """The user's jobs page, every two seconds, until all of theirs are finished."""
        with self.client() as http:
            while not self.stop.is_set():
                try:
                    res = http.get("/api/v1/jobs", params={"page_size": 100}, headers={"Authorization": f"Token {token}"})
                    if res.status_code == 200:
                        now = time.time()
                        with self.lock:
                            for job in res.json()["results"]:
                                if job["status"] in SETTLED and job["id"] not in self.finished:
                                    self.finished[job["id"]] = (job["status"], now)
                except httpx.HTTPError:
                    pass
                time.sleep(2.0)

    # --- faults ---

    def db(self):
        import psycopg

        return psycopg.connect(self.fleet.database_url, connect_timeout=3, autocommit=True)

    def running_on(self, host: str) -> list[str]:
        with self.db() as conn:
            rows = conn.execute(
                "SELECT j.id FROM jobs_generationjob j JOIN jobs_batch b ON j.batch_id = b.id "
                "WHERE j.status = 'running' AND b.worker LIKE %s AND b.finished_at IS NULL", (f"{host}:%",)).fetchall()
        return [str(r[0]) for r in rows]

    def wait_running_elsewhere(self, jobs: list[str], host: str, killed_at: float, timeout: float = 90.0) -> float | None:
        """Seconds from the kill until every job the host was running is in a pass on another
        worker (or finished); None past `timeout`."""
        deadline = time.monotonic() + timeout
        while jobs and time.monotonic() < deadline:
            try:
                with self.db() as conn:
                    rows = conn.execute(
                        "SELECT j.status, b.worker, b.pass_started_at FROM jobs_generationjob j LEFT JOIN jobs_batch b "
                        "ON j.batch_id = b.id WHERE j.id = ANY(%s)", ([uuid.UUID(j) for j in jobs],)).fetchall()
                moved = [r for r in rows if r[0] in TERMINAL or (r[1] and not r[1].startswith(f"{host}:") and r[2] is not None)]
                if len(moved) == len(jobs):
                    return time.time() - killed_at
            except Exception:  # the database host is fine; a transient error is retried
                pass
            time.sleep(0.25)
        return None

    def in_classify(self) -> list[str]:
        """Batches whose images wait for (or are in) the image gate."""
        with self.db() as conn:
            rows = conn.execute("SELECT id FROM jobs_batch WHERE stage = 'classify'").fetchall()
        return [str(r[0]) for r in rows]

    def wait_classified(self, batches: list[str], killed_at: float, timeout: float = 120.0) -> float | None:
        """Seconds from the kill until every batch that waited on the image gate has its
        verdicts (moved on to publish, or done); None past `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with self.db() as conn:
                    left = conn.execute("SELECT count(*) FROM jobs_batch WHERE stage = 'classify' AND id = ANY(%s)",
                                        ([uuid.UUID(b) for b in batches],)).fetchone()[0]
                if left == 0:
                    return time.time() - killed_at
            except Exception:  # a transient error is retried
                pass
            time.sleep(0.25)
        return None

    def kill(self, host: str, restart_after: float | None = None) -> None:
        running: list[str] = []
        waiting: list[str] = []
        deadline = time.monotonic() + 20
        if host.startswith("gpu"):  # mid-pass: wait (bounded) until the host is in a pass
            while not running and time.monotonic() < deadline:
                running = self.running_on(host)
                if not running:
                    time.sleep(0.1)
        elif host == "classify":  # with work: wait (bounded) until a batch waits on the gate
            while not waiting and time.monotonic() < deadline:
                waiting = self.in_classify()
                if not waiting:
                    time.sleep(0.05)
        killed_at = time.time()
        n = self.fleet.kill_host(host)
        self.note(f"SIGKILL {n} processes on {host} ({len(running)} jobs in its pass, {len(waiting)} batches at the gate)")
        fault = {"fault": f"kill {host}", "at": killed_at - self.t0, "killed_at": killed_at, "jobs_in_pass": len(running)}
        self.faults.append(fault)
        if restart_after is not None:
            threading.Timer(restart_after, self._restart, args=(host,)).start()
            fault["restarted_after_s"] = restart_after
        if running:
            fault["to_running_elsewhere_s"] = self.wait_running_elsewhere(running, host, killed_at)
            self.note(f"{host}'s {len(running)} jobs running elsewhere after {fault['to_running_elsewhere_s']}s")
        if host == "classify":
            fault["batches_at_gate"] = len(waiting)
            if waiting:
                # One classify host: its work goes on when the host is back (started again after
                # restart_after s) and the stage's messages reach it again.
                fault["to_classified_s"] = self.wait_classified(waiting, killed_at)
                self.note(f"the {len(waiting)} batches at the gate classified after {fault['to_classified_s']}s")

    def _restart(self, host: str) -> None:
        self.fleet.restart_host(host)
        self.note(f"{host} started again")

    def schedule(self) -> list[tuple[float, str, object]]:
        """(seconds into the burst, what, action): spread over the submit window."""
        s = self.burst.submit_seconds
        plan: list[tuple[float, str, object]] = []
        if self.burst.faults:
            plan += [
                (0.15 * s, "kill gpu1", lambda: self.kill("gpu1")),
                (0.30 * s, "kill classify", lambda: self.kill("classify", restart_after=3.0)),
                (0.45 * s, "kill web1", lambda: self.kill("web1", restart_after=8.0)),
                (0.70 * s, "classify link down", self.partition),
                (0.90 * s, "restart redis", self.redis),
            ]
            if self.burst.fault_names is not None:
                plan = [p for p in plan if p[1] in self.burst.fault_names]
        if self.burst.add_gpu:
            # Early: a new host takes tens of seconds to boot on a busy machine, and it must
            # join while there is still work to take.
            plan.append((0.10 * s, "add gpu3", self.add_gpu3))
        return sorted(plan, key=lambda p: p[0])

    def partition(self) -> None:
        seconds = min(30.0, max(10.0, 0.25 * self.burst.submit_seconds))
        self.fleet.link("classify", up=False)
        self.note(f"classify's link down for {seconds:.0f}s")
        self.faults.append({"fault": "classify link down", "at": time.time() - self.t0, "seconds": seconds})
        time.sleep(seconds)
        self.fleet.link("classify", up=True)
        self.note("classify's link up")

    def redis(self) -> None:
        self.fleet.restart_redis()
        self.note("redis on services restarted (empty)")
        self.faults.append({"fault": "restart redis", "at": time.time() - self.t0})

    def add_gpu3(self) -> None:
        t = time.time()
        self.fleet.add_host("gpu3")
        self.note(f"gpu3 added, its worker answers after {time.time() - t:.1f}s")
        self.faults.append({"fault": "add gpu3", "at": t - self.t0, "ready_s": time.time() - t})

    def run_faults(self) -> None:
        """Each fault at its time, in a thread of its own (adding a host takes a while)."""
        started = []
        for at, what, action in self.schedule():
            while time.time() - self.t0 < at and not self.stop.is_set():
                time.sleep(0.2)
            if self.stop.is_set():
                break
            thread = threading.Thread(target=self._fault, args=(what, action), daemon=True)
            thread.start()
            started.append(thread)
        for thread in started:
            thread.join(timeout=180)

    def _fault(self, what: str, action) -> None:
        try:
            action()
        except Exception as exc:
            self.note(f"fault {what} failed: {exc!r}")
            self.faults.append({"fault": what, "error": repr(exc)})

    # --- the whole burst ---

    def warm_up(self, token: str, n: int = 8, timeout: float = 240.0) -> None:
        """A few jobs before the burst: each worker process loads its models on its first task
        (the prompt filter's embedder in every cpu pool process, the image gate), which on two
        busy cores takes tens of seconds that are not the fleet's steady state."""
        headers = {"Authorization": f"Token {token}"}
        with self.client() as http:
            ids = []
            for i in range(n):
                body = {"prompt": PROMPTS[i % len(PROMPTS)], "width": 64, "height": 64, "steps": self.burst.steps,
                        "count": 1}
                job, failed_at, refused = self.submit(http, headers, body)  # sent again as the burst's are
                if job is None:
                    raise RuntimeError(f"a warm-up submit was never accepted: {refused or 'no answer'}")
                if failed_at is not None:
                    self.warm_up_retries.append(f"{job['id']}: answered {time.time() - failed_at:.1f} s after a lost try")
                ids.append(job["id"])
            deadline = time.monotonic() + timeout
            mine: list[dict] = []
            while time.monotonic() < deadline:
                jobs = http.get("/api/v1/jobs", params={"page_size": 100}, headers=headers).json()["results"]
                mine = [j for j in jobs if j["id"] in ids]
                # Settled is enough: the shipped classifier may hold a random-seed image for a
                # moderator, and the warm-up only loads the models.
                if all(j["status"] in SETTLED for j in mine):
                    return
                time.sleep(1.0)
        # Where they stopped, and what each worker process last said, to tell a stuck stage from a slow one.
        statuses = ", ".join(f"{j['id'][:8]} {j['status']} {j.get('progress', '')}" for j in mine)
        logs = "\n".join(f"--- {host.name}/{kind}:\n{host.log_tail(kind, 1500)}" for host in self.fleet.hosts.values()
                         for kind in list(host.procs) if host.name not in ("services", "lb"))
        raise RuntimeError(f"the warm-up jobs did not finish in {timeout}s: {statuses}\n{logs}")

    def go(self) -> dict:
        names = [f"user{i:02d}" for i in range(self.burst.users)]
        tokens = self.fleet.tokens([*names, "warmup"])
        started = time.time()
        self.warm_up(tokens.pop("warmup"))
        self.note(f"warm-up done in {time.time() - started:.1f}s")
        per_user = [self.burst.jobs // self.burst.users + (1 if i < self.burst.jobs % self.burst.users else 0) for i in range(len(names))]
        self.t0 = time.time()
        self.note(f"burst: {self.burst.jobs} jobs from {self.burst.users} users over ~{self.burst.submit_seconds:.0f}s")
        threads = [threading.Thread(target=self.submit_all, args=(u, tokens[u], n, self.burst.submit_seconds / max(1, n)), daemon=True)
                   for u, n in zip(names, per_user, strict=True)]
        pollers = [threading.Thread(target=self.poll, args=(u, tokens[u]), daemon=True) for u in names]
        faults = threading.Thread(target=self.run_faults, daemon=True)
        for t in [*threads, *pollers, faults]:
            t.start()
        deadline = time.monotonic() + self.burst.deadline
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        faults.join(timeout=max(0.0, deadline - time.monotonic()))
        while time.monotonic() < deadline:
            with self.lock:
                if self.submitted and set(self.submitted) <= set(self.finished):
                    break
            time.sleep(1.0)
        # Let the watchers read their terminal events (bounded), then stop everyone.
        settle = time.monotonic() + 30
        while time.monotonic() < settle and any(not w["terminal"] and self.finished.get(j, ("",))[0] in TERMINAL
                                                for j, w in list(self.watch.items())):
            time.sleep(0.5)
        self.stop.set()
        wall = time.time() - self.t0
        self.note(f"{len(self.finished)} of {len(self.submitted)} jobs finished after {wall:.1f}s")
        return {"wall_s": wall, **self.audit()}

    # --- afterwards ---

    def audit(self) -> dict:
        code = (
            "import json\nfrom django.conf import settings\nfrom jobs.models import GenerationJob, Batch\n"
            "jobs = [{'id': str(j.id), 'status': j.status, 'attempts': j.attempts, 'reason': j.reason,\n"
            "  'created': j.created_at.timestamp(), 'finished': j.finished_at.timestamp() if j.finished_at else None,\n"
            "  'images': [{'key': i.storage_key, 'tier': i.tier, 'sha256': i.sha256, 'index': i.index,\n"
            "              'worker': i.batch.worker if i.batch_id else ''} for i in j.images.all()]}\n"
            "  for j in GenerationJob.objects.prefetch_related('images__batch')]\n"
            "batches = [{'worker': b.worker, 'start': b.pass_started_at.timestamp(), 'end': b.finished_at.timestamp()}\n"
            "  for b in Batch.objects.exclude(pass_started_at=None).exclude(finished_at=None)]\n"
            "print('AUDIT' + json.dumps({'jobs': jobs, 'batches': batches, 'max_attempts': settings.IMAGEGEN_MAX_ATTEMPTS}))\n"
        )
        data = json.loads(self.fleet.python("beat", code).split("AUDIT", 1)[1].strip().splitlines()[0])
        s3 = self.fleet.s3()

        def keys(bucket: str) -> set[str]:
            found: set[str] = set()
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                found |= {o["Key"] for o in page.get("Contents", [])}
            return found

        public, quarantine = keys(PUBLIC_BUCKET), keys(QUARANTINE_BUCKET)
        jobs = {j["id"]: j for j in data["jobs"]}
        ours = [jobs[j] for j in self.submitted if j in jobs]
        done = [j for j in ours if j["status"] == "done"]
        fetch_failures = []
        with httpx.Client(verify=self.ca, timeout=10) as http:
            for job in done:
                for image in job["images"]:
                    res = http.get(f"{self.fleet.url}/{PUBLIC_BUCKET}/{image['key']}")
                    if res.status_code != 200 or hashlib.sha256(res.content).hexdigest() != image["sha256"]:
                        fetch_failures.append(f"{job['id']}/{image['index']}: {res.status_code}")
        done_keys = {i["key"] for j in done for i in j["images"]}
        private_keys = {i["key"] for j in ours if j["status"] != "done" for i in j["images"]}
        metrics = self.fleet.metrics()
        in_status: dict[str, float] = {}
        for line in metrics.splitlines():
            if line.startswith("imagegen_jobs_in_status{"):
                status = line.split('status="', 1)[1].split('"', 1)[0]
                in_status[status] = in_status.get(status, 0) + float(line.rsplit(" ", 1)[1])
        workers_up: dict[str, float] = {}
        queue_consumers: dict[str, float] = {}
        for line in metrics.splitlines():
            if line.startswith("imagegen_worker_up{"):
                workers_up[line.split('worker="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
            elif line.startswith("imagegen_queue_consumers{"):
                queue_consumers[line.split('queue="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
        db_status: dict[str, int] = {}
        for j in data["jobs"]:
            db_status[j["status"]] = db_status.get(j["status"], 0) + 1
        latencies = sorted(j["finished"] - j["created"] for j in done if j["finished"])
        wall = max((j["finished"] for j in ours if j["finished"]), default=self.t0) - self.t0
        busy: dict[str, float] = {}
        for b in data["batches"]:
            busy[b["worker"]] = busy.get(b["worker"], 0.0) + b["end"] - b["start"]
        statuses: dict[str, int] = {}
        for j in ours:
            statuses[j["status"]] = statuses.get(j["status"], 0) + 1

        def pct(p: float) -> float | None:
            return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))], 2) if latencies else None

        watched = list(self.watch.values())
        done_by_host: dict[str, int] = {}
        for j in done:
            for host in {i["worker"].split(":", 1)[0] for i in j["images"]}:
                done_by_host[host] = done_by_host.get(host, 0) + 1
        self.recovery_of_web_kills(watched)
        return {
            "submitted": len(self.submitted), "submit_errors": self.submit_errors, "statuses": statuses,
            "not_terminal": [j["id"] for j in ours if j["status"] not in SETTLED],
            "in_review": len([j for j in ours if j["status"] == "review"]),
            "over_attempts": [j["id"] for j in ours if j["attempts"] > data["max_attempts"]],
            "failed_reasons": sorted({j["reason"] for j in ours if j["status"] == "failed"}),
            "images_lost": len([j for j in done if not j["images"]]) + len([k for k in done_keys if k not in public]) + len(fetch_failures),
            "fetch_failures": fetch_failures[:10],
            "duplicate_images": len([j for j in ours if len({i["index"] for i in j["images"]}) != len(j["images"])]),
            "held_or_blocked_public": sorted(private_keys & public),
            "public_not_done": len(public - {i["key"] for j in data["jobs"] if j["status"] == "done" for i in j["images"]}),
            "quarantine_objects": len(quarantine),
            "metrics_jobs_in_status": in_status, "db_jobs_in_status": db_status,
            "metrics_workers_up": workers_up, "metrics_queue_consumers": queue_consumers,
            "watchers": {"sse": len([w for w in watched if w["kind"] == "sse"]), "websocket": len([w for w in watched if w["kind"] == "websocket"]),
                         "reconnects": sum(w["reconnects"] for w in watched), "previews": sum(w["previews"] for w in watched)},
            # A job held for review has no terminal status yet: its watcher saw none.
            "watchers_terminal_not_once": [j for j, w in self.watch.items()
                                           if len(w["terminal"]) != (1 if jobs.get(j, {}).get("status") in TERMINAL else 0)],
            "watchers_terminal_differs": [j for j, w in self.watch.items() if w["terminal"] and jobs.get(j, {}).get("status") != w["terminal"][-1]],
            "jobs_per_s": round(len(done) / wall, 3) if wall > 0 else None,
            "submit_to_done_p50_s": pct(0.50), "submit_to_done_p95_s": pct(0.95),
            "gpu_duty_cycle": {w: round(t / max(1e-9, wall), 3) for w, t in sorted(busy.items())},
            "faults": self.faults,
            "warm_up_retries": self.warm_up_retries,
            # Procfile processes that exited on their own (and were started again, as a platform does).
            "process_restarts": dict(self.fleet.restarts), "process_restart_log": list(self.fleet.restart_log),
            "done_by_host": dict(sorted(done_by_host.items())),
            "mean_latency_s": round(statistics.fmean(latencies), 2) if latencies else None,
        }


    def recovery_of_web_kills(self, watched: list[dict], window: float = 5.0) -> None:
        """For each web host's kill: the longest a client that lost its connection then (a
        stream dropped, a submit failed, within `window` s of the kill) waited until it had an
        answer again through the load balancer, from the kill. None: no client noticed."""
        for fault in self.faults:
            if not fault["fault"].startswith("kill web") or "killed_at" not in fault:
                continue
            killed_at = fault["killed_at"]
            hit = [o for w in watched for o in w["outages"] if killed_at <= o[0] <= killed_at + window]
            fault["streams_dropped"] = len(hit)
            fault["to_streams_back_s"] = (max(o[1] - killed_at for o in hit) if hit and all(o[1] for o in hit) else None)
            fault["streams_not_back"] = [[round(o[0] - killed_at, 2), w["kind"], w["reconnects"], len(w["terminal"])]
                                         for w in watched for o in w["outages"] if o in hit and not o[1]]
            failed = [o for o in self.submit_outages if killed_at - 1 <= o[0] <= killed_at + window]
            fault["submits_failed"] = len(failed)
            fault["to_submits_back_s"] = max((o[1] - killed_at for o in failed if o[1]), default=None)


def burst(fleet: Fleet, spec: Burst) -> dict:
    """The burst's report, with the doors the fleet keeps shut (Fleet.doors(), tried before the
    burst from a web host and a GPU host; scripts.fleet.open_doors() reads them)."""
    doors = fleet.doors()
    return {**Run(fleet, spec).go(), "doors": doors}
