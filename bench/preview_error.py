"""How much a preview resembles the final image, at 25/50/75/100% of the steps, three ways:
the noisy latents through the linear latent-to-RGB map (IMAGEGEN_PREVIEW_SOURCE=latents), the
scheduler's clean-image estimate x0 through the linear map (the previews before the learned
decoder), and x0 through the model's own tiny decoder (gpu_tasks/preview_net.py, served where
the model ships one). Then what the decoder costs: the previews of 8 rows against one denoising
step at batch 8 (goal: under 3%).

    .venv/bin/python bench/preview_error.py [--model PATH] [--steps 20] [--images 8] [--size 64] [--out FILE]

Error: mean absolute difference per pixel and channel (0-255) between the preview and the final
image resized to the preview's size (at 100% that of the map or decoder itself). The prompts and
seeds (1000 on) are none the decoder was trained on (training/train_preview_decoder.py uses
training captions and seeds from 100000). Writes bench/results/preview_error.json (or --out).
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
    p.add_argument("--repeat", type=int, default=60, help="timed steps and decoder runs (median), in passes of --steps")
    p.add_argument("--out", default="", help="default: bench/results/preview_error.json")
    a = p.parse_args()
    from gpu_tasks.tiny_pipeline import model_for_bench

    model_path = model_for_bench(a.model, Path(tempfile.mkdtemp()))
    import django

    django.setup()
    import statistics
    import time

    import numpy as np
    from django.test import override_settings
    from PIL import Image

    from gpu_tasks.pipeline import LoadedModel, Row, preview_size

    marks = {round(a.steps * f): f"{int(f * 100)}%" for f in (0.25, 0.5, 0.75, 1.0)}
    rows = [Row("bench", i, PROMPTS[i % len(PROMPTS)], "", 1000 + i) for i in range(a.images)]
    model = LoadedModel(model_path, a.device)
    decoder = model.preview_net
    results: dict[str, dict[str, float]] = {}
    ways = [("latents", "latents", None), ("x0", "x0", None)] + ([("x0+decoder", "x0", decoder)] if decoder else [])
    shown = {}
    for name, source, net in ways:
        previews: dict[int, list] = {}

        def on_step(step, total, latents, previews=previews):
            if step in marks:
                previews[step] = model.preview_images(latents, list(range(len(rows))), a.size, a.size)
                shown[step] = latents.spatial().detach().clone()
            return False

        model.preview_net = net
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
        results[name] = errors
        print(f"{name:11s} " + "  ".join(f"{label}: {err:5.1f}" for label, err in errors.items()), flush=True)
    model.preview_net = decoder

    cost = {}
    if decoder is not None:
        # One step at batch 8 against the decoder on the 8 rows' x0, timed in turns inside the same
        # passes (each step's time excludes the decoding after it), so the shared machine's load
        # moves both alike.
        import torch

        from gpu_tasks import preview_net

        batch = [Row("bench", i, PROMPTS[i % len(PROMPTS)], "", 2000 + i) for i in range(8)]
        model.generate(batch, a.size, a.size, 2, a.guidance)  # warm
        step_times: list[float] = []
        net_times: list[float] = []
        picture_times: list[float] = []
        linear_times: list[float] = []
        clock = {"end": 0.0}

        def timed_step(step, total, latents):
            now = time.perf_counter()
            if step > 1:
                step_times.append(now - clock["end"])
            x0 = latents.spatial()
            started = time.perf_counter()
            preview_net.decode(decoder, x0)
            net_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            model.preview_images(x0, list(range(8)), a.size, a.size)
            picture_times.append(time.perf_counter() - started)
            model.preview_net = None
            started = time.perf_counter()
            model.preview_images(x0, list(range(8)), a.size, a.size)
            linear_times.append(time.perf_counter() - started)
            model.preview_net = decoder
            clock["end"] = time.perf_counter()
            return False

        for _ in range(max(1, a.repeat // a.steps)):
            clock["end"] = time.perf_counter()
            model.generate(batch, a.size, a.size, a.steps, a.guidance, timed_step)
        del torch
        step_ms = statistics.median(step_times) * 1000
        net_ms = statistics.median(net_times) * 1000
        pictures_ms = statistics.median(picture_times) * 1000
        linear_ms = statistics.median(linear_times) * 1000
        cost = {"step_ms_batch8": round(step_ms, 2), "decoder_ms_batch8": round(net_ms, 3),
                "decoder_share_of_step": round(net_ms / step_ms, 4),
                "previews_ms_batch8_with_decoder": round(pictures_ms, 3), "previews_ms_batch8_linear": round(linear_ms, 3),
                "decoder_params": sum(p.numel() for p in decoder.parameters())}
        print(f"one step at batch 8: {step_ms:.1f} ms; the decoder on 8 rows: {net_ms:.2f} ms ({net_ms / step_ms:.1%}); "
              f"8 previews with it (to PIL, resized): {pictures_ms:.2f} ms, with the linear map: {linear_ms:.2f} ms", flush=True)
    out = Path(a.out) if a.out else ROOT / "bench" / "results" / "preview_error.json"
    out.write_text(json.dumps({
        "command": "python bench/preview_error.py " + " ".join(sys.argv[1:]), "model": str(model_path),
        "family": model.family.name, "scheduler": type(model.pipe.scheduler).__name__, "steps": a.steps,
        "images": a.images, "size": a.size, "metric": "mean |preview - final| per pixel and channel, 0-255",
        "mean_abs_error": results, "decoder_cost": cost, "torch_threads": __import__("torch").get_num_threads(),
        "load_average": os.getloadavg(),
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
