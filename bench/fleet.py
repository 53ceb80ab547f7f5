"""The fleet benchmark: a burst of one-image jobs from many users through the load balancer of
scripts/fleet.py's fleet (every Procfile process type on its own host), once without faults and
once with them (one GPU host SIGKILLed mid-pass, the classify host killed and started again, one
web host killed and started again, the classify host's link down, Redis restarted, a GPU host
added). Prints and writes bench/results/fleet.json (Redis as the broker) or
bench/results/fleet_rabbitmq.json (`--broker rabbitmq`): jobs/s, submit-to-done p50/p95, each GPU
worker's duty cycle, done jobs per GPU host (gpu2 runs the shipped model), images lost and
delivered twice, and the recovery time of each kill: the GPU host's work running elsewhere, the
batches at the killed image gate classified, the clients of the killed web host answered again.

    sudo .venv/bin/python bench/fleet.py [--broker redis|rabbitmq] [--jobs 300] [--users 20] [--submit-seconds 120] [--only faults|clean]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.fleet import BROKERS, Fleet, can_run  # noqa: E402
from scripts.fleet_burst import BURST_ENV, Burst, burst  # noqa: E402

KEEP = ("submitted", "statuses", "wall_s", "jobs_per_s", "submit_to_done_p50_s", "submit_to_done_p95_s", "gpu_duty_cycle",
        "images_lost", "duplicate_images", "held_or_blocked_public", "not_terminal", "over_attempts", "watchers",
        "watchers_terminal_not_once", "faults", "submit_errors", "done_by_host", "process_restarts",
        "process_restart_log")


def one(faults: bool, args) -> dict:
    spec = Burst(jobs=args.jobs, users=args.users, steps=args.steps, submit_seconds=args.submit_seconds,
                 sse_share=0.15, ws_share=0.15, deadline=args.deadline, faults=faults, add_gpu=faults)
    with Fleet(env=BURST_ENV, broker=args.broker) as fleet:
        started = time.time()
        fleet.up()
        up_s = time.time() - started
        report = burst(fleet, spec)
    out = {k: report[k] for k in KEEP}
    out["delivered_twice"] = report["duplicate_images"] + len(report["watchers_terminal_not_once"])
    out["fleet_up_s"] = round(up_s, 1)
    faults = {f["fault"]: f for f in report["faults"]}
    out["gpu_kill_to_running_elsewhere_s"] = faults.get("kill gpu1", {}).get("to_running_elsewhere_s")
    # One classify host, started again after restarted_after_s: its batches' verdicts once it is back.
    out["classify_kill_to_classified_s"] = faults.get("kill classify", {}).get("to_classified_s")
    # The killed web host's clients: the longest a dropped stream / a failed submit waited for
    # an answer through the load balancer (the other web host), from the kill.
    out["web_kill_to_streams_back_s"] = faults.get("kill web1", {}).get("to_streams_back_s")
    out["web_kill_to_submits_back_s"] = faults.get("kill web1", {}).get("to_submits_back_s")
    out["lease_plus_reaper_s"] = float(BURST_ENV["IMAGEGEN_LEASE_SECONDS"]) + float(BURST_ENV["IMAGEGEN_REAPER_INTERVAL"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--submit-seconds", type=float, default=120.0)
    parser.add_argument("--deadline", type=float, default=600.0)
    parser.add_argument("--only", choices=("clean", "faults"))
    parser.add_argument("--broker", choices=BROKERS, default="redis")
    args = parser.parse_args(argv)
    why = can_run(args.broker)
    if why:
        print(f"bench/fleet.py: {why}", file=sys.stderr)
        return 2
    results = {"broker": args.broker, "jobs": args.jobs, "users": args.users, "steps": args.steps, "submit_seconds": args.submit_seconds,
               "env": BURST_ENV}
    for name, faults in (("clean", False), ("faults", True)):
        if args.only in (None, name):
            results[name] = one(faults, args)
            print(json.dumps({name: results[name]}, indent=1), flush=True)
    out = ROOT / "bench" / "results" / ("fleet.json" if args.broker == "redis" else f"fleet_{args.broker}.json")
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
