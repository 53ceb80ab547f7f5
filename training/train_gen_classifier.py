"""Train the demo image classifier (shapes-classifier-v2) on the shipped generator's own outputs.

    nice -n 15 env OMP_NUM_THREADS=1 .venv/bin/python -m training.train_gen_classifier \\
        --data /tmp/imagegen-clfdata --out models/shapes-classifier-v2 --max-minutes 30

Data: the "train" split of training/gen_classifier_data.py (every menu size), each image labelled
by the prompt that made it: the shape kinds it names, or "other" for the out-of-vocabulary
prompts; plus a share of clean synthetic shapes (training/shapes_data.py) so that a well-drawn
shape is recognised even where the generator's are soft. Multi-label (one sigmoid per label,
two-shape prompts set two). Images go through the classifier's own preprocessing (pad to a
square with the border colour, resize to 64x64), then flips, blur, colour jitter and noise.

Thresholds are not chosen here: training/calibrate_classifier.py picks them on the "calib" split.
Checkpoints every 200 steps to <out>/train_state.pt; --resume continues.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from safety.shapes_classifier import ShapesClassifier, ShapesNet, preprocess, to_input
from training.classifier_data import LABELS, SIZES_MENU
from training.gen_classifier_data import CHUNK, chunk_path, parse_counts
from training.train_classifier import TRAIN_SEED, augment, make_set

VERSION = "shapes-classifier-v2"


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def multi_hot(label_field: str) -> np.ndarray:
    y = np.zeros(len(LABELS), np.float32)
    for lab in label_field.split("|"):
        y[LABELS.index(lab)] = 1.0
    return y


def load_generated(root: Path, split: str, native: bool, limit: dict[tuple[int, int], int] | None = None
                   ) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """The chunks of a split on disk (at most limit[(w, h)] items per size), per (height, width) as
    the network will see them: (uint8 N,H,W,3, multi-hot N,L). native=False pads and resizes
    everything to 64x64 (v1 style)."""
    pools: dict[tuple[int, int], tuple[list, list]] = {}
    for width, height in SIZES_MENU:
        c = 0
        cap = (limit or {}).get((width, height), 10**9)
        while c * CHUNK < cap and chunk_path(root, split, width, height, c).exists():
            part = np.load(chunk_path(root, split, width, height, c))
            for im, lab in zip(part["images"], part["labels"], strict=True):
                arr = im if native else preprocess(Image.fromarray(im))
                xs, ys = pools.setdefault(arr.shape[:2], ([], []))
                xs.append(arr)
                ys.append(multi_hot(str(lab)))
            c += 1
    if not pools:
        raise SystemExit(f"no {split} chunks under {root}: run training.gen_classifier_data first")
    return {k: (np.stack(xs), np.stack(ys)) for k, (xs, ys) in pools.items()}


def synthetic(n: int) -> tuple[np.ndarray, np.ndarray]:
    imgs, ys5, _ = make_set(TRAIN_SEED + 1, n, p_empty=0.0)
    ys = np.zeros((n, len(LABELS)), np.float32)
    ys[:, : ys5.shape[1]] = ys5  # the five kinds come first in LABELS; "other" stays 0
    return imgs, ys


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--synthetic", type=int, default=1500, help="clean synthetic shape images added")
    p.add_argument("--synthetic-share", type=float, default=0.2, help="share of each batch drawn from them")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-minutes", type=float, default=60.0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--native", action="store_true", help="train at each menu size's own resolution (v2)")
    p.add_argument("--counts", default=None, help="WxH:N,... use at most N train items per size (default: all on disk)")
    p.add_argument("--init", default=None, help="start from this model's weights (a fine-tuning stage)")
    p.add_argument("--version", default=VERSION, help="the trained classifier's version (its policy section's key)")
    p.add_argument("--generator", default="models/shapes-v1", help="the model whose outputs --data holds (recorded)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    started = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "train_state.pt"

    limit = {(w, h): n for w, h, n in parse_counts(a.counts)} if a.counts else None
    pools = load_generated(Path(a.data), "train", a.native, limit)
    sx, sy = synthetic(a.synthetic) if a.synthetic else (None, None)
    sizes = sorted(pools)
    counts = np.array([len(pools[k][0]) for k in sizes], float)
    log(f"generated train images per (h, w): {dict(zip(sizes, counts.astype(int).tolist(), strict=True))}, "
        f"synthetic {0 if sx is None else len(sx)}; loaded in {time.time() - started:.0f}s")

    model = ShapesNet(len(LABELS), width=a.width)
    if a.init:
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(Path(a.init) / "model.safetensors")))
        log(f"initialised from {a.init}")
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * min(s, a.steps) / a.steps)))
    step = 0
    rng = np.random.default_rng(a.seed)
    g = torch.Generator().manual_seed(a.seed)
    if a.resume and state_path.exists():
        state = torch.load(state_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        step = state["step"]
        rng = np.random.default_rng([a.seed, step])
        g = torch.Generator().manual_seed(a.seed + step)
        log(f"resumed at step {step}")
    log(f"classifier params: {sum(q.numel() for q in model.parameters()):,}")
    t1, first = time.time(), step
    while step < a.steps:
        if time.time() - started > a.max_minutes * 60:
            log(f"stopping at step {step} (--max-minutes); rerun with --resume")
            break
        model.train()
        # One size per batch (the network takes any size, a batch needs one); sizes in proportion
        # to their images; synthetic 64x64 shapes join the 64x64 batches.
        hw = sizes[rng.choice(len(sizes), p=counts / counts.sum())]
        px, py = pools[hw]
        n_syn = int(round(a.batch * a.synthetic_share)) if sx is not None and hw == (64, 64) else 0
        gi = rng.integers(len(px), size=a.batch - n_syn)
        if n_syn:
            si = rng.integers(len(sx), size=n_syn)
            xb, yb = np.concatenate([px[gi], sx[si]]), np.concatenate([py[gi], sy[si]])
        else:
            xb, yb = px[gi], py[gi]
        x = augment(to_input(xb), g)
        y = torch.from_numpy(yb)
        loss = F.binary_cross_entropy_with_logits(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        if step % 100 == 0 or step == a.steps:
            log(f"step {step} loss {loss.item():.4f} {(time.time() - t1) / (step - first):.3f}s/step")
        if step % 200 == 0 or step == a.steps:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                        "step": step}, state_path)

    model.eval()
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    cfg = {"labels": LABELS, "version": a.version, "input_size": None if a.native else 64, "width": a.width,
           "multi_label": True, "activation": "sigmoid",
           "preprocess": ("RGB at the image's own size (up to 256 px a side), x/127.5-1" if a.native else
                          "RGB, pad to square with the border colour, bilinear resize to 64x64, x/127.5-1"),
           "trained_on": f"{a.generator} outputs (20 steps, guidance 6, every menu size) labelled by prompt; "
                         "'other' = out-of-vocabulary prompts; plus clean synthetic shapes",
           "demo_policy": f"thresholds in safety/policy.json image.classifiers['{a.version}']"}
    (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    info = {"train_steps": step, "init": a.init, "train_images_generated": int(counts.sum()),
            "train_images_synthetic": 0 if sx is None else int(len(sx)), "native": a.native,
            "train_wall_s": round(time.time() - started, 1), "width": a.width, "batch": a.batch, "lr": a.lr,
            "params": sum(q.numel() for q in model.parameters()),
            "command": "python -m training.train_gen_classifier " + " ".join(argv or __import__("sys").argv[1:])}
    (out / "training_info.json").write_text(json.dumps(info, indent=1) + "\n")
    clf = ShapesClassifier.from_pretrained(out)  # loads through the public API
    log("saved", clf.version, clf.labels, info)


if __name__ == "__main__":
    main()
