"""Output-classifier cost per image as a share of generation time, for the served model.

    .venv/bin/python bench/classifier_cost.py [--batch 8] [--steps N] [--repeats 3]

Generates a batch with the served pipeline (the shipped model by default), then classifies the
same images with the configured image classifier, both in this process on one thread, and
writes bench/results/classifier_cost.json.
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
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=0, help="default: IMAGEGEN_DEFAULT_STEPS")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    import django

    django.setup()
    from django.conf import settings

    from gpu_tasks.pipeline import Row, get_model
    from safety import image_gate

    steps = a.steps or settings.IMAGEGEN_DEFAULT_STEPS
    model = get_model()
    rows = [Row("bench", i, f"a red circle on a blue background {i}", "", i) for i in range(a.batch)]
    model.generate(rows, 64, 64, 2, settings.IMAGEGEN_DEFAULT_GUIDANCE)
    gen, cls = [], []
    for _ in range(a.repeats):
        started = time.perf_counter()
        images = model.generate(rows, 64, 64, steps, settings.IMAGEGEN_DEFAULT_GUIDANCE)
        gen.append(time.perf_counter() - started)
        started = time.perf_counter()
        image_gate.judge(images)
        cls.append(time.perf_counter() - started)
    result = {
        "command": "python bench/classifier_cost.py " + " ".join(sys.argv[1:]),
        "model": str(settings.IMAGEGEN_MODEL_PATH),
        "classifier": settings.IMAGEGEN_IMAGE_CLASSIFIER,
        "batch": a.batch,
        "steps": steps,
        "generation_seconds_per_image": min(gen) / a.batch,
        "classifier_seconds_per_image": min(cls) / a.batch,
        "classifier_share_of_generation": min(cls) / min(gen),
    }
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "results" / "classifier_cost.json"
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
