"""Prompt filter benchmark: held-out recall and false positives, and latency.

    .venv/bin/python bench/prompt_filter_bench.py [--repeat 3] [--out bench/results/prompt_filter.json]
        [--policy safety/policy.json] [--before-ref REF | --no-before]

Quality is measured on ``training/prompt_gate/heldout.jsonl`` only: prompts written before the
policy terms, the corpus generator and the classifier head, that nothing is fitted to (the
benchmark first checks that none of them reads the same as a training-corpus row). "Stopped"
means block or review. Reported: recall per category, per evasion kind and per language; benign
look-alikes stopped, per kind and per language; the same for the rules alone. The dev corpora of
tests/test_prompt_filter.py (which thresholds and rules were tuned on) are reported separately.

The hand-written tune part (``training/prompt_gate/tune.jsonl``: benign look-alikes and some
disallowed prompts that thresholds and benign contexts were checked against, never trained on) is
reported separately, as "tune (fitted to)".

Latency: one thread, the filter warmed up, each prompt checked ``--repeat`` times; short prompts
(the held-out and dev prompts under 300 characters) and 2,000-character prompts (filler clauses
with and without one disallowed clause somewhere, and one unpunctuated run of words). "cold" clears
the filter's caches (readings, clause embeddings) before every check: the headline figure; "warm"
keeps them (repeated prompts and clauses, as in real traffic). The code before this change (the
prompt side of ``safety/`` at ``--before-ref``, default the merge base with main, with its policy
and head) is measured in the same run, interleaved prompt by prompt with the current code, so both
see the same machine load; the load average is recorded before and after.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from safety import normalize  # noqa: E402
from safety.prompt_filter import PromptFilter  # noqa: E402

HELDOUT = ROOT / "training" / "prompt_gate" / "heldout.jsonl"
# Issue 32's held-out part (ten more languages, undeclared languages, masked words, minors in
# sexualised contexts), written and committed before the rules it tests.
HELDOUT_32 = ROOT / "training" / "prompt_gate" / "heldout_issue32.jsonl"
TUNE = ROOT / "training" / "prompt_gate" / "tune.jsonl"
BEFORE_FILES = ["__init__.py", "confusables.py", "embeddings.py", "lexicon.py", "normalize.py", "policy.json",
                "prompt_filter.py", "prompt_rules.py", "prompt_semantic.py"]
LANGS = ["en", "es", "de", "fr", "pt", "it", "ru", "ja", "zh", "ko", "ar", "hi", "id", "tr", "vi", "fa", "pl", "uk",
         "nl", "sv", "el"]

# Filler for the 2,000-character latency prompts (not used by the quality figures).
LONG_FILLER = ["golden hour light over a quiet bay", "a wooden rowing boat", "impressionist brush strokes",
               "a cobblestone street after rain", "an orange cat on a fence", "dramatic cumulus clouds",
               "a vintage bicycle with a basket", "intricate art nouveau border", "a steaming bowl of soup",
               "tall pine trees", "a red telephone box", "highly detailed, 8k, masterpiece"]
LONG_CORES = ["a corpse with its throat slit open", "a woman with no clothes at all", "a man hanging from a noose",
              "two people having explicit sex", "a swastika flag at a rally", "a gunman firing into a crowd"]


def multilingual_long_prompts(rows: list[dict], n: int = 30) -> list[str]:
    """2,000-character prompts of benign clauses in the declared languages, mixed, with one
    disallowed clause in every other one: the most clauses for the language identifier to read."""
    rng = random.Random(7)
    benign = [r["prompt"] for r in rows if r["label"] == "benign" and r["kind"] == "language"]
    bad = [r["prompt"] for r in rows if r["label"] == "disallowed" and r["kind"] == "language"]
    out = []
    for i in range(n):
        parts: list[str] = []
        while len(", ".join(parts)) < 2000:
            parts.append(rng.choice(benign))
        if i % 2:
            parts.insert(rng.randrange(len(parts)), rng.choice(bad))
        out.append(", ".join(parts)[:2000])
    return out


def language_quality(f: PromptFilter, rows: list[dict]) -> dict:
    """Per declared language: disallowed stopped and benign passed (held-out rows of that language,
    every kind); per undeclared language: prompts that reached the fallback (the language reading
    says undeclared, so the policy's fallback applies) and prompts stopped."""
    per: dict[str, dict[str, list[int]]] = defaultdict(lambda: {"disallowed_stopped": [0, 0], "benign_passed": [0, 0]})
    und: dict[str, dict[str, list[int]]] = defaultdict(lambda: {"reached_fallback": [0, 0], "stopped": [0, 0]})
    misses = []
    for r in rows:
        v = f.check(r["prompt"])
        stopped = v.decision != "allow"
        if r["kind"] == "undeclared":
            reading = f.identify_language(r["prompt"], f.readings(r["prompt"])[0])
            fell_back = not reading.readable
            und[r["lang"]]["reached_fallback"][0] += fell_back
            und[r["lang"]]["reached_fallback"][1] += 1
            und[r["lang"]]["stopped"][0] += stopped
            und[r["lang"]]["stopped"][1] += 1
            if not fell_back:
                misses.append({"kind": "undeclared", "lang": r["lang"], "prompt": r["prompt"][:100], "read_as": reading.language})
            continue
        key = "disallowed_stopped" if r["label"] == "disallowed" else "benign_passed"
        ok = stopped if r["label"] == "disallowed" else not stopped
        per[r["lang"]][key][0] += ok
        per[r["lang"]][key][1] += 1
        if not ok:
            misses.append({"kind": r["kind"], "lang": r["lang"], "label": r["label"], "prompt": r["prompt"][:100],
                           "decision": v.decision, "category": v.category, "language": v.language})
    return {"declared": {k: {m: rate(*x) for m, x in v.items()} for k, v in sorted(per.items())},
            "undeclared": {k: {m: rate(*x) for m, x in v.items()} for k, v in sorted(und.items())},
            "misses": misses}


def language_id_latency(f: PromptFilter, prompts: list[str], repeat: int) -> dict:
    times = []
    for _ in range(repeat):
        for p in prompts:
            t = time.perf_counter()
            f.language_id.identify(p)
            times.append((time.perf_counter() - t) * 1000.0)
    return _summary(times)


def percentile(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def long_prompts(n: int = 30) -> list[str]:
    rng = random.Random(5)
    out = []
    for i in range(n):
        parts: list[str] = []
        while len(", ".join(parts)) < 2000:
            parts.append(rng.choice(LONG_FILLER))
        if i % 2:
            parts.insert(rng.randrange(len(parts)), rng.choice(LONG_CORES))
        text = ", ".join(parts)
        if i % 5 == 4:
            text = text.replace(",", "")  # one long unpunctuated run
        out.append(text[:2000])
    return out


def load_before(ref: str):
    """The prompt side of safety/ at git ``ref``, importable as its own package (``safety_before``),
    with that commit's policy and models/ (its head) reached through a symlink."""
    import subprocess
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="pf_before_"))
    pkg = tmp / "pkg" / "safety_before"
    pkg.mkdir(parents=True)
    for name in BEFORE_FILES:
        blob = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:safety/{name}"], capture_output=True, check=True).stdout
        (pkg / name).write_bytes(blob)
    models = tmp / "pkg" / "models"
    models.mkdir()
    for d in (ROOT / "models").iterdir():
        (models / d.name).symlink_to(d)
    sys.path.insert(0, str(tmp / "pkg"))
    mod = importlib.import_module("safety_before.prompt_filter")
    return mod.PromptFilter


