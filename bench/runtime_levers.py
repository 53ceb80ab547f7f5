"""Per-step cost and quality change of each runtime lever, on and off side by side in one run, on
the shipped model and on a tiny random pipeline of every family.

    .venv/bin/python bench/runtime_levers.py [--families sd15,sdxl,sd3,flux,pixart] [--steps 8]
        [--batch 2] [--size 64] [--repeats 3] [--compile] [--device cpu]

Levers: CFG cutoff at half the steps (IMAGEGEN_CFG_CUTOFF=0.5), first-block step cache
(IMAGEGEN_STEP_CACHE=first-block, threshold 0.05), the text-encoder cache (a repeated prompt),
bf16, and for UNets channels_last and the classic attention processor (vs SDPA); torch.compile
with --compile (minutes on 2 CPU cores). A lever the family cannot honour is listed with the
reason the worker would refuse it. ms/step is the median of --repeats passes (the variants take
turns, pass by pass) over the steps; the
quality change is the mean absolute pixel difference (0-255) from the lever-off image at the
same seeds. On the tiny random pipelines the pixel error says how far a lever moves the output,
not whether a picture got worse; the shipped model's figure is the one to read for quality.
Writes bench/results/runtime_levers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")
os.environ.setdefault("IMAGEGEN_VAR_DIR", tempfile.mkdtemp(prefix="runtime-levers-"))

LEVERS: dict[str, dict] = {
    "baseline (levers off)": {},
    "cfg cutoff 0.5": {"IMAGEGEN_CFG_CUTOFF": 0.5},
    "first-block cache 0.05": {"IMAGEGEN_STEP_CACHE": "first-block", "IMAGEGEN_STEP_CACHE_THRESHOLD": 0.05},
    "text-encoder cache (repeat)": {"IMAGEGEN_TEXT_CACHE_SIZE": 64},
    "bf16": {"IMAGEGEN_DTYPE": "bfloat16"},
    "channels_last": {"IMAGEGEN_CHANNELS_LAST": True},
    "classic attention": {"IMAGEGEN_ATTENTION": "classic"},
}


def measure(model_path: Path, a, rows) -> dict:
    import numpy as np
    from django.test import override_settings

    from gpu_tasks.families import ModelConfigError
    from gpu_tasks.pipeline import LoadedModel

    levers = dict(LEVERS)
    if a.compile:
        levers["torch.compile"] = {"IMAGEGEN_COMPILE": True}
    out: dict[str, dict] = {}
    loaded = {}
    for name, overrides in levers.items():
        with override_settings(**overrides):
            try:
                loaded[name] = LoadedModel(model_path, a.device)
            except ModelConfigError as exc:
                out[name] = {"refused": str(exc)}
                print(f"  {name:28s} refused: {exc}", flush=True)
                continue
            loaded[name].generate(rows, a.size, a.size, 2, a.guidance)  # warm-up (the text cache's first sight)
    # Round robin: the variants take turns, so a neighbour's load on the shared cores falls on all alike.
    times: dict[str, list[float]] = {name: [] for name in loaded}
    images: dict[str, list] = {}
    for _ in range(a.repeats):
        for name, model in loaded.items():
            with override_settings(**levers[name]):
                started = time.perf_counter()
                images[name] = model.generate(rows, a.size, a.size, a.steps, a.guidance)
                times[name].append(time.perf_counter() - started)
    baseline = np.stack([np.asarray(im.convert("RGB"), np.float32) for im in images["baseline (levers off)"]])
    for name in loaded:
        pixels = np.stack([np.asarray(im.convert("RGB"), np.float32) for im in images[name]])
        ms = sorted(times[name])[len(times[name]) // 2] / a.steps * 1000  # the median pass
        out[name] = {"ms_per_step": ms, "pixel_error_vs_off": float(np.abs(pixels - baseline).mean())}
        print(f"  {name:28s} {ms:8.1f} ms/step   pixel error vs off {out[name]['pixel_error_vs_off']:5.2f}",
              flush=True)
    base = out["baseline (levers off)"]["ms_per_step"]
    for r in out.values():
        if "ms_per_step" in r:
            r["speedup_vs_off"] = base / r["ms_per_step"]
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="", help="the shipped model's place (default models/shapes-v1)")
    p.add_argument("--families", default="sd15,sdxl,sd3,flux,pixart")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--guidance", type=float, default=5.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    from gpu_tasks.tiny_pipeline import model_for_bench, write_tiny_family

    scratch = Path(tempfile.mkdtemp())
    targets = {"shipped": model_for_bench(a.model, scratch)}
    for family in [f for f in a.families.split(",") if f]:
        targets[f"tiny {family}"] = write_tiny_family(scratch / family, family)
    import django

    django.setup()
    import torch

    from gpu_tasks.pipeline import Row

    rows = [Row("bench", i, f"a red circle on a blue background {i}", "", 100 + i) for i in range(a.batch)]
    results = {}
    for label, path in targets.items():
        print(f"{label} ({path}):", flush=True)
        results[label] = measure(path, a, rows)
    out = ROOT / "bench" / "results" / "runtime_levers.json"
    out.write_text(json.dumps({"command": "python bench/runtime_levers.py " + " ".join(sys.argv[1:]),
                               "device": a.device, "threads": torch.get_num_threads(), "batch": a.batch,
                               "steps": a.steps, "size": a.size, "guidance": a.guidance, "results": results},
                              indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
