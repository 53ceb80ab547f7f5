"""Fleet simulation: the real scheduler policy (scheduling/policy.py, held identical to the Lua
in Redis by tests/test_scheduler_policy.py) driven by a discrete-event clock (no sleeping) for
a fleet of simulated GPUs and a day of traffic with a diurnal curve and bursts.

    .venv/bin/python bench/fleet_sim.py                      # 1,000 GPUs, 50M images/day, 24 h
    .venv/bin/python bench/fleet_sim.py --scale 0.1          # the same per GPU, a tenth of everything
    .venv/bin/python bench/fleet_sim.py --hours 1 --gpus 100 --images-per-day 5e6

With --batch-share, that share of the jobs is sent as priority=batch: it waits behind the
interactive work (its own wait limit, --batch-max-wait), so the same fleet runs fuller or a
smaller one serves the day (--section names the section written, e.g. fleet_simulation_batch30).

Reports utilisation, batch fill, p50/p99 queue wait, shed and degraded counts, the busy GPUs
(which reproduce images x GPU-seconds per image / 86,400 s), and the fleet needed for the peak
hour. Writes bench/results/scale.json (section "fleet_simulation").
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduling import policy  # noqa: E402

SHAPES = [  # (shape key, share of jobs); production-like sizes, 30 steps
    ("v1|1024x1024|30|5|", 0.5),
    ("v1|896x1152|30|5|", 0.2),
    ("v1|1152x896|30|5|", 0.2),
    ("v1|768x768|30|5|", 0.1),
]
COUNTS = [(1, 0.55), (2, 0.20), (4, 0.20), (8, 0.05)]
MEAN_COUNT = sum(c * p for c, p in COUNTS)


def rate_curve(hours: float, burst_every_h: float = 6.0, burst_len_s: float = 600.0, burst_factor: float = 2.0):
    """Relative arrival rate per second: a diurnal sine (trough 0.4, peak 1.6) plus bursts."""
    t = np.arange(int(hours * 3600))
    diurnal = 1.0 + 0.6 * np.sin(2 * np.pi * (t / 86400.0 - 0.25 - 0.25))  # peak at 18:00
    bursts = np.where((t % int(burst_every_h * 3600)) < burst_len_s, burst_factor, 1.0)
    rel = diurnal * bursts
    return rel / rel.mean()


def simulate(gpus: int, images_per_day: float, hours: float, gpu_s_per_image: float, marginal: float,
             cap: int, fill_wait: float, starvation: float, max_wait: float, degrade_steps: int,
             degrade_share: float, seed: int = 1, batch_share: float = 0.0, batch_max_wait: float = 21600.0) -> dict:
    rng = np.random.default_rng(seed)
    rel = rate_curve(hours)
    jobs_per_s = images_per_day / 86400.0 / MEAN_COUNT * rel
    arrivals_per_s = rng.poisson(jobs_per_s)
    shape_p = np.array([p for _, p in SHAPES])
    count_vals = np.array([c for c, _ in COUNTS])
    count_p = np.array([p for _, p in COUNTS])
    step_s1 = gpu_s_per_image / 30.0

    def pass_seconds(shape: str, batch: int) -> float:
        steps = int(shape.split("|")[2])
        return steps * step_s1 * (1 + (batch - 1) * marginal)

    def per_image_seconds(shape: str) -> float:
        return pass_seconds(shape, 1)

    buckets: policy.Buckets = {}
    queued_seconds = 0.0  # interactive work queued (batch work never delays it by more than a pass)
    queued_batch_seconds = 0.0
    idle = list(range(gpus))
    events: list = []  # (time, kind, gpu, payload)
    busy_seconds = 0.0
    waits: list[float] = []
    batch_waits: list[float] = []
    fills = []
    shed = degraded = accepted = images_done = 0
    batch_accepted = batch_shed = 0
    offered_per_hour = np.zeros(int(math.ceil(hours)))
    job_seq = 0
    horizon = len(arrivals_per_s)

    def cap_of(shape: str) -> int:
        return cap

    def dequeue(shape: str, taken: list) -> None:
        nonlocal queued_seconds, queued_batch_seconds
        for e in taken:
            if e[4] == policy.BATCH:
                queued_batch_seconds -= e[1] * per_image_seconds(shape)
            else:
                queued_seconds -= e[1] * per_image_seconds(shape)

    def dispatch(gpu: int, now: float) -> bool:
        got = policy.take(buckets, now, cap_of, starvation)
        if got is None:
            return False
        shape, taken = got
        n = sum(e[1] for e in taken)
        dequeue(shape, taken)
        if n < cap:  # a partial batch waits up to the fill wait for more of its shape
            heapq.heappush(events, (now + fill_wait, 1, gpu, (shape, taken)))
        else:
            start(gpu, now, shape, taken)
        return True

    def start_idle(now: float) -> None:
        """Idle GPUs take work while there is some (an arrival may let one start at once)."""
        while idle and buckets:
            free = idle.pop()
            if not dispatch(free, now):
                idle.append(free)
                break

    def start(gpu: int, now: float, shape: str, taken: list) -> None:
        nonlocal busy_seconds, images_done
        n = sum(e[1] for e in taken)
        seconds = pass_seconds(shape, n)
        busy_seconds += seconds
        images_done += n
        fills.append(n / cap)
        for e in taken:
            (batch_waits if e[4] == policy.BATCH else waits).append(now - e[2])
        heapq.heappush(events, (now + seconds, 2, gpu, None))

    started = time.perf_counter()
    for second in range(horizon):
        # Arrivals of this second, spread uniformly inside it.
        k = int(arrivals_per_s[second])
        if k:
            offsets = np.sort(rng.random(k))
            shapes = rng.choice(len(SHAPES), size=k, p=shape_p)
            counts = rng.choice(count_vals, size=k, p=count_p)
            degrade_ok = rng.random(k) < degrade_share
            is_batch = rng.random(k) < batch_share
        next_arrival = 0
        while True:
            t_arrival = second + offsets[next_arrival] if k and next_arrival < k else second + 1.0
            # Process GPU events due before the next arrival.
            while events and events[0][0] <= t_arrival:
                t, kind, gpu, payload = heapq.heappop(events)
                if kind == 1:  # fill wait over: top up and run
                    shape, taken = payload
                    n = sum(e[1] for e in taken)
                    more = policy.take(buckets, t, cap_of, starvation, only_shape=shape, max_images=cap - n)
                    if more is not None:
                        dequeue(shape, more[1])
                        taken = taken + more[1]
                    if shape in buckets and not buckets[shape]:
                        del buckets[shape]
                    start(gpu, t, shape, taken)
                else:  # pass finished: the GPU is free
                    if not dispatch(gpu, t):
                        idle.append(gpu)
            if not k or next_arrival >= k:
                break
            shape = SHAPES[shapes[next_arrival]][0]
            count = int(counts[next_arrival])
            cost = count * per_image_seconds(shape)
            if is_batch[next_arrival]:  # its own wait limit; it waits behind the interactive work too
                if (queued_seconds + queued_batch_seconds) / gpus + cost > batch_max_wait:
                    batch_shed += 1
                else:
                    batch_accepted += 1
                    job_seq += 1
                    policy.push(buckets, shape, (str(job_seq), count, t_arrival, str(job_seq), policy.BATCH))
                    queued_batch_seconds += cost
                    start_idle(t_arrival)
                next_arrival += 1
                continue
            offered_per_hour[int(t_arrival // 3600)] += cost
            eta = queued_seconds / gpus + cost + fill_wait
            if eta > max_wait:
                low = shape.replace("|30|", f"|{degrade_steps}|")
                low_cost = count * per_image_seconds(low)
                if degrade_ok[next_arrival] and queued_seconds / gpus + low_cost + fill_wait <= max_wait * 1.5:
                    shape, cost = low, low_cost
                    degraded += 1
                else:
                    shed += 1
                    next_arrival += 1
                    continue
            accepted += 1
            job_seq += 1
            policy.push(buckets, shape, (str(job_seq), count, t_arrival, str(job_seq), policy.INTERACTIVE))
            queued_seconds += cost
            start_idle(t_arrival)
            next_arrival += 1
    wall = time.perf_counter() - started
    seconds = horizon
    waits_np = np.array(waits) if waits else np.array([0.0])
    batch_np = np.array(batch_waits) if batch_waits else np.array([0.0])
    offered_busy = offered_per_hour / 3600.0
    peak_busy = float(offered_busy.max())
    return {
        "gpus": gpus,
        "hours": hours,
        "images_per_day": images_per_day,
        "gpu_seconds_per_image_batch1": gpu_s_per_image,
        "batch_marginal_cost": marginal,
        "cap": cap,
        "accepted_jobs": accepted,
        "shed_jobs": shed,
        "degraded_jobs": degraded,
        "images_done": images_done,
        "utilisation": busy_seconds / (gpus * seconds),
        "busy_gpus": busy_seconds / seconds,
        "offered_busy_gpus_mean": float(offered_busy.mean()),
        "expected_busy_gpus": images_per_day * gpu_s_per_image / 86400.0,
        "mean_fill": float(np.mean(fills)) if fills else 0.0,
        "wait_p50_s": float(np.percentile(waits_np, 50)),
        "wait_p99_s": float(np.percentile(waits_np, 99)),
        "batch_share": batch_share,
        "batch_accepted_jobs": batch_accepted,
        "batch_shed_jobs": batch_shed,
        "batch_wait_p50_s": float(np.percentile(batch_np, 50)),
        "batch_wait_p99_s": float(np.percentile(batch_np, 99)),
        "batch_queued_at_end_s": queued_batch_seconds,
        "peak_hour_busy_gpus": peak_busy,
        "fleet_needed_for_peak_at_85pct": math.ceil(peak_busy / 0.85),
        "simulated_seconds": seconds,
        "wall_seconds": wall,
        "events_per_second": (accepted + len(fills)) / wall if wall else None,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--images-per-day", type=float, default=50e6)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--scale", type=float, default=1.0, help="multiply GPUs and traffic (same load per GPU)")
    p.add_argument("--gpu-seconds-per-image", type=float, default=1.2)
    p.add_argument("--marginal", type=float, default=1.0, help="extra cost of each batch row (1.0: no batching gain)")
    p.add_argument("--cap", type=int, default=8)
    p.add_argument("--fill-wait", type=float, default=0.3)
    p.add_argument("--starvation", type=float, default=10.0)
    p.add_argument("--max-wait", type=float, default=120.0)
    p.add_argument("--degrade-steps", type=int, default=8)
    p.add_argument("--degrade-share", type=float, default=0.5, help="share of clients sending allow_degrade")
    p.add_argument("--batch-share", type=float, default=0.0, help="share of the jobs sent as priority=batch")
    p.add_argument("--batch-max-wait", type=float, default=21600.0, help="batch jobs' own wait limit, seconds")
    p.add_argument("--section", default="fleet_simulation", help="the section of bench/results/scale.json to write")
    a = p.parse_args()
    gpus = max(1, round(a.gpus * a.scale))
    result = simulate(gpus, a.images_per_day * a.scale, a.hours, a.gpu_seconds_per_image, a.marginal, a.cap,
                      a.fill_wait, a.starvation, a.max_wait, a.degrade_steps, a.degrade_share,
                      batch_share=a.batch_share, batch_max_wait=a.batch_max_wait)
    result["command"] = "python bench/fleet_sim.py " + " ".join(sys.argv[1:])
    if a.scale != 1.0:
        result["scaled_back"] = {
            "busy_gpus": result["busy_gpus"] / a.scale,
            "expected_busy_gpus": result["expected_busy_gpus"] / a.scale,
            "fleet_needed_for_peak_at_85pct": math.ceil(result["peak_hour_busy_gpus"] / a.scale / 0.85),
        }
    for k, v in result.items():
        print(f"{k:34s} {v:.4g}" if isinstance(v, float) else f"{k:34s} {v}")
    out = ROOT / "bench" / "results" / "scale.json"
    data = json.loads(out.read_text()) if out.exists() else {}
    data[a.section] = result
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