def merge_base() -> str:
    import subprocess

    return subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _summary(times: list[float]) -> dict:
    return {
        "n_checks": len(times),
        "p50_ms": round(percentile(times, 0.5), 2),
        "p90_ms": round(percentile(times, 0.9), 2),
        "p99_ms": round(percentile(times, 0.99), 2),
        "max_ms": round(max(times), 2),
        "mean_ms": round(statistics.fmean(times), 2),
    }


def latency(filters: dict[str, PromptFilter], prompts: list[str], repeat: int) -> dict:
    """Per filter: cold (caches cleared before each check) and, for filters with caches, warm.
    The filters take turns prompt by prompt, so a burst of machine load hits them alike."""
    for f in filters.values():
        for p in prompts[:10]:
            f.check(p)
    cold: dict[str, list[float]] = {k: [] for k in filters}
    warm: dict[str, list[float]] = {k: [] for k in filters if hasattr(filters[k], "clear_caches")}
    for _ in range(repeat):
        for p in prompts:
            for name, f in filters.items():
                if name in warm:
                    f.clear_caches()
                t = time.perf_counter()
                f.check(p)
                cold[name].append((time.perf_counter() - t) * 1000.0)
    for _ in range(repeat):
        for p in prompts:
            for name in warm:
                t = time.perf_counter()
                filters[name].check(p)
                warm[name].append((time.perf_counter() - t) * 1000.0)
    out = {f"{k}_cold": _summary(v) for k, v in cold.items()}
    out.update({f"{k}_warm": _summary(v) for k, v in warm.items()})
    return out


