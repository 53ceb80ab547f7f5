"""How much a preview resembles the final image, at 25/50/75% of the steps: previews decoded from
the noisy latents (IMAGEGEN_PREVIEW_SOURCE=latents, before) and from the scheduler's clean-image
estimate x0 (IMAGEGEN_PREVIEW_SOURCE=x0, the default, after).

    .venv/bin/python bench/preview_error.py [--model PATH] [--steps 20] [--images 8] [--size 64]

Error: mean absolute difference per pixel and channel (0-255) between the preview and the final
image resized to the preview's size (the previews' own latent-to-RGB map, as served; at 100% the
error is that of the map itself, the floor neither source can go below). Writes
bench/results/preview_error.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")
os.environ.setdefault("IMAGEGEN_VAR_DIR", tempfile.mkdtemp(prefix="preview-error-"))

PROMPTS = ["a red circle on a blue background", "a yellow square on a black background",
           "a green triangle on a white background", "a blue star on a yellow background",
           "a white circle on a green background", "a purple square on a grey background",
           "an orange triangle on a blue background", "a pink heart on a white background"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--images", type=int, default=8)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--guidance", type=float, default=5.0)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    from gpu_tasks.tiny_pipeline import model_for_bench

    model_path = model_for_bench(a.model, Path(tempfile.mkdtemp()))
    import django

    django.setup()
    import numpy as np
    from django.test import override_settings
    from PIL import Image

    from gpu_tasks.pipeline import LoadedModel, Row, preview_size

    marks = {round(a.steps * f): f"{int(f * 100)}%" for f in (0.25, 0.5, 0.75, 1.0)}
    rows = [Row("bench", i, PROMPTS[i % len(PROMPTS)], "", 1000 + i) for i in range(a.images)]
    model = LoadedModel(model_path, a.device)
    results: dict[str, dict[str, float]] = {}
    for source in ("latents", "x0"):
        previews: dict[int, list] = {}

        def on_step(step, total, latents, previews=previews):
            if step in marks:
                previews[step] = model.preview_images(latents, list(range(len(rows))), a.size, a.size)
            return False

        with override_settings(IMAGEGEN_PREVIEW_SOURCE=source):
            finals = model.generate(rows, a.size, a.size, a.steps, a.guidance, on_step)
        assert finals is not None
        errors = {}
        for step, label in marks.items():
            diffs = []
            for preview, final in zip(previews[step], finals, strict=True):
                target = final.convert("RGB").resize(preview_size(a.size, a.size), Image.Resampling.BILINEAR)
                diffs.append(np.abs(np.asarray(preview, np.float32) - np.asarray(target, np.float32)).mean())
            errors[label] = float(np.mean(diffs))
        results[source] = errors
        print(f"{source:8s} " + "  ".join(f"{label}: {err:5.1f}" for label, err in errors.items()), flush=True)
    out = ROOT / "bench" / "results" / "preview_error.json"
    out.write_text(json.dumps({
        "command": "python bench/preview_error.py " + " ".join(sys.argv[1:]), "model": str(model_path),
        "family": model.family.name, "scheduler": type(model.pipe.scheduler).__name__, "steps": a.steps,
        "images": a.images, "size": a.size, "metric": "mean |preview - final| per pixel and channel, 0-255",
        "mean_abs_error": results,
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
