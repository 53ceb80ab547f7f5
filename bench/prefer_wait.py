"""Submit-to-answer with `Prefer: wait` against submit-then-poll, on the distilled student at
one step (the shipped models, the shipped image gate, real workers and the web tier).

    python bench/prefer_wait.py [--jobs 20] [--poll-interval 0.25]

Each job is submitted alone (an empty queue). `wait`: one POST with `Prefer: wait=10`, the time
until its 200. `poll`: a POST, then GET every --poll-interval seconds until the job is done.
Figures to bench/results/prefer_wait.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import pct, wait_web  # noqa: E402
from scripts.procs import free_port, stop_group  # noqa: E402
from scripts.run import web_command  # noqa: E402
from scripts.stack import Stack  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20)
    p.add_argument("--poll-interval", type=float, default=0.25)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "prefer_wait.json"))
    a = p.parse_args()
    stack = Stack(IMAGEGEN_LOG_LEVEL="WARNING", IMAGEGEN_LOG_FORMAT="plain", IMAGEGEN_WEB_PROCESSES="1",
                  IMAGEGEN_TORCH_THREADS="1")
    stack.apply_to_this_process()
    import django

    django.setup()
    import httpx
    from django.conf import settings

    student = "shapes-v1-lcm"
    web = None
    try:
        stack.manage("migrate", "--noinput")
        token = stack.manage("issue_token", "bench-prefer").strip().splitlines()[-1]
        queues = ",".join([settings.QUEUE_CPU, settings.QUEUE_IO, settings.QUEUE_CLASSIFY, settings.QUEUE_WEBHOOKS])
        stack.start_worker("cpu", queues, beat=True)
        stack.start_worker("gpu", f"{settings.QUEUE_GPU}@{student}")
        stack.wait_for_gpu_workers(f"{settings.IMAGEGEN_MODEL_NAME}@{student}", 1, timeout=300)
        port = free_port()
        log = open(stack.var / "web.log", "ab")
        web = subprocess.Popen(web_command(stack.env, str(port)), cwd=ROOT, env=stack.env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        wait_web(base, 120)
        client = httpx.Client(base_url=base, headers={"Authorization": f"Token {token}"}, timeout=60)

        def body(i: int) -> dict:
            return {"prompt": f"a red circle on a blue background {i}", "model": student, "steps": 1, "seed": i}

        client.post("/api/v1/jobs", json=body(10**6), headers={"Prefer": "wait=10"})  # warm: gate and model loaded
        times: dict[str, list[float]] = {"wait": [], "poll": []}
        answered_200 = 0
        for i in range(a.jobs):
            for mode in ("wait", "poll"):  # interleaved, so both see the same machine
                started = time.perf_counter()
                if mode == "wait":
                    r = client.post("/api/v1/jobs", json=body(2 * i), headers={"Prefer": "wait=10"})
                    answered_200 += r.status_code == 200
                    if r.status_code != 200:
                        continue
                else:
                    job = client.post("/api/v1/jobs", json=body(2 * i + 1)).json()
                    while job["status"] not in ("done", "failed", "blocked", "cancelled"):
                        time.sleep(a.poll_interval)
                        job = client.get(f"/api/v1/jobs/{job['id']}").json()
                times[mode].append(time.perf_counter() - started)
        result = {
            "command": "python bench/prefer_wait.py " + " ".join(sys.argv[1:]), "cores": os.cpu_count(),
            "jobs": a.jobs, "poll_interval_s": a.poll_interval, "wait_answered_200": answered_200,
            **{f"{mode}_p50_ms": round(1000 * (pct(v, 0.5) or 0), 1) for mode, v in times.items()},
            **{f"{mode}_p95_ms": round(1000 * (pct(v, 0.95) or 0), 1) for mode, v in times.items()},
            "load_average": os.getloadavg(),
        }
        print(json.dumps(result))
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if web is not None:
            stop_group(web, 10)
        stack.close()


if __name__ == "__main__":
    main()