def rate(a: int, b: int) -> dict:
    return {"stopped": a, "n": b, "rate": round(a / b, 4) if b else None}


def _source(v) -> str:
    """What stopped a prompt: a rule, the negative prompt, the head, or the nearest example."""
    if v.score >= 1.0:
        return "negative_prompt" if v.matched.startswith("negative prompt") else "rule"
    return "head" if "classifier" in v.matched else "nearest_example"


def quality(f: PromptFilter, rows: list[dict]) -> dict:
    groups: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    misses, false_pos = [], []
    for r in rows:
        v = f.check(r["prompt"])
        stopped = v.decision != "allow"
        if r["label"] == "disallowed":
            keys = [("disallowed", "all"), ("category", r["category"]), ("kind", r["kind"]), ("language", r["lang"])]
            if not stopped:
                misses.append({"kind": r["kind"], "category": r["category"], "lang": r["lang"], "prompt": r["prompt"][:120]})
        else:
            keys = [("benign", "all"), ("benign_kind", r["kind"]), ("benign_language", r["lang"])]
            if stopped:
                keys.append(("benign_stopped_by", _source(v)))
            if stopped:
                false_pos.append({"kind": r["kind"], "lang": r["lang"], "prompt": r["prompt"][:120], "by": _source(v),
                                  "decision": v.decision, "category": v.category, "matched": v.matched[:80]})
        for g, k in keys:
            groups[g][k][0] += stopped
            groups[g][k][1] += 1
    out = {g: {k: rate(*v) for k, v in sorted(d.items())} for g, d in groups.items()}
    out["misses"] = misses
    out["false_positives"] = false_pos
    return out


