"""The limits and watcher scenarios of the fault suite (issue 18), run by bench/reliability.py:

  abuse     over HTTP to daphne: 40 concurrent submits from one user against the in-flight
            limit of 16 (5 rounds); one user looping blocked 2,000-character prompts while
            another submits a job a second (the victim's submit-to-running latency, without and
            with the abuser, with the prompt-check rate off and on); 200 websockets on one job
            against the stream cap
  watchers  websockets and SSE streams on running jobs through a Redis restart (did each get
            the terminal status, how long after the job finished), and a stream opened while
            Redis is down (how fast it is refused)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time

logging.getLogger("httpx").setLevel(logging.WARNING)

PRODUCTION_LIMITS = {
    "IMAGEGEN_USER_MAX_IN_FLIGHT": "16", "IMAGEGEN_USER_MAX_IMAGES_PER_DAY": "1000",
    "IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE": "60", "IMAGEGEN_USER_MAX_IN_REVIEW": "5",
    "IMAGEGEN_USER_MAX_STREAMS": "32", "IMAGEGEN_THROTTLE_SUBMIT": "120/min", "IMAGEGEN_THROTTLE_READ": "600/min",
    # Every client of the bench is 127.0.0.1: a per-IP limit would throttle the victim with the
    # abuser (as it would behind one NAT). The per-user limits are what is measured.
    "IMAGEGEN_THROTTLE_IP": "off",
}
BLOCKED_LONG = ("a pile of bloody gore and severed limbs, " * 60)[:2000]


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def _web(stack, port: int, **env: str) -> str:
    import httpx

    stack.start_web(port, **env)
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return f"http://127.0.0.1:{port}"
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("daphne did not come up")
        time.sleep(0.3)


def concurrent_submits(base: str, token: str, n: int = 40) -> list[int]:
    import httpx

    barrier = threading.Barrier(n)

    def one(i: int) -> int:
        with httpx.Client(base_url=base, headers={"Authorization": f"Token {token}"}, timeout=60) as client:
            barrier.wait()
            return client.post("/api/v1/jobs", json={"prompt": f"a red circle {i} {time.time_ns()}", "seed": i,
                                                      "steps": 12}).status_code

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def blocked_loop(base: str, victim: str, abuser: str, baseline_s: float, abuse_s: float, steps: int,
                 abuser_threads: int = 4) -> dict:
    """The victim submits one job a second; after `baseline_s` the abuser loops blocked
    2,000-character prompts from `abuser_threads` threads for `abuse_s`. Submit-to-running of
    the victim's jobs in each phase."""
    import httpx

    from jobs.models import GenerationJob

    stop = threading.Event()
    abuser_codes: dict[str, int] = {}
    lock = threading.Lock()

    def abuse():
        with httpx.Client(base_url=base, headers={"Authorization": f"Token {abuser}"}, timeout=60) as client:
            while not stop.is_set():
                try:
                    r = client.post("/api/v1/jobs", json={"prompt": BLOCKED_LONG, "steps": steps})
                    key = f"{r.status_code} {r.json().get('limit', '')}".strip()
                except Exception as exc:
                    key = type(exc).__name__
                with lock:
                    abuser_codes[key] = abuser_codes.get(key, 0) + 1

    victims: list[tuple[str, str]] = []
    with httpx.Client(base_url=base, headers={"Authorization": f"Token {victim}"}, timeout=60) as client:
        started = time.monotonic()
        threads: list[threading.Thread] = []
        i = 0
        while time.monotonic() - started < baseline_s + abuse_s:
            phase = "baseline" if time.monotonic() - started < baseline_s else "abused"
            if phase == "abused" and not threads:
                threads = [threading.Thread(target=abuse, daemon=True) for _ in range(abuser_threads)]
                for t in threads:
                    t.start()
            r = client.post("/api/v1/jobs", json={"prompt": f"a blue square on a white background, take {i}",
                                                  "steps": steps, "seed": i})
            if r.status_code == 202:
                victims.append((phase, r.json()["id"]))
            i += 1
            time.sleep(max(0.0, started + i * 1.0 - time.monotonic()))
        stop.set()
        for t in threads:
            t.join(timeout=60)
    deadline = time.monotonic() + 300
    ids = [j for _, j in victims]
    while GenerationJob.objects.filter(id__in=ids, started_at=None).exclude(status__in=["blocked", "failed", "cancelled"]).exists():
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    rows = {str(j.id): j for j in GenerationJob.objects.filter(id__in=ids)}
    from jobs.access.tokens import user_for_token
    from safety.models import SafetyVerdict

    checks = SafetyVerdict.objects.filter(stage="prompt", job__owner_id=user_for_token(abuser).pk).count()
    out: dict = {"abuser_answers": abuser_codes, "abuser_prompt_checks_run": checks,
                 "abuser_checks_per_minute": round(checks / (abuse_s / 60.0), 1)}
    for phase in ("baseline", "abused"):
        waits = [(rows[j].started_at - rows[j].created_at).total_seconds() for p, j in victims
                 if p == phase and j in rows and rows[j].started_at is not None]
        out[phase] = {"victim_jobs": sum(1 for p, _ in victims if p == phase), "started": len(waits),
                      "submit_to_running_p50_s": _pct(waits, 0.5), "p95_s": _pct(waits, 0.95),
                      "max_s": round(max(waits), 3) if waits else None}
    return out


