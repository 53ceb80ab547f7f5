"""Train the tiny preview decoder of a shipped model (gpu_tasks/preview_net.py), on the model's own
passes, the way TAESD distils a VAE decoder:

    python -m training.train_preview_decoder --model models/shapes-v1            # collect, train, ship
    python -m training.train_preview_decoder --model models/shapes-v1 --data /tmp/pd.pt --reuse

1. Collect: run the served path (gpu_tasks.pipeline.LoadedModel.generate, x0 previews) on training
   captions (training.shapes_data, seed TRAIN_SEED) with seeds from 100000 on (the benchmark and
   the tests use others), at 20 steps (and some at 8 and 40), guidance 4-7; keep the clean-image
   estimate x0 of every step and the final image (the VAE's decode of the final latents).
2. Train: L1 between the decoder's picture of each step's x0 and that pass's final image.
3. Ship: <model>/preview_decoder.safetensors, with what it was trained on and its held-out
   error in the file's metadata.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SEED_BASE = 100_000


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def _django(model: Path) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")
    os.environ.setdefault("IMAGEGEN_VAR_DIR", tempfile.mkdtemp(prefix="preview-decoder-"))
    os.environ.setdefault("IMAGEGEN_MODEL_PATH", str(model))
    import django

    django.setup()


def collect(model_path: Path, images: int, batch: int, seed_base: int, threads: int) -> dict:
    """x0 of every step (n_passes*steps, C, h, w) with the index of its final image, and the finals."""
    import torch
    from django.test import override_settings

    from gpu_tasks.pipeline import LoadedModel, Row
    from training.shapes_data import ShapesDataset, caption_for
    from training.train import TRAIN_SEED

    torch.set_num_threads(threads)
    model = LoadedModel(model_path, "cpu")
    dataset = ShapesDataset(seed=TRAIN_SEED, p_two=0.25)
    rng = np.random.default_rng(seed_base)
    x0s: list = []
    owners: list = []
    fractions: list = []
    finals: list[np.ndarray] = []
    started = time.time()
    for start in range(0, images, batch):
        n = min(batch, images - start)
        captions = []
        for i in range(start, start + n):
            _, _, gt = dataset[i]
            captions.append(caption_for(gt, [bool(rng.random() >= 0.3) for _ in gt.shapes]))
        rows = [Row("train", i, captions[i], "", seed_base + start + i) for i in range(n)]
        steps = int(rng.choice([20, 20, 20, 8, 40]))
        guidance = float(rng.uniform(4.0, 7.0))
        seen: list = []

        def on_step(step, total, latents, seen=seen):
            seen.append((step / total, latents.spatial().detach().float().cpu().clone()))
            return False

        with override_settings(IMAGEGEN_PREVIEW_SOURCE="x0"):
            out = model.generate(rows, 64, 64, steps, guidance, on_step)
        assert out is not None
        base = len(finals)
        finals.extend(np.asarray(im.convert("RGB"), np.uint8) for im in out)
        for fraction, lat in seen:
            x0s.append(lat)
            owners.append(torch.arange(base, base + n))
            fractions.append(torch.full((n,), fraction))
        done = start + n
        log(f"collected {done}/{images} images ({steps} steps, guidance {guidance:.1f}), "
            f"{(time.time() - started) / done:.3f} s/image")
    return {
        "x0": torch.cat(x0s).half(), "owner": torch.cat(owners), "fraction": torch.cat(fractions),
        "final": torch.from_numpy(np.stack(finals)),
    }


def held_out_error(net, data: dict, fractions=(0.5, 1.0)) -> dict[str, float]:
    """Mean |preview - final| (0-255) of the samples at each fraction of the steps."""
    from gpu_tasks import preview_net

    out = {}
    for fraction in fractions:
        pick = (data["fraction"] - fraction).abs() < 1e-6
        if not pick.any():
            continue
        pictures = preview_net.decode(net, data["x0"][pick].float()).float()
        target = data["final"][data["owner"][pick]].float()
        out[f"{int(fraction * 100)}%"] = float((pictures - target).abs().mean())
    return out


def train(data: dict, held: dict, steps: int, batch: int, lr: float, width: int, depth: int, seed: int):
    import torch
    import torch.nn.functional as F

    from gpu_tasks.preview_net import PreviewNet

    torch.manual_seed(seed)
    net = PreviewNet(latent_channels=int(data["x0"].shape[1]), width=width, depth=depth)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 100) * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * s / steps))))
    x0 = data["x0"].float()
    target = data["final"].permute(0, 3, 1, 2).float() / 255.0
    generator = torch.Generator().manual_seed(seed)
    started = time.time()
    for step in range(steps):
        idx = torch.randint(len(x0), (batch,), generator=generator)
        pred = net(x0[idx])
        loss = F.l1_loss(pred, target[data["owner"][idx]])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 250 == 0 or step == steps - 1:
            log(f"step {step} L1 {loss.item() * 255:.2f}/255, held out {held_out_error(net, held)} "
                f"{(time.time() - started) / (step + 1):.3f} s/step")
    net.eval()
    return net


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "models" / "shapes-v1"))
    p.add_argument("--images", type=int, default=768, help="training passes' images")
    p.add_argument("--held-out", type=int, default=64)
    p.add_argument("--batch", type=int, default=32, help="images per collected pass")
    p.add_argument("--steps", type=int, default=3000, help="training steps")
    p.add_argument("--train-batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="", help="cache the collected passes here (torch file)")
    p.add_argument("--reuse", action="store_true", help="train on --data as collected before")
    p.add_argument("--out", default="", help="default: <model>/preview_decoder.safetensors")
    a = p.parse_args(argv)
    model = Path(a.model).resolve()
    _django(model)
    import torch

    from gpu_tasks import preview_net

    torch.set_num_threads(a.threads)
    t0 = time.time()
    if a.reuse and a.data and Path(a.data).exists():
        data, held = torch.load(a.data)
        log(f"reusing {a.data}: {len(data['final'])} training images, {len(held['final'])} held out")
    else:
        data = collect(model, a.images, a.batch, SEED_BASE, a.threads)
        held = collect(model, a.held_out, a.batch, SEED_BASE + 50_000, a.threads)
        if a.data:
            torch.save((data, held), a.data)
    collected = time.time() - t0
    net = train(data, held, a.steps, a.train_batch, a.lr, a.width, a.depth, a.seed)
    errors = held_out_error(net, held, (0.25, 0.5, 0.75, 1.0))
    log(f"held-out mean |preview - final| (0-255): {errors}")
    out = Path(a.out) if a.out else model / preview_net.FILENAME
    preview_net.save(net, out, {
        "trained_on": str(model.name), "images": len(data["final"]), "samples": len(data["x0"]),
        "seeds_from": SEED_BASE, "train_steps": a.steps, "held_out_images": len(held["final"]),
        "held_out_mean_abs_error": {k: round(v, 2) for k, v in errors.items()},
        "collect_seconds": round(collected), "train_seconds": round(time.time() - t0 - collected),
        "params": sum(p.numel() for p in net.parameters()),
    })
    log(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
