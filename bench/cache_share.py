"""The request-hash cache's hit rate and GPU-seconds saved per scope, on a replay of a Zipf-like
prompt stream from many users (issue 28, item 14).

A replay of the cache's serving rules, not of the stack: each request is (user, prompt), sent
without a seed under IMAGEGEN_SEED_POLICY=fixed (where repeats come from), so identical prompts
are identical requests. Prompts follow Zipf(s) over --prompts (bench/admission.py's names and
exponent); users' activity follows Zipf(--user-zipf) over --users, and each user has a few
favourite prompts they repeat (--own-repeat of their requests), the way people re-run their own
prompts. The rules are those of jobs/media/cache.py:

  user          a hit only on the asker's own earlier request
  k-anonymous   the asker's own entry (instant), else another user's entry once k distinct users,
                the asker among them, asked for that request (answered no sooner than a fresh job)
  global        any earlier request

Every miss is generated and delivered (below capacity, every job ends before the next identical
one arrives), costing --gpu-seconds-per-image (default: the measured figure of
bench/results/admission.json's random-seed run, GPU-seconds over images generated).

    .venv/bin/python bench/cache_share.py            # writes bench/results/cache_share.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def measured_gpu_seconds_per_image() -> float | None:
    try:
        run = json.loads((ROOT / "bench" / "results" / "admission.json").read_text())["cache"]["random"]
        return run["gpu_seconds"] / run["images_generated"]
    except (OSError, KeyError, ZeroDivisionError, ValueError):
        return None


def stream(requests: int, users: int, prompts: int, zipf_s: float, user_zipf: float, own_repeat: float,
           favourites: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    prompt_weights = [1 / (k ** zipf_s) for k in range(1, prompts + 1)]
    user_weights = [1 / (k ** user_zipf) for k in range(1, users + 1)]
    favourite = {u: rng.choices(range(prompts), weights=prompt_weights, k=favourites) for u in range(users)}
    out = []
    for _ in range(requests):
        user = rng.choices(range(users), weights=user_weights)[0]
        prompt = rng.choice(favourite[user]) if rng.random() < own_repeat else rng.choices(range(prompts), weights=prompt_weights)[0]
        out.append((user, prompt))
    return out


def replay(requests: list[tuple[int, int]], scope: str, k: int = 1) -> dict:
    asked: dict[int, set[int]] = defaultdict(set)  # prompt -> distinct users who asked (the askers set)
    delivered: dict[int, set[int]] = defaultdict(set)  # prompt -> users who own an entry for it
    own = cross = 0
    for user, prompt in requests:
        asked[prompt].add(user)  # lookup counts the asker first
        if user in delivered[prompt]:
            own += 1
            continue
        if delivered[prompt] and (scope == "global" or (scope == "k-anonymous" and len(asked[prompt]) >= k)):
            cross += 1  # served from another user's entry; remembered under the asker's key too
            delivered[prompt].add(user)
            continue
        delivered[prompt].add(user)  # a miss: generated, delivered, remembered
    hits = own + cross
    return {"scope": scope, "k": k if scope == "k-anonymous" else None, "requests": len(requests), "hits": hits,
            "own_hits": own, "cross_user_hits": cross, "hit_rate": round(hits / len(requests), 4),
            "generated": len(requests) - hits,
            "prompts_never_shared": sum(1 for p, who in asked.items() if len(who) < k) if scope == "k-anonymous" else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--users", type=int, default=500)
    p.add_argument("--prompts", type=int, default=2000)
    p.add_argument("--zipf", type=float, default=1.1, help="prompt popularity exponent (bench/admission.py's)")
    p.add_argument("--user-zipf", type=float, default=0.8, help="user activity exponent")
    p.add_argument("--own-repeat", type=float, default=0.2, help="share of a user's requests that repeat a favourite")
    p.add_argument("--favourites", type=int, default=5)
    p.add_argument("--k", type=int, nargs="+", default=[2, 3, 5, 10])
    p.add_argument("--gpu-seconds-per-image", type=float, default=None)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "cache_share.json"))
    args = p.parse_args()
    per_image = args.gpu_seconds_per_image or measured_gpu_seconds_per_image() or 0.643
    requests = stream(args.requests, args.users, args.prompts, args.zipf, args.user_zipf, args.own_repeat,
                      args.favourites, args.seed)
    runs = [replay(requests, "user"), *(replay(requests, "k-anonymous", k) for k in args.k), replay(requests, "global")]
    for run in runs:
        run["gpu_seconds"] = round(run["generated"] * per_image, 1)
        run["gpu_seconds_saved"] = round(run["hits"] * per_image, 1)
        run["gpu_seconds_saved_share"] = round(run["hits"] / run["requests"], 4)
    result = {"command": "bench/cache_share.py " + " ".join(sys.argv[1:]), "gpu_seconds_per_image": round(per_image, 4),
              "stream": {k: v for k, v in vars(args).items() if k not in ("out",)},
              "distinct_prompts_asked": len({q for _, q in requests}), "runs": runs}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'scope':<16}{'k':>4}{'hit rate':>10}{'own':>8}{'cross':>8}{'GPU-s saved':>13}")
    for run in runs:
        print(f"{run['scope']:<16}{run['k'] or '':>4}{run['hit_rate']:>10.3f}{run['own_hits']:>8}{run['cross_user_hits']:>8}"
              f"{run['gpu_seconds_saved']:>13}")


if __name__ == "__main__":
    main()