async def _open_websockets(base: str, job_id: str, token: str, n: int) -> dict:
    import websockets

    url = base.replace("http://", "ws://") + f"/ws/jobs/{job_id}/"
    opened, refused = [], {}
    for _ in range(n):
        ws = await websockets.connect(url, origin=base, additional_headers={"Authorization": f"Token {token}"},
                                      open_timeout=10)
        first = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if first.get("type") == "status":
            opened.append(ws)
            continue
        try:
            await asyncio.wait_for(ws.recv(), 10)
        except websockets.ConnectionClosed as exc:
            code = str(exc.rcvd.code if exc.rcvd else None)
            refused[code] = refused.get(code, 0) + 1
    for ws in opened:
        await ws.close()
    return {"opened": len(opened), "refused_by_close_code": refused}


def scenario_abuse(stack, size: dict) -> dict:
    from django.conf import settings

    from bench.reliability import GpuPool, user_token, wait_terminal
    from jobs.models import GenerationJob, at
    from scripts.procs import free_port

    steps = 4
    result: dict = {"limits": PRODUCTION_LIMITS}
    port = free_port()
    # 1. atomic limits: nobody consumes the prompt checks, so every accepted job stays in flight
    base = _web(stack, port, **PRODUCTION_LIMITS, IMAGEGEN_QUEUE_CPU="abuse-nobody")
    rounds = [concurrent_submits(base, user_token(f"burst{r}-{time.time_ns()}")) for r in range(5)]
    result["concurrent_submits"] = {"limit": 16, "sent_per_round": 40, "accepted_per_round": [c.count(202) for c in rounds],
                                    "other_answers": sorted({c for r in rounds for c in r} - {202, 429})}
    stack.stop("web")
    GenerationJob.objects.filter(status="queued", scheduled_at=None, owner__username__startswith="burst").update(**at("cancelled"))
    # 2. a user looping blocked long prompts: the victim's latency, without and with the rate
    pool = GpuPool(stack, 1)
    stack.wait_for_gpu_workers(settings.IMAGEGEN_MODEL_NAME, 1, timeout=180)
    # The prompt-check rate allows a minute's worth at once (60), then one a second: the abuse
    # phase of the full run lasts well past that first minute.
    seconds = (20.0, 120.0) if size.get("kill_jobs", 0) >= 200 else (8.0, 15.0)
    for label, env in (("prompt_check_rate_off", {**PRODUCTION_LIMITS, "IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE": "0",
                                                  "IMAGEGEN_THROTTLE_SUBMIT": "off", "IMAGEGEN_THROTTLE_READ": "off", "IMAGEGEN_THROTTLE_STREAM": "off"}),
                       ("prompt_check_rate_on", PRODUCTION_LIMITS)):
        base = _web(stack, port, **env)
        stamp = time.time_ns()
        result[label] = blocked_loop(base, user_token(f"victim-{stamp}"), user_token(f"abuser-{stamp}"), *seconds, steps)
        stack.stop("web")
        print(f"  abuse {label}: {json.dumps(result[label])}", flush=True)
    # 3. 200 websockets on one job against the cap of 32
    base = _web(stack, port, **PRODUCTION_LIMITS)
    token = user_token(f"sockets-{time.time_ns()}")
    import httpx

    job = httpx.post(f"{base}/api/v1/jobs", json={"prompt": "a slow green circle", "steps": 150},
                     headers={"Authorization": f"Token {token}"}, timeout=30).json()
    result["websockets_on_one_job"] = {"sent": 200, "cap": 32, **asyncio.run(_open_websockets(base, job["id"], token, 200))}
    wait_terminal([job["id"]], 120)
    stack.stop("web")
    for name in list(pool.names):
        stack.stop(name)
    return result


async def _watch(base: str, job_id: str, token: str, kind: str, until: float) -> tuple[str | None, float | None]:
    """(the last status seen, when it arrived) for one websocket or SSE watcher."""
    import httpx
    import websockets

    last, at = None, None
    headers = {"Authorization": f"Token {token}"}
    try:
        if kind == "ws":
            url = base.replace("http://", "ws://") + f"/ws/jobs/{job_id}/"
            async with websockets.connect(url, origin=base, additional_headers=headers, open_timeout=30) as ws:
                while time.monotonic() < until:
                    event = json.loads(await asyncio.wait_for(ws.recv(), max(0.1, until - time.monotonic())))
                    if event.get("type") == "status":
                        last, at = event["status"], time.time()
                        if last in ("done", "failed", "blocked", "cancelled"):
                            break
        else:
            timeout = httpx.Timeout(10, read=max(1.0, until - time.monotonic()))
            async with httpx.AsyncClient(timeout=timeout) as http:
                async with http.stream("GET", f"{base}/api/v1/jobs/{job_id}/events", headers=headers) as stream:
                    async for line in stream.aiter_lines():
                        if line.startswith("data: "):
                            event = json.loads(line[6:])
                            if event.get("type") == "status":
                                last, at = event["status"], time.time()
    except Exception as exc:
        return f"{last} then {type(exc).__name__}: {exc}"[:200], at
    return last, at