def dev_quality(f: PromptFilter) -> dict:
    spec = importlib.util.spec_from_file_location("_pf_tests", ROOT / "tests" / "test_prompt_filter.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    dis = list(mod.ALL_DISALLOWED) + list(mod.KNOWN_MISSES)
    return {"disallowed": rate(sum(f.check(p).decision != "allow" for p in dis), len(dis)),
            "benign": rate(sum(f.check(p).decision != "allow" for p in mod.BENIGN), len(mod.BENIGN))}, mod


def overlap_with_corpus(rows: list[dict]) -> tuple[int, int]:
    """(held-out prompts that read like a generated corpus row, of which the trainer drops none).
    The trainer drops every corpus row that reads like a held-out prompt, so the second is 0
    by construction; the first says how many such rows the generator produced."""
    from training.prompt_corpus import build

    held = {normalize.canonicalize(r["prompt"]) for r in rows}
    generated = {normalize.canonicalize(r["text"]) for r in build()}
    trained = generated - held
    return len(held & generated), sum(normalize.canonicalize(r["prompt"]) in trained for r in rows)


def terms_per_language(f: PromptFilter) -> dict:
    out = {}
    for lang in LANGS:
        if lang == "en":
            out[lang] = sum(len(c.terms) + len(c.euphemisms) for c in f.categories)
        else:
            out[lang] = sum(len(c.translations.get(lang, [])) for c in f.categories)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "prompt_filter.json"))
    ap.add_argument("--policy", default=None, help="policy file (default: the shipped one)")
    ap.add_argument("--before-ref", default=None, help="git ref of the code to compare latency with (default: merge base with main)")
    ap.add_argument("--no-before", action="store_true", help="skip the before/after latency comparison")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    rows = [json.loads(line) for line in HELDOUT.read_text(encoding="utf-8").splitlines() if line.strip()]
    n_generated, n_overlap = overlap_with_corpus(rows)

    rows32 = [json.loads(line) for line in HELDOUT_32.read_text(encoding="utf-8").splitlines() if line.strip()]
    tune_rows = [json.loads(line) for line in TUNE.read_text(encoding="utf-8").splitlines() if line.strip()]
    t = time.perf_counter()
    rules = PromptFilter.load(args.policy, use_embeddings=False)
    load_rules_ms = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    full = PromptFilter.load(args.policy, use_embeddings=True)
    load_full_ms = (time.perf_counter() - t) * 1000

    q_full, q_rules = quality(full, rows), quality(rules, rows)
    declared_rows = rows + [r for r in rows32 if r["kind"] != "undeclared"]
    q32_full = quality(full, [r for r in rows32 if r["kind"] != "undeclared"])
    q32_rules = quality(rules, [r for r in rows32 if r["kind"] != "undeclared"])
    lang_full = language_quality(full, declared_rows + [r for r in rows32 if r["kind"] == "undeclared"])
    lang_rules = language_quality(rules, declared_rows + [r for r in rows32 if r["kind"] == "undeclared"])
    q_tune = quality(full, tune_rows)
    dev_full, mod = dev_quality(full)
    dev_rules, _ = dev_quality(rules)
    short = [r["prompt"] for r in rows if len(r["prompt"]) < 300]
    short += [p for p in list(mod.BENIGN) + list(mod.ALL_DISALLOWED) if len(p) < 300]
    longs = long_prompts()
    longs_ml = multilingual_long_prompts(rows32)
    filters: dict = {"rules_only": rules, "with_head": full}
    before_ref = None
    if not args.no_before:
        before_ref = args.before_ref or merge_base()
        before_cls = load_before(before_ref)
        filters["before_rules_only"] = before_cls.load(use_embeddings=False)
        filters["before_with_head"] = before_cls.load(use_embeddings=True)
    load_before_lat = os.getloadavg()
    lat_short = latency(filters, short, args.repeat)
    lat_long = latency(filters, longs, args.repeat)
    lat_long_ml = latency({k: v for k, v in filters.items() if not k.startswith("before")}, longs_ml, args.repeat)
    lid = {"2000_chars": language_id_latency(full, longs, args.repeat),
           "2000_chars_multilingual": language_id_latency(full, longs_ml, args.repeat),
           "short": language_id_latency(full, short, args.repeat)}
    load_after_lat = os.getloadavg()
    results = {
        "command": " ".join([".venv/bin/python", "bench/prompt_filter_bench.py"] + (argv if argv is not None else sys.argv[1:])),
        "policy_version": full.version,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "torch_threads": torch.get_num_threads(),
        "heldout": {"file": str(HELDOUT.relative_to(ROOT)), "n": len(rows), "rows_also_in_training_corpus": n_overlap,
                    "generated_rows_reading_like_heldout_dropped_by_trainer": n_generated},
        "head": full.head.name if full.head is not None else None,
        "quality_heldout": {"with_head": q_full, "rules_only": q_rules},
        "quality_heldout_issue32": {"file": str(HELDOUT_32.relative_to(ROOT)), "n": len(rows32),
                                    "with_head": q32_full, "rules_only": q32_rules},
        "languages": {"declared": sorted(full.languages.declared), "undeclared": full.languages.undeclared,
                      "with_head": lang_full, "rules_only": lang_rules},
        "quality_tune_fitted_to": {"file": str(TUNE.relative_to(ROOT)), "with_head": q_tune},
        "quality_dev": {"with_head": dev_full, "rules_only": dev_rules},
        "terms_per_language": terms_per_language(full),
        "load_ms": {"rules_only": round(load_rules_ms, 1), "with_embeddings": round(load_full_ms, 1)},
        "latency": {
            "before_ref": before_ref,
            "load_average_before_after": [round(x, 2) for x in load_before_lat + load_after_lat],
            "short": {"n_prompts": len(short), **lat_short},
            "2000_chars": {"n_prompts": len(longs), **lat_long},
            "2000_chars_multilingual": {"n_prompts": len(longs_ml), **lat_long_ml},
            "language_id_only": lid,
        },
    }
    q = q_full
    print(f"prompt filter benchmark, policy {full.version}; held-out {len(rows)} prompts "
          f"({n_overlap} in the training corpus; {n_generated} generated look-alikes dropped by the trainer)")
    print(f"{'held-out group':28}{'with head':>14}{'rules only':>14}")
    for g in ("disallowed", "category", "kind", "benign", "benign_kind"):
        for k, v in q[g].items():
            r = q_rules[g][k]
            print(f"{g + ':' + k:28}{v['stopped']:>6}/{v['n']:<4}{v['rate']:>5.0%}{r['stopped']:>6}/{r['n']:<4}{r['rate']:>5.0%}")
    print("benign stopped by: " + ", ".join(f"{k} {v['stopped']}" for k, v in q.get("benign_stopped_by", {}).items()))
    print(f"{'language':10}{'terms':>6}{'disallowed stopped':>22}{'benign stopped':>18}")
    for lang in LANGS:
        d = q["language"].get(lang, {"stopped": 0, "n": 0})
        b = q["benign_language"].get(lang, {"stopped": 0, "n": 0})
        print(f"{lang:10}{results['terms_per_language'][lang]:>6}{d['stopped']:>16}/{d['n']:<5}{b['stopped']:>12}/{b['n']:<5}")
    print(f"issue-32 held-out part ({len(rows32)} prompts): " + ", ".join(
        f"{g}:{k} {v['stopped']}/{v['n']}" for g in ("kind", "benign_kind") for k, v in q32_full[g].items()))
    print(f"{'declared language':18}{'terms':>6}{'disallowed stopped':>20}{'benign passed':>16}   (with head | rules only)")
    for lang in LANGS:
        x = lang_full["declared"].get(lang)
        y = lang_rules["declared"].get(lang)
        if x is None:
            continue
        d, b = x["disallowed_stopped"], x["benign_passed"]
        d2, b2 = y["disallowed_stopped"], y["benign_passed"]
        print(f"{lang:18}{results['terms_per_language'][lang]:>6}{d['stopped']:>14}/{d['n']:<5}{b['stopped']:>10}/{b['n']:<5}"
              f"   | {d2['stopped']}/{d2['n']}, {b2['stopped']}/{b2['n']}")
    print(f"{'undeclared language':20}{'reached fallback':>18}{'stopped':>10}")
    for lang, x in lang_full["undeclared"].items():
        print(f"{lang:20}{x['reached_fallback']['stopped']:>12}/{x['reached_fallback']['n']:<5}{x['stopped']['stopped']:>6}/{x['stopped']['n']}")
    for m in lang_full["misses"]:
        print("  miss:", m)
    print(f"dev corpora (tuned on): disallowed {dev_full['disallowed']['stopped']}/{dev_full['disallowed']['n']}, "
          f"benign flagged {dev_full['benign']['stopped']}/{dev_full['benign']['n']}")
    print(f"tune part (fitted to): disallowed {q_tune['disallowed']['all']['stopped']}/{q_tune['disallowed']['all']['n']}, "
          f"benign stopped {q_tune['benign']['all']['stopped']}/{q_tune['benign']['all']['n']}")
    print(f"latency (before = {before_ref}); load average before/after: {results['latency']['load_average_before_after']}")
    for name in ("short", "2000_chars", "2000_chars_multilingual", "language_id_only"):
        for mode, x in results["latency"][name].items():
            if isinstance(x, dict):
                print(f"latency {name:11}{mode:24} p50 {x['p50_ms']:7.2f} ms  p99 {x['p99_ms']:7.2f} ms  max {x['max_ms']:7.2f} ms")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
