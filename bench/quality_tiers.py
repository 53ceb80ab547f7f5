"""The shipped model's quality tiers: colour and shape accuracy (bench/model_eval.py's judges)
against seconds per image, for each tier's steps with and without the CFG cutoff.

    .venv/bin/python bench/quality_tiers.py [--n 100] [--batch 25] [--tiers low:8,medium:20,high:40]

Images are made by the worker's own LoadedModel (the served code path: the cutoff as the pass's
variant, as a tier that bundles it runs), at
64x64 with guidance 6.0, on held-out captions (model_eval's EVAL_SEED). Seconds per image are
this CPU's wall time of the pipeline calls (one torch thread). Writes
bench/results/quality_tiers.json.
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
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")
os.environ.setdefault("IMAGEGEN_VAR_DIR", tempfile.mkdtemp(prefix="quality-tiers-"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=str(ROOT / "models" / "shapes-v1"))
    p.add_argument("--classifier", default=str(ROOT / "models" / "shapes-classifier-v1"))
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--batch", type=int, default=25)
    p.add_argument("--guidance", type=float, default=6.0)
    p.add_argument("--tiers", default="low:8,medium:20,high:40")
    p.add_argument("--cutoffs", default="0,0.5")
    a = p.parse_args()
    import django

    django.setup()
    import numpy as np
    from model_eval import EVAL_SEED, eval_captions, judge_colours

    from gpu_tasks.pipeline import LoadedModel, Row
    from safety.shapes_classifier import ShapesClassifier

    items = eval_captions(a.n)
    clf = ShapesClassifier.from_pretrained(a.classifier)
    tiers = [(name, int(steps)) for name, steps in (t.split(":") for t in a.tiers.split(","))]
    results = []
    model = LoadedModel(Path(a.model), "cpu")
    for cutoff in [float(c) for c in a.cutoffs.split(",")]:
        variant = f"cfg-cutoff={cutoff:g}" if cutoff > 0 else ""
        for tier, steps in tiers:
            images, seconds = [], 0.0
            for s in range(0, len(items), a.batch):
                chunk = items[s:s + a.batch]
                rows = [Row("tiers", i, caption, "", EVAL_SEED + s + i) for i, (caption, _) in enumerate(chunk)]
                started = time.perf_counter()
                made = model.generate(rows, 64, 64, steps, a.guidance, variant=variant)
                seconds += time.perf_counter() - started
                assert made is not None
                images.extend(made)
            scores = clf.scores(images)
            colours_ok, kind_ok = [], []
            for (_, gt), image, score in zip(items, images, scores, strict=True):
                shape = gt.shapes[0]
                fg, bg = judge_colours(np.asarray(image.convert("RGB")))
                colours_ok.append(fg == shape.colour and bg == gt.background)
                kind_ok.append(max(score, key=score.get) == shape.kind)
            row = {"tier": tier, "steps": steps, "cfg_cutoff": cutoff, "s_per_image": seconds / len(images),
                   "colour_accuracy": float(np.mean(colours_ok)), "shape_accuracy": float(np.mean(kind_ok))}
            results.append(row)
            print(f"{tier:7s} {steps:3d} steps  cfg cutoff {cutoff:3.1f}: {row['s_per_image']:.3f} s/image  "
                  f"colours {row['colour_accuracy']:.1%}  shape {row['shape_accuracy']:.1%}", flush=True)
    out = ROOT / "bench" / "results" / "quality_tiers.json"
    out.write_text(json.dumps({"command": "python bench/quality_tiers.py " + " ".join(sys.argv[1:]),
                               "model": a.model, "n_captions": len(items), "guidance": a.guidance, "size": "64x64",
                               "device": "cpu, 1 torch thread", "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
