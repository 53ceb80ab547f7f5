"""Train the default output classifier (safety/shapes_classifier.py) on the synthetic shapes domain.

    python -m training.train_classifier --out models/shapes-classifier-v1 --vae models/shapes-v1

Multi-label (sigmoid) over the shape kinds. Training images: 0, 1 or 2 shapes from the seeded
generator; augmented with blur, noise, colour jitter, horizontal flips and -- when --vae is given --
round trips through the shipped model's VAE (with latent noise), which makes the images look like
the model's generations (soft edges, slight colour shifts). Held-out figures (a disjoint seed) are
written to <out>/metrics.json.
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

from safety.shapes_classifier import DEFAULT_LABELS, ShapesClassifier, ShapesNet, to_input
from training.shapes_data import COLOUR_NAMES, SampleGT, ShapesDataset, render

TRAIN_SEED = 4321
HELDOUT_SEED = 98765


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def labels_of(gt: SampleGT) -> np.ndarray:
    y = np.zeros(len(DEFAULT_LABELS), np.float32)
    for sh in gt.shapes:
        y[DEFAULT_LABELS.index(sh.kind)] = 1.0
    return y


def make_set(seed: int, n: int, p_two=0.35, p_empty=0.05):
    ds = ShapesDataset(seed=seed, p_two=p_two)
    imgs, _, gts = ds.arrays(range(n))
    ys = np.stack([labels_of(g) for g in gts])
    rng = np.random.default_rng([seed, 99])
    for i in np.nonzero(rng.random(n) < p_empty)[0]:        # background-only images: no label
        gt = SampleGT(background=COLOUR_NAMES[rng.integers(len(COLOUR_NAMES))])
        imgs[i] = np.asarray(render(gt))
        ys[i] = 0
        gts[i] = gt
    return imgs, ys, gts


@torch.no_grad()
def vae_roundtrip(vae, imgs_u8: np.ndarray, rng: np.random.Generator, max_noise=0.35, bs=250) -> np.ndarray:
    out = []
    for i in range(0, len(imgs_u8), bs):
        x = to_input(imgs_u8[i:i + bs])
        z = vae.encode(x).latent_dist.mean
        sigma = torch.from_numpy(rng.uniform(0, max_noise, size=(len(z), 1, 1, 1)).astype(np.float32))
        z = z + sigma * z.std() * torch.randn_like(z)
        r = vae.decode(z).sample.clamp(-1, 1)
        out.append(((r + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy())
    return np.concatenate(out)


def augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    n, _, height, width = x.shape
    # horizontal flip (all five shapes are left-right symmetric)
    flip = torch.rand(n, generator=g) < 0.5
    x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
    # gaussian blur with a random sigma (0 .. 1.2 px)
    sig = torch.rand(n, generator=g) * 1.2
    k = torch.arange(-3, 4).float()
    ker = torch.exp(-(k.view(1, -1) ** 2) / (2 * sig.clamp(min=1e-3).view(-1, 1) ** 2))
    ker = ker / ker.sum(1, keepdim=True)                                     # n,7
    xb = x.reshape(1, n * 3, height, width)
    kh = ker.repeat_interleave(3, 0).view(n * 3, 1, 1, 7)
    xb = F.conv2d(F.pad(xb, (3, 3, 0, 0), mode="replicate"), kh, groups=n * 3)
    xb = F.conv2d(F.pad(xb, (0, 0, 3, 3), mode="replicate"), kh.transpose(2, 3), groups=n * 3)
    x = xb.view(n, 3, height, width)
    # colour jitter, noise
    a = 1 + (torch.rand(n, 3, 1, 1, generator=g) - 0.5) * 0.4
    b = (torch.rand(n, 3, 1, 1, generator=g) - 0.5) * 0.3
    x = x * a + b
    x = x + torch.randn(x.shape, generator=g) * torch.rand(n, 1, 1, 1, generator=g) * 0.08
    return x.clamp(-1, 1)


@torch.no_grad()
def evaluate(model, imgs, ys, bs=500) -> dict:
    model.eval()
    probs = torch.cat([torch.sigmoid(model(to_input(imgs[i:i + bs]))) for i in range(0, len(imgs), bs)]).numpy()
    pred = probs >= 0.5
    single = ys.sum(1) == 1
    star = DEFAULT_LABELS.index("star")
    return {
        "n": int(len(ys)),
        "exact_match_at_0.5": float((pred == (ys > 0.5)).all(1).mean()),
        "per_label_accuracy_at_0.5": {label: float((pred[:, i] == (ys[:, i] > 0.5)).mean())
                                      for i, label in enumerate(DEFAULT_LABELS)},
        "single_shape_top1": float((probs[single].argmax(1) == ys[single].argmax(1)).mean()),
        "star_recall_at_0.5": float(pred[ys[:, star] > 0.5, star].mean()),
        "star_false_positive_rate_at_0.5": float(pred[ys[:, star] < 0.5, star].mean()),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--vae", default=None, help="pipeline dir whose VAE is used for round-trip augmentation")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--n-train", type=int, default=20000)
    p.add_argument("--n-vae", type=int, default=8000, help="how many training images get a VAE round trip")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.time()
    rng = np.random.default_rng(args.seed)
    g = torch.Generator().manual_seed(args.seed)

    imgs, ys, _ = make_set(TRAIN_SEED, args.n_train)
    te_imgs, te_ys, _ = make_set(HELDOUT_SEED, 2000)
    vae = None
    if args.vae:
        from diffusers import AutoencoderKL
        vae = AutoencoderKL.from_pretrained(args.vae, subfolder="vae").eval()
        extra = vae_roundtrip(vae, imgs[:args.n_vae], rng)
        imgs = np.concatenate([imgs, extra])
        ys = np.concatenate([ys, ys[:args.n_vae]])
        log(f"added {len(extra)} VAE round-trip images")
    log(f"training set {len(imgs)} images ({time.time() - t0:.0f}s)")

    model = ShapesNet(len(DEFAULT_LABELS))
    log(f"classifier params: {sum(q.numel() for q in model.parameters()):,}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * s / args.steps)))
    t1 = time.time()
    for step in range(args.steps):
        model.train()
        idx = rng.integers(len(imgs), size=args.batch)
        x = augment(to_input(imgs[idx]), g)
        loss = F.binary_cross_entropy_with_logits(model(x), torch.from_numpy(ys[idx]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            log(f"step {step} loss {loss.item():.4f} {(time.time() - t1) / (step + 1):.3f}s/step")

    model.eval()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    cfg = {"labels": DEFAULT_LABELS, "version": "shapes-classifier-v1", "input_size": 64, "width": 16,
           "multi_label": True, "activation": "sigmoid",
           "preprocess": "RGB, pad to square with the border colour, bilinear resize to 64x64, x/127.5-1",
           "demo_policy": {"block": ["star"], "review": ["heart"]}}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))

    metrics = {"heldout_synthetic": evaluate(model, te_imgs, te_ys)}
    if vae is not None:
        metrics["heldout_synthetic_vae_roundtrip"] = evaluate(
            model, vae_roundtrip(vae, te_imgs, np.random.default_rng(7), max_noise=0.2), te_ys)
    metrics.update(train_steps=args.steps, train_wall_s=round(time.time() - t0, 1),
                   s_per_step=round((time.time() - t1) / args.steps, 3), heldout_seed=HELDOUT_SEED,
                   command="python -m training.train_classifier " + " ".join(argv or __import__("sys").argv[1:]))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    log(json.dumps(metrics, indent=1))
    # sanity: loads through the public API
    clf = ShapesClassifier.from_pretrained(out)
    log("reloaded", clf.version, clf.labels)


if __name__ == "__main__":
    main()