def _refused_while_down(base: str, job_id: str, token: str) -> dict:
    import httpx
    import websockets

    t0 = time.monotonic()
    try:
        r = httpx.get(f"{base}/api/v1/jobs/{job_id}/events", headers={"Authorization": f"Token {token}"}, timeout=30)
        sse = {"status": r.status_code, "retry_after": r.headers.get("retry-after"), "seconds": round(time.monotonic() - t0, 2)}
    except httpx.HTTPError as exc:
        sse = {"status": type(exc).__name__, "seconds": round(time.monotonic() - t0, 2)}

    async def ws():
        t1 = time.monotonic()
        url = base.replace("http://", "ws://") + f"/ws/jobs/{job_id}/"
        try:
            async with websockets.connect(url, origin=base, additional_headers={"Authorization": f"Token {token}"},
                                          open_timeout=10) as sock:
                while True:
                    await asyncio.wait_for(sock.recv(), 20)
        except websockets.ConnectionClosed as exc:
            return {"close_code": exc.rcvd.code if exc.rcvd else None, "seconds": round(time.monotonic() - t1, 2)}
        except Exception as exc:
            return {"close_code": type(exc).__name__, "seconds": round(time.monotonic() - t1, 2)}

    return {"sse": sse, "websocket": asyncio.run(ws())}


def scenario_watchers(stack, size: dict) -> dict:
    import datetime

    import httpx
    from django.conf import settings

    from bench.reliability import user_token, wait_terminal
    from jobs.models import GenerationJob
    from scripts.procs import free_port

    per_job = 5 if size.get("kill_jobs", 0) >= 200 else 2
    # The simulated accelerator: a 150-step pass lasts ~15 s, so the restart is in the middle of it.
    stack.start_worker("gpu-watchers", settings.QUEUE_GPU, IMAGEGEN_ACCELERATOR="simulated", IMAGEGEN_SIM_STEP_MS="100")
    stack.wait_for_gpu_workers(settings.IMAGEGEN_MODEL_NAME, 1, timeout=180)
    base = _web(stack, free_port())
    token = user_token(f"watcher-{time.time_ns()}")
    api = httpx.Client(base_url=base, headers={"Authorization": f"Token {token}"}, timeout=30)
    ids = [api.post("/api/v1/jobs", json={"prompt": f"a circle through a restart {i} {time.time_ns()}", "steps": 150,
                                          "seed": i}).json()["id"] for i in range(4)]

    restart_at: list[float] = []

    async def run():
        until = time.monotonic() + 150
        tasks = [asyncio.create_task(_watch(base, j, token, kind, until)) for j in ids for kind in ("ws", "sse")
                 for _ in range(per_job)]
        deadline = time.monotonic() + 90
        while not await asyncio.to_thread(lambda: GenerationJob.objects.filter(id__in=ids, status="running").exists()):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(2.0)  # every watcher has connected and replayed
        restart_at.append(time.time())
        await asyncio.to_thread(stack.restart_redis, 1.0)
        return await asyncio.gather(*tasks)

    seen = asyncio.run(run())
    wait_terminal(ids, 120)
    rows = {str(j.id): j for j in GenerationJob.objects.filter(id__in=ids)}
    watchers = [(j, kind) for j in ids for kind in ("ws", "sse") for _ in range(per_job)]
    result: dict = {"jobs": len(ids), "statuses": sorted({r.status for r in rows.values()})}
    for kind in ("ws", "sse"):
        got = [(w, s) for w, s in zip(watchers, seen, strict=True) if w[1] == kind]
        terminal = [(w, s) for w, s in got if s[0] == rows[w[0]].status and rows[w[0]].finished_at]
        delays = [s[1] - rows[w[0]].finished_at.timestamp() for w, s in terminal if s[1] is not None]
        result[kind] = {"watchers": len(got), "got_the_terminal_status": len(terminal),
                        "seconds_after_finish_p50": _pct(delays, 0.5), "max": round(max(delays), 2) if delays else None,
                        "others": sorted({str(s[0]) for w, s in got if (w, s) not in terminal})}
    result["restart_before_finish_s"] = round(min(r.finished_at.timestamp() for r in rows.values() if r.finished_at)
                                              - restart_at[0], 2) if restart_at else None
    # a stream opened while Redis is down: refused at once, with a retry hint
    job = ids[0]
    probe: dict = {}

    def probe_soon():
        time.sleep(0.5)
        probe.update(_refused_while_down(base, job, token))

    prober = threading.Thread(target=probe_soon)
    prober.start()
    stack.restart_redis(down_seconds=20.0)
    prober.join()
    result["opened_while_redis_down"] = probe
    result["restarted_at"] = datetime.datetime.now(datetime.UTC).isoformat()
    stack.stop("web")
    stack.stop("gpu-watchers")
    return result
