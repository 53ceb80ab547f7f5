"""Per-step cost with each runtime lever on and off, side by side in one run.

    .venv/bin/python bench/runtime_levers.py [--model PATH] [--steps 10] [--batch 4] [--compile]

Levers: SDPA attention (vs the classic processor), channels_last, bf16 (on CPU; fp16 only on a
GPU), torch.compile (opt-in with --compile: compiling takes minutes on 2 CPU cores). Writes
bench/results/runtime_levers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    import tempfile

    from gpu_tasks.tiny_pipeline import model_for_bench

    model_path = model_for_bench(a.model, Path(tempfile.mkdtemp()))
    import django

    django.setup()
    import torch
    from django.test import override_settings

    from gpu_tasks.pipeline import LoadedModel, Row

    variants = {
        "baseline (sdpa, fp32)": {},
        "classic attention": {"IMAGEGEN_ATTENTION": "classic"},
        "channels_last": {"IMAGEGEN_CHANNELS_LAST": True},
        "bf16": {"IMAGEGEN_DTYPE": "bfloat16"},
    }
    if a.compile:
        variants["torch.compile"] = {"IMAGEGEN_COMPILE": True}
    rows = [Row("bench", i, f"a red circle on a blue background {i}", "", i) for i in range(a.batch)]
    results = {}
    for name, overrides in variants.items():
        with override_settings(**overrides):
            model = LoadedModel(model_path, "cpu")
            warm = time.perf_counter()
            model.generate(rows, 64, 64, 2, 5.0)
            warm_s = time.perf_counter() - warm
            times = []
            for _ in range(a.repeats):
                started = time.perf_counter()
                model.generate(rows, 64, 64, a.steps, 5.0)
                times.append(time.perf_counter() - started)
        per_step_ms = min(times) / a.steps * 1000
        results[name] = {"ms_per_step_batch": per_step_ms, "warm_up_s": warm_s}
        print(f"{name:24s} {per_step_ms:8.1f} ms/step at batch {a.batch}   (first call {warm_s:.1f}s)", flush=True)
    base = results["baseline (sdpa, fp32)"]["ms_per_step_batch"]
    for r in results.values():
        r["speedup_vs_baseline"] = base / r["ms_per_step_batch"]
    out = ROOT / "bench" / "results" / "runtime_levers.json"
    out.write_text(json.dumps({"command": "python bench/runtime_levers.py " + " ".join(sys.argv[1:]), "device": "cpu",
                               "threads": torch.get_num_threads(), "model": str(model_path), "batch": a.batch,
                               "steps": a.steps, "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
