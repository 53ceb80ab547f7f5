"""Admission control, honest wait estimates and the request-hash cache under load.

    .venv/bin/python bench/admission.py [--gpus 2] [--steady-seconds 180] [--burst-seconds 60]

The real stack (daphne, Celery workers, Redis, the database) with simulated GPU workers
(IMAGEGEN_ACCELERATOR=simulated: the cost model sleeps, so the figures do not depend on this
machine's two cores). Every request goes over HTTP, as a client's would.

1. Capacity: a backlog of the request mix is admitted before the GPU workers start; capacity is
   the images per second they deliver draining it (this also warms the measured cost model).
2. Load: Poisson arrivals of the mix at --load (0.8) of that capacity for --steady-seconds, then
   at 3x for --burst-seconds, under MAX_QUEUE_WAIT; half the clients send allow_degrade.
   For every admitted job that ran on a GPU: predicted = eta_seconds in the submit answer,
   actual = finished_at - created_at (the images are delivered and visible). The relative error
   is (predicted - actual) / actual. Shed (429) and degraded answers are counted.
3. Cache: a Zipf-distributed prompt stream (no seed sent) run twice, seed policy random and
   fixed, below capacity: the cache hit rate and the GPU-seconds the hits saved (measured: the
   GPU-seconds of the random run's batches minus the fixed run's).

Writes bench/results/admission.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import pct, wait_web  # noqa: E402
from scripts.procs import free_port  # noqa: E402
from scripts.stack import Stack  # noqa: E402

COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "white", "black", "pink", "cyan"]
SHAPES = ["circle", "square", "triangle", "diamond", "ring"]  # the star is the demo policy's forbidden shape
BACKGROUNDS = ["grey", "dark", "light", "striped"]

# The request mix of the load phase: (weight, width, height, steps, count)
MIX = [(0.5, 64, 64, 20, 1), (0.2, 64, 64, 20, 2), (0.3, 96, 96, 10, 1)]


def prompt_of(i: int) -> str:
    c, s, b = COLOURS[i % len(COLOURS)], SHAPES[(i // len(COLOURS)) % len(SHAPES)], BACKGROUNDS[(i // 50) % len(BACKGROUNDS)]
    return f"a {c} {s} on a {b} background"


class Load:
    """Open-loop HTTP submits from a thread pool; every answer recorded with its phase."""

    def __init__(self, base_url: str, tokens: list[str], threads: int = 32):
        import httpx

        logging.getLogger("httpx").setLevel(logging.WARNING)
        self.base_url, self.tokens = base_url, tokens
        self.local = threading.local()
        self.pool = concurrent.futures.ThreadPoolExecutor(threads)
        self.httpx = httpx
        self.answers: list[dict] = []
        self.compare = False
        self.lock = threading.Lock()

    def client(self):
        if not hasattr(self.local, "c"):
            self.local.c = self.httpx.Client(base_url=self.base_url, timeout=60.0)
        return self.local.c

    def _one(self, i: int, phase: str, body: dict) -> dict:
        t0 = time.time()
        try:
            r = self.client().post("/api/v1/jobs", json=body, headers={"Authorization": f"Token {self.tokens[i % len(self.tokens)]}"})
            data = r.json()
            answer = {"code": r.status_code, "retry_after": r.headers.get("Retry-After"), "body": data}
        except Exception as exc:  # noqa: BLE001 - recorded, never hidden
            answer = {"code": "error", "error": repr(exc), "body": {}}
        answer.update(phase=phase, sent_at=t0, latency=time.time() - t0, request=body)
        if self.compare and answer["code"] == 202 and answer["body"].get("status") == "queued":
            try:
                answer["first_version_eta"] = first_version_eta(answer["body"])
            finally:
                from django.db import connection

                connection.close()
        with self.lock:
            self.answers.append(answer)
        return answer

    def run(self, phase: str, rate: float, seconds: float, make_body, rng: random.Random) -> list:
        """Poisson arrivals at `rate` per second for `seconds`."""
        futures = []
        start = time.monotonic()
        t = 0.0
        i = 0
        while True:
            t += rng.expovariate(rate)
            if t > seconds:
                break
            delay = start + t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            futures.append(self.pool.submit(self._one, i, phase, make_body(i, rng)))
            i += 1
        return [f.result() for f in futures]


def first_version_eta(body: dict) -> float | None:
    """The estimate's first version, for comparison: (GPU-seconds queued ahead, plus half of
    each running job) / live GPUs + the job's own images at the per-image cost + the fill wait.
    Computed by the load generator right after the submit answer."""
    from django.conf import settings

    from imagegen.redis_client import get_redis
    from jobs.admission.replay import active_gpus
    from jobs.models import GenerationJob
    from scheduling import scheduler
    from scheduling.costs import COST_KEY, seconds_per_image

    costs = get_redis().hgetall(COST_KEY)
    ahead = 0.0
    for shape, entries in scheduler.queued_entries(settings.IMAGEGEN_MODEL_NAME).items():
        ahead += sum(seconds_per_image(shape, costs) * n for job_id, n, _ in entries if job_id != body["id"])
    for job in GenerationJob.objects.filter(status="running").only("width", "height", "steps", "count", "model_version", "guidance_scale", "scheduler"):
        ahead += 0.5 * job.count * seconds_per_image(
            scheduler.shape_key(job.model_version, job.width, job.height, job.steps, job.guidance_scale, job.scheduler), costs)
    gpus = active_gpus()
    if not gpus:
        return None
    shape = scheduler.shape_key(settings.IMAGEGEN_MODEL_VERSION, body["width"], body["height"], body["steps"], body["guidance_scale"], "")
    return ahead / gpus + seconds_per_image(shape, costs) * body["count"] + settings.IMAGEGEN_FILL_WAIT


def wait_terminal(ids, timeout: float) -> None:
    from jobs.models import GenerationJob

    deadline = time.monotonic() + timeout
    while GenerationJob.objects.filter(id__in=ids, status__in=["queued", "running", "pending_review"]).exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the load did not drain in time")
        time.sleep(0.5)


def mix_body(allow_degrade_share: float):
    def make(i: int, rng: random.Random) -> dict:
        r = rng.random()
        for weight, w, h, steps, count in MIX:  # noqa: B007  (the chosen row is used after the loop)
            if r < weight:
                break
            r -= weight
        return {"prompt": f"{prompt_of(rng.randrange(200))} {i} {rng.randrange(10**9)}", "width": w, "height": h,
                "steps": steps, "count": count, "seed": rng.randrange(2**31),
                "allow_degrade": rng.random() < allow_degrade_share}
    return make


def measure_capacity(stack, load: Load, gpus: int, jobs: int, rng: random.Random) -> dict:
    from django.conf import settings

    from jobs.models import GenerationJob

    make = mix_body(0.0)
    answers = [load._one(i, "capacity", make(i, rng)) for i in range(jobs)]
    ids = [a["body"]["id"] for a in answers if a["code"] == 202]
    assert len(ids) == jobs, [a for a in answers if a["code"] != 202][:3]
    while GenerationJob.objects.filter(id__in=ids, scheduled_at=None, status="queued").exists():
        time.sleep(0.2)
    for k in range(gpus):
        stack.start_worker(f"gpu{k}", settings.QUEUE_GPU)
    wait_terminal(ids, 600)
    done = list(GenerationJob.objects.filter(id__in=ids))
    assert all(j.status == "done" for j in done), {j.status for j in done}
    first = min(j.started_at for j in done).timestamp()
    last = max(j.finished_at for j in done).timestamp()
    images = sum(j.count for j in done)
    return {"jobs": jobs, "images": images, "seconds": round(last - first, 2), "images_per_s": round(images / (last - first), 3)}


def load_figures(answers: list[dict], dump: list | None = None) -> dict:
    from jobs.models import GenerationJob

    ids = [a["body"]["id"] for a in answers if a["code"] == 202]
    jobs = {str(j.id): j for j in GenerationJob.objects.filter(id__in=ids).select_related("batch")}
    per_phase: dict = {}
    for phase in sorted({a["phase"] for a in answers}):
        mine = [a for a in answers if a["phase"] == phase]
        errors, signed, under, first_errors = [], [], 0, []
        parts: dict[str, list] = {"prompt_check": [], "queue": [], "gpu_pass": [], "fill_and_delivery": []}
        for a in mine:
            if a["code"] != 202:
                continue
            job = jobs[a["body"]["id"]]
            predicted = a["body"].get("eta_seconds")
            if job.status != "done" or predicted is None or job.batch_id is None:
                continue
            actual = (job.finished_at - job.created_at).total_seconds()
            e = (predicted - actual) / actual
            errors.append(abs(e))
            signed.append(e)
            under += predicted < actual
            if a.get("first_version_eta") is not None:
                first_errors.append(abs(a["first_version_eta"] - actual) / actual)
            parts["prompt_check"].append((job.scheduled_at - job.created_at).total_seconds())
            parts["queue"].append((job.started_at - job.scheduled_at).total_seconds())
            parts["gpu_pass"].append(job.batch.gpu_seconds or 0.0)
            parts["fill_and_delivery"].append(actual - parts["prompt_check"][-1] - parts["queue"][-1] - parts["gpu_pass"][-1])
            if dump is not None:
                dump.append({"phase": phase, "predicted": predicted, "actual": round(actual, 3), "shape": [job.width, job.height, job.steps],
                             "count": job.count, "batch_size": job.batch.size, **{k: round(v[-1], 3) for k, v in parts.items()}})
        statuses: dict[str, int] = {}
        for a in mine:
            if a["code"] == 202:
                statuses[jobs[a["body"]["id"]].status] = statuses.get(jobs[a["body"]["id"]].status, 0) + 1
        shed = [a for a in mine if a["code"] == 429]
        per_phase[phase] = {
            "sent": len(mine),
            "accepted": sum(1 for a in mine if a["code"] == 202),
            "final_status": statuses,
            "shed_429": len(shed),
            "shed_by_limit": {lim: sum(1 for a in shed if a["body"].get("limit") == lim) for lim in {a["body"].get("limit") for a in shed}},
            "shed_without_retry_after": sum(1 for a in shed if not a["retry_after"]),
            "degraded": sum(1 for a in mine if a["code"] == 202 and a["body"].get("degraded")),
            "other_codes": sorted({str(a["code"]) for a in mine if a["code"] not in (202, 429)}),
            "jobs_compared": len(errors),
            "abs_rel_error_p50": round(pct(errors, 0.5), 3) if errors else None,
            "abs_rel_error_p90": round(pct(errors, 0.9), 3) if errors else None,
            "signed_rel_error_p50": round(pct(signed, 0.5), 3) if signed else None,
            "first_version_abs_rel_error_p50": round(pct(first_errors, 0.5), 3) if first_errors else None,
            "first_version_abs_rel_error_p90": round(pct(first_errors, 0.9), 3) if first_errors else None,
            "under_predicted_share": round(under / len(errors), 3) if errors else None,
            "actual_seconds_p50": round(pct([(jobs[a["body"]["id"]].finished_at - jobs[a["body"]["id"]].created_at).total_seconds()
                                              for a in mine if a["code"] == 202 and jobs[a["body"]["id"]].finished_at], 0.5) or 0, 2),
            "actual_parts_p50_seconds": {k: round(pct(v, 0.5), 3) for k, v in parts.items() if v},
            "submit_latency_p50_ms": round(1000 * pct([a["latency"] for a in mine], 0.5), 1),
            "submit_latency_p99_ms": round(1000 * pct([a["latency"] for a in mine], 0.99), 1),
        }
    return per_phase


def cache_run(stack, load: Load, port: int, policy: str, requests: int, rate: float, prompts: int, zipf_s: float,
              seed: int, web_env: dict) -> dict:
    from django.db.models import Sum

    from imagegen.redis_client import PREFIX, get_redis
    from jobs.media import cache
    from jobs.models import Batch, GenerationJob

    r = get_redis()
    for key in r.scan_iter(f"{PREFIX}rc:*"):
        r.delete(key)
    stack.stop("web")
    stack.start_web(port, **web_env, IMAGEGEN_SEED_POLICY=policy)
    wait_web(load.base_url)
    before = cache.stats()
    weights = [1 / (k ** zipf_s) for k in range(1, prompts + 1)]
    rng = random.Random(seed)  # the same stream for both policies
    stream = rng.choices(range(prompts), weights=weights, k=requests)

    def make(i: int, _rng: random.Random) -> dict:
        return {"prompt": prompt_of(stream[i]), "width": 64, "height": 64, "steps": 12, "count": 1}

    t0 = time.time()
    answers = load.run(f"cache-{policy}", rate, requests / rate, make, random.Random(seed + 1))
    ids = [a["body"]["id"] for a in answers if a["code"] == 202]
    wait_terminal(ids, 600)
    after = cache.stats()
    hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
    jobs = GenerationJob.objects.filter(id__in=ids)
    batch_ids = set(jobs.exclude(batch=None).values_list("batch_id", flat=True))
    gpu_seconds = Batch.objects.filter(id__in=batch_ids).aggregate(s=Sum("gpu_seconds"))["s"] or 0.0
    images_generated = Batch.objects.filter(id__in=batch_ids).aggregate(s=Sum("size"))["s"] or 0
    repeats = len(answers) - len(set(stream[:len(answers)]))
    return {
        "policy": policy, "requests": len(answers), "repeats": repeats,
        "repeat_misses": repeats - hits,  # fixed: the identical request was still in flight (or refused) "accepted": len(ids), "distinct_prompts_sent": len(set(stream[:len(answers)])),
        "cache_hits": hits, "cache_misses": misses, "hit_rate": round(hits / max(1, hits + misses), 3),
        "done_in_submit_answer": sum(1 for a in answers if a["code"] == 202 and a["body"].get("status") == "done"),
        "images_generated": images_generated, "gpu_seconds": round(gpu_seconds, 2), "seconds": round(time.time() - t0, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--step-ms", type=float, default=100.0, help="simulated GPU milliseconds per 64x64 step")
    p.add_argument("--marginal", type=float, default=0.15)
    p.add_argument("--cap", type=int, default=4)
    p.add_argument("--capacity-jobs", type=int, default=60)
    p.add_argument("--load", type=float, default=0.8, help="steady load as a share of measured capacity")
    p.add_argument("--burst", type=float, default=3.0, help="burst load as a multiple of the steady load")
    p.add_argument("--steady-seconds", type=float, default=180.0)
    p.add_argument("--burst-seconds", type=float, default=60.0)
    p.add_argument("--max-queue-wait", type=float, default=30.0)
    p.add_argument("--degrade-steps", type=int, default=8)
    p.add_argument("--degrade-share", type=float, default=0.5, help="share of clients that send allow_degrade")
    p.add_argument("--cache-requests", type=int, default=240)
    p.add_argument("--cache-rate", type=float, default=2.0)
    p.add_argument("--cache-prompts", type=int, default=100)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--jobs-out", default="", help="also write every compared job's figures here (JSON lines)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "admission.json"))
    a = p.parse_args()

    stack = Stack(IMAGEGEN_ACCELERATOR="simulated", IMAGEGEN_SIM_STEP_MS=str(a.step_ms),
                  IMAGEGEN_SIM_BATCH_MARGINAL=str(a.marginal), IMAGEGEN_BATCH_CAP=str(a.cap),
                  IMAGEGEN_IMAGE_CLASSIFIER="none", IMAGEGEN_USER_MAX_IN_FLIGHT="100000",
                  IMAGEGEN_USER_MAX_IMAGES_PER_DAY="1000000", IMAGEGEN_MAX_QUEUED_IMAGES="100000",
                  IMAGEGEN_MAX_QUEUE_WAIT="100000", IMAGEGEN_DEGRADE_STEPS=str(a.degrade_steps),
                  IMAGEGEN_LOG_LEVEL="WARNING", IMAGEGEN_LOG_FORMAT="plain")
    stack.apply_to_this_process()
    import django

    django.setup()
    from django.conf import settings

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    result: dict = {"command": "python bench/admission.py " + " ".join(sys.argv[1:]), "settings": vars(a), "mix": MIX}
    try:
        stack.manage("migrate", "--noinput")
        tokens = [stack.manage("issue_token", f"load{k}").strip().splitlines()[-1] for k in range(8)]
        stack.start_worker("cpu", f"{settings.QUEUE_CPU},{settings.QUEUE_IO},{settings.QUEUE_CLASSIFY},{settings.QUEUE_WEBHOOKS}", beat=True)
        no_limit = {"IMAGEGEN_MAX_QUEUE_WAIT": "100000"}
        stack.start_web(port, **no_limit)
        wait_web(base_url)
        load = Load(base_url, tokens)
        rng = random.Random(a.seed)

        print("1. capacity", flush=True)
        capacity = measure_capacity(stack, load, a.gpus, a.capacity_jobs, rng)
        from imagegen.redis_client import get_redis
        from scheduling.costs import COST_KEY

        capacity["cost_model"] = {k: round(float(v), 3) for k, v in sorted(get_redis().hgetall(COST_KEY).items())}
        result["capacity"] = capacity
        print(f"   {capacity}", flush=True)

        images_per_job = sum(w * c for w, *_, c in MIX)
        steady_rate = a.load * capacity["images_per_s"] / images_per_job
        result["steady_jobs_per_s"] = round(steady_rate, 3)
        result["burst_jobs_per_s"] = round(steady_rate * a.burst, 3)
        stack.stop("web")
        limited = {"IMAGEGEN_MAX_QUEUE_WAIT": str(a.max_queue_wait)}
        stack.start_web(port, **limited)
        wait_web(base_url)
        print(f"2. load: steady {steady_rate:.2f} jobs/s for {a.steady_seconds:.0f}s, burst {steady_rate * a.burst:.2f} jobs/s "
              f"for {a.burst_seconds:.0f}s, MAX_QUEUE_WAIT {a.max_queue_wait:.0f}s", flush=True)
        make = mix_body(a.degrade_share)
        load.compare = True
        steady = load.run("steady", steady_rate, a.steady_seconds, make, rng)
        burst = load.run("burst", steady_rate * a.burst, a.burst_seconds, make, rng)
        wait_terminal([x["body"]["id"] for x in steady + burst if x["code"] == 202], 900)
        load.compare = False
        per_job: list = []
        phases = load_figures(steady + burst, per_job)
        phases["all"] = load_figures([dict(x, phase="all") for x in steady + burst])["all"]
        result["load"] = phases
        if a.jobs_out:
            Path(a.jobs_out).write_text("".join(json.dumps(j) + "\n" for j in per_job))
        for name, f in phases.items():
            print(f"   {name}: sent {f['sent']}, accepted {f['accepted']}, shed {f['shed_429']}, degraded {f['degraded']}, "
                  f"|error| p50 {f['abs_rel_error_p50']} p90 {f['abs_rel_error_p90']} (signed p50 {f['signed_rel_error_p50']}, "
                  f"{f['jobs_compared']} jobs); first version p50 {f['first_version_abs_rel_error_p50']} "
                  f"p90 {f['first_version_abs_rel_error_p90']}", flush=True)

        print("3. cache: Zipf prompt stream, seed policy random vs fixed", flush=True)
        runs = {}
        for policy in ("random", "fixed"):
            runs[policy] = cache_run(stack, load, port, policy, a.cache_requests, a.cache_rate, a.cache_prompts, a.zipf, a.seed, no_limit)
            print(f"   {runs[policy]}", flush=True)
        runs["gpu_seconds_saved"] = round(runs["random"]["gpu_seconds"] - runs["fixed"]["gpu_seconds"], 2)
        runs["gpu_seconds_saved_share"] = round(runs["gpu_seconds_saved"] / max(1e-9, runs["random"]["gpu_seconds"]), 3)
        result["cache"] = runs
        print(f"   GPU-seconds saved by the fixed policy: {runs['gpu_seconds_saved']} ({runs['gpu_seconds_saved_share']:.0%})", flush=True)
        load.pool.shutdown()
    finally:
        stack.close()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
