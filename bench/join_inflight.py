"""GPU-seconds per delivered image with the request-hash cache alone, and with the cache plus
joining identical requests in flight (issue 48, item 1).

A discrete-event replay of the serving rules on one GPU worker, not of the stack. The stream is
bench/cache_share.py's: (user, prompt) pairs with Zipf-popular prompts and Zipf-active users, every
request without a seed under IMAGEGEN_SEED_POLICY=fixed (the design's skewed stream: a popular head
with a default seed), so identical prompts are identical requests. Requests arrive as a Poisson
process at each run's rate (requests per second) to its number of GPU workers.

  GPU      W workers sharing one FIFO queue; a free one takes up to --cap queued images, waiting at most
           --fill-wait for more when fewer are queued; a pass of n images costs the simulated
           accelerator's steps x step_seconds(n) (gpu_tasks/simulated.py: --step-ms per step at
           64x64, +--marginal per extra image); delivery comes --overhead after the pass (gate,
           publish). A job enters the queue --prompt-check seconds after it is submitted.
  cache    jobs/media/cache.py: the asker's own entry, or (k-anonymous) another user's once k
           distinct users asked; a cache hit makes no pass. Entries exist from delivery on, and
           only for the job that generated the image (a hit's or a joiner's copy is no entry).
  joining  jobs/media/cache.py in_flight: a request whose job is queued or running (from its
           submit to its delivery) joins it under the same rule (its owner's always, another
           user's once k asked); a joiner makes no pass and is delivered with its leader.

GPU-seconds are the sum of the passes' costs; every request is delivered once, so the figure is
GPU-seconds over requests.

    .venv/bin/python bench/join_inflight.py        # writes bench/results/join_inflight.json
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from collections import defaultdict, deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cache_share import stream  # noqa: E402


def pass_seconds(n: int, args) -> float:
    """gpu_tasks/simulated.py step_seconds at the stream's size, times the steps."""
    per_step = args.step_ms / 1000 * (args.width * args.height / 4096) * (1 + (n - 1) * args.marginal)
    return args.steps * per_step


def arrivals(requests: list[tuple[int, int]], rate: float, seed: int) -> list[tuple[float, int, int]]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for user, prompt in requests:
        t += rng.expovariate(rate)
        out.append((t, user, prompt))
    return out


