"""Latency benchmark of the prompt filter.

    .venv/bin/python bench/prompt_filter_bench.py [--repeat 3] [--out bench/results/prompt_filter.json]

Prompts: the corpora of tests/test_prompt_filter.py (benign, rule cases, semantic
paraphrases, demo shapes) plus benign prompts built from templates, a few hundred in
all. Each prompt is checked once per repeat, with and without embeddings; the filter
is warmed up first (policy load and example embeddings are not counted). Also records
the decision counts (benign false positives, disallowed recall) for the same corpus.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from safety.prompt_filter import PromptFilter  # noqa: E402


def _load_corpora():
    spec = importlib.util.spec_from_file_location("_pf_tests", ROOT / "tests" / "test_prompt_filter.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SUBJECTS = ["a lighthouse", "a red fox", "an old bicycle", "a teapot", "a mountain village", "a sailboat",
            "a robot gardener", "a city street", "a bowl of fruit", "a snowy forest", "a jazz band", "a desert canyon"]
STYLES = ["oil painting", "35mm photo, golden hour", "watercolor", "isometric 3d render, 4k",
          "pencil sketch", "studio ghibli style, highly detailed, trending on artstation, soft light, wide angle"]


def percentile(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def run(f: PromptFilter, prompts, repeat: int):
    for p in prompts[:20]:  # warm-up
        f.check(p)
    times = []
    for _ in range(repeat):
        for p in prompts:
            t = time.perf_counter()
            f.check(p)
            times.append((time.perf_counter() - t) * 1000.0)
    return {
        "n_checks": len(times),
        "p50_ms": round(percentile(times, 0.5), 3),
        "p90_ms": round(percentile(times, 0.9), 3),
        "p99_ms": round(percentile(times, 0.99), 3),
        "mean_ms": round(statistics.fmean(times), 3),
        "max_ms": round(max(times), 3),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "prompt_filter.json"))
    args = ap.parse_args(argv)

    corp = _load_corpora()
    templated = [f"{s}, {st}" for s in SUBJECTS for st in STYLES]
    benign = list(corp.BENIGN) + templated
    disallowed = list(corp.ALL_DISALLOWED) + list(corp.KNOWN_MISSES)
    prompts = [p for pair in zip(benign, disallowed) for p in pair] + benign[len(disallowed):] + disallowed[len(benign):]

    t = time.perf_counter()
    rules = PromptFilter.load(use_embeddings=False)
    load_rules_ms = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    full = PromptFilter.load(use_embeddings=True)
    load_full_ms = (time.perf_counter() - t) * 1000

    results = {
        "command": " ".join([".venv/bin/python", "bench/prompt_filter_bench.py"] + (argv if argv is not None else sys.argv[1:])),
        "policy_version": full.version,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "torch_threads": __import__("torch").get_num_threads(),
        "n_prompts": len(prompts),
        "n_benign": len(benign),
        "n_disallowed": len(disallowed),
        "load_ms": {"rules_only": round(load_rules_ms, 1), "with_embeddings": round(load_full_ms, 1)},
        "latency": {"rules_only": run(rules, prompts, args.repeat), "with_embeddings": run(full, prompts, args.repeat)},
        "decisions": {},
    }
    for name, f in (("rules_only", rules), ("with_embeddings", full)):
        fp = sum(f.check(p).decision != "allow" for p in benign)
        caught = sum(f.check(p).decision != "allow" for p in disallowed)
        results["decisions"][name] = {
            "benign_flagged": fp,
            "benign_total": len(benign),
            "disallowed_flagged": caught,
            "disallowed_total": len(disallowed),
        }

    print(f"prompt filter benchmark ({len(prompts)} prompts x {args.repeat}, policy {full.version})")
    print(f"{'mode':18}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'mean ms':>9}{'benign flagged':>16}{'disallowed flagged':>20}")
    for name in ("rules_only", "with_embeddings"):
        lat, d = results["latency"][name], results["decisions"][name]
        print(f"{name:18}{lat['p50_ms']:9.2f}{lat['p90_ms']:9.2f}{lat['p99_ms']:9.2f}{lat['mean_ms']:9.2f}"
              f"{d['benign_flagged']:>9}/{d['benign_total']:<6}{d['disallowed_flagged']:>12}/{d['disallowed_total']:<7}")
    print(f"load: rules only {load_rules_ms:.0f} ms, with embeddings {load_full_ms:.0f} ms (includes torch import)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