def replay(timed: list[tuple[float, int, int]], args, join: bool, workers: int) -> dict:
    k = max(1, args.k) if args.scope == "k-anonymous" else 1
    asked: dict[int, set[int]] = defaultdict(set)
    entry_owners: dict[int, set[int]] = defaultdict(set)  # prompt -> users with an entry of their own
    in_flight: dict[int, dict] = {}  # prompt -> the live job generating it
    queue: deque = deque()  # jobs admitted to the GPU, FIFO
    events: list = []  # (time, order, kind, payload)
    order = 0

    def push(t: float, kind: str, payload) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (t, order, kind, payload))

    for t, user, prompt in timed:
        push(t, "submit", (user, prompt))
    free, gpu_seconds, passes = workers, 0.0, 0
    counts = {"own_hits": 0, "cross_user_hits": 0, "own_joins": 0, "cross_user_joins": 0, "generated": 0}
    latencies: list[float] = []

    fill = {"token": 0, "pending": False}
    sizes: list[int] = []

    def start_pass(now: float) -> None:
        nonlocal free, gpu_seconds, passes
        fill["pending"] = False
        taken = [queue.popleft() for _ in range(min(args.cap, len(queue)))]
        cost = pass_seconds(len(taken), args)
        free -= 1
        gpu_seconds += cost
        passes += 1
        sizes.append(len(taken))
        push(now + cost, "pass_end", taken)

    def gpu_wake(now: float) -> None:
        """A free worker takes a full batch at once, else waits the fill wait for more."""
        while free and len(queue) >= args.cap:
            start_pass(now)
        if not free or not queue:
            return
        if not fill["pending"]:
            fill["pending"], fill["token"] = True, fill["token"] + 1
            push(now + args.fill_wait, "fill_end", fill["token"])

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "submit":
            user, prompt = payload
            asked[prompt].add(user)
            shared_ok = len(asked[prompt]) >= k
            if user in entry_owners[prompt]:
                counts["own_hits"] += 1
                continue
            if entry_owners[prompt] and shared_ok:
                counts["cross_user_hits"] += 1
                continue
            leader = in_flight.get(prompt)
            if join and leader is not None and (leader["user"] == user or shared_ok):
                counts["own_joins" if leader["user"] == user else "cross_user_joins"] += 1
                continue
            job = {"user": user, "prompt": prompt, "submitted": now}
            counts["generated"] += 1
            in_flight[prompt] = job  # the note (the latest identical job in flight)
            push(now + args.prompt_check, "admit", job)
        elif kind == "admit":
            queue.append(payload)
            gpu_wake(now)
        elif kind == "fill_end":
            if fill["pending"] and payload == fill["token"] and free and queue:
                start_pass(now)
                gpu_wake(now)
        elif kind == "pass_end":
            free += 1
            for job in payload:
                push(now + args.overhead, "deliver", job)
            gpu_wake(now)
        elif kind == "deliver":
            job = payload
            entry_owners[job["prompt"]].add(job["user"])
            if in_flight.get(job["prompt"]) is job:
                del in_flight[job["prompt"]]
            latencies.append(now - job["submitted"])
    delivered = len(timed)
    latencies.sort()
    return {
        "mode": "cache+join" if join else "cache",
        "workers": workers,
        **counts,
        "passes": passes,
        "mean_batch": round(sum(sizes) / len(sizes), 2) if sizes else 0,
        "gpu_seconds": round(gpu_seconds, 1),
        "delivered_images": delivered,
        "gpu_seconds_per_delivered_image": round(gpu_seconds / delivered, 4),
        "generated_latency_p50_s": round(latencies[len(latencies) // 2], 2) if latencies else None,
        "generated_latency_p95_s": round(latencies[int(len(latencies) * 0.95)], 2) if latencies else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=100000)
    p.add_argument("--users", type=int, default=500)
    p.add_argument("--prompts", type=int, default=2000)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--user-zipf", type=float, default=0.8)
    p.add_argument("--own-repeat", type=float, default=0.2)
    p.add_argument("--favourites", type=int, default=5)
    p.add_argument("--scope", choices=("k-anonymous", "global"), default="k-anonymous")
    p.add_argument("--k", type=int, default=3, help="IMAGEGEN_CACHE_SHARE_K (the shipped default)")
    p.add_argument("--runs", nargs="+", default=["5:1", "50:4", "500:32"],
                   help="RATE:WORKERS pairs: requests per second, and GPU workers sharing one queue")
    p.add_argument("--cap", type=int, default=8, help="IMAGEGEN_BATCH_CAP")
    p.add_argument("--fill-wait", type=float, default=0.3, help="IMAGEGEN_FILL_WAIT")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--height", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=40.0, help="IMAGEGEN_SIM_STEP_MS")
    p.add_argument("--marginal", type=float, default=0.15, help="IMAGEGEN_SIM_BATCH_MARGINAL")
    p.add_argument("--overhead", type=float, default=0.25, help="seconds from a pass's end to delivery")
    p.add_argument("--prompt-check", type=float, default=0.05, help="seconds from submit to the GPU queue")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "join_inflight.json"))
    args = p.parse_args()
    requests = stream(args.requests, args.users, args.prompts, args.zipf, args.user_zipf, args.own_repeat,
                      args.favourites, args.seed)
    capacity = args.cap / pass_seconds(args.cap, args)
    runs = []
    for pair in args.runs:
        rate, workers = float(pair.split(":")[0]), int(pair.split(":")[1])
        timed = arrivals(requests, rate, args.seed)
        for join in (False, True):
            runs.append({"rate_per_s": rate, **replay(timed, args, join, workers)})
    result = {"command": "bench/join_inflight.py " + " ".join(sys.argv[1:]),
              "capacity_images_per_s_per_worker": round(capacity, 3),
              "stream": {k: v for k, v in vars(args).items() if k != "out"},
              "distinct_prompts_asked": len({q for _, q in requests}), "runs": runs}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'rate':>5}{'gpus':>5} {'mode':<11}{'GPU-s/img':>10}{'passes':>8}{'batch':>6}{'generated':>10}{'hits':>7}"
          f"{'joins':>7}{'p95 s':>7}")
    for run in runs:
        print(f"{run['rate_per_s']:>5g}{run['workers']:>5} {run['mode']:<11}{run['gpu_seconds_per_delivered_image']:>10.4f}{run['passes']:>8}"
              f"{run['mean_batch']:>6}{run['generated']:>10}{run['own_hits'] + run['cross_user_hits']:>7}"
              f"{run['own_joins'] + run['cross_user_joins']:>7}{run['generated_latency_p95_s'] or 0:>7}")


if __name__ == "__main__":
    main()
