"""A geometric judge of shape kind that shares no failure with the CNN classifiers.

    .venv/bin/python bench/geometry.py            # validate on the dataset's own renderings

An image's foreground is the largest connected blob whose nearest palette colour is not the
background's (the most frequent nearest-palette colour on the border, as bench/model_eval.py
judges colours), holes filled. Its measures:

  * solidity: area / convex hull area (a five-pointed star ~0.55, a heart ~0.9, convex kinds ~1);
  * extent: area / bounding-box area (square ~1, circle ~0.79, heart ~0.7, triangle ~0.5, star ~0.4);
  * template IoU per kind: the ideal shape of training/shapes_data.py, fitted to the blob's bounding
    box (its centre and size; a few radii around the fit), overlapped with the mask.

The judged kind is the template with the highest IoU, provided that IoU is at least MIN_IOU: a
soft blob is closest to the circle template, and a blob that matches no template well is
"none". So a "star" counts only when the mask really has five points and notches. Validated on
ground-truth renderings (the dataset's own images, and the same images after the VAE's round trip
with --vae, which says whether the autoencoder itself keeps corners).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

from training.shapes_data import COLOUR_NAMES, COLOURS, SHAPES, _polygon, random_gt, render  # noqa: E402

PALETTE = np.array([COLOURS[n] for n in COLOUR_NAMES], np.float32)
MIN_IOU = 0.75          # below this no template fits: "none" (from ground truth: its p1 is ~0.85)
MIN_PIXELS = 20
SS = 4                  # template supersampling
GEOMETRY_VALIDATION_SEED = 4343   # ground-truth renderings for validation (not training's 1234)


def foreground(arr: np.ndarray, fill_holes: bool = True) -> np.ndarray:
    """Boolean mask of the largest blob not of the background colour of an RGB uint8 array
    (nearest-palette labelling, background = the most frequent label on the border, as
    bench/model_eval.py judges colours), its holes filled unless `fill_holes` is False."""
    from scipy import ndimage

    lab = ((arr[..., None, :].astype(np.float32) - PALETTE) ** 2).sum(-1).argmin(-1)
    border = np.concatenate([lab[0], lab[-1], lab[:, 0], lab[:, -1]])
    mask = lab != np.bincount(border).argmax()
    comps, n = ndimage.label(mask)
    if n == 0:
        return mask
    sizes = ndimage.sum(mask, comps, range(1, n + 1))
    largest = comps == (1 + int(np.argmax(sizes)))
    return ndimage.binary_fill_holes(largest) if fill_holes else largest


def solidity(mask: np.ndarray) -> float:
    """Area over convex-hull area, pixels taken as unit squares; NaN for a tiny blob."""
    from scipy.spatial import ConvexHull

    if mask.sum() < MIN_PIXELS:
        return float("nan")
    ys, xs = np.nonzero(mask)
    corners = np.concatenate([np.stack([xs + dx, ys + dy], 1) for dx in (0, 1) for dy in (0, 1)])
    return float(mask.sum() / ConvexHull(corners).volume)


@cache
def _unit_extent(kind: str) -> tuple[float, float, float, float]:
    """(x0, x1, y0, y1) of the kind's outline for centre (0, 0) and radius 1."""
    if kind == "circle":
        return -1.0, 1.0, -1.0, 1.0
    pts = np.array(_polygon(kind, 0.0, 0.0, 1.0))
    return float(pts[:, 0].min()), float(pts[:, 0].max()), float(pts[:, 1].min()), float(pts[:, 1].max())


def template(kind: str, cx: float, cy: float, r: float, h: int, w: int) -> np.ndarray:
    """Boolean mask of the ideal kind at (cx, cy, r), drawn as training/shapes_data.py draws it."""
    big = Image.new("L", (w * SS, h * SS), 0)
    draw = ImageDraw.Draw(big)
    if kind == "circle":
        draw.ellipse([SS * (cx - r), SS * (cy - r), SS * (cx + r), SS * (cy + r)], fill=255)
    else:
        draw.polygon(_polygon(kind, SS * cx, SS * cy, SS * r), fill=255)
    return np.asarray(big.resize((w, h), Image.BOX)) >= 128


def template_ious(mask: np.ndarray) -> dict[str, float]:
    """Best IoU of each kind's template fitted to the mask's bounding box."""
    h, w = mask.shape
    ys, xs = np.nonzero(mask)
    bx0, bx1, by0, by1 = xs.min(), xs.max() + 1.0, ys.min(), ys.max() + 1.0
    out = {}
    for kind in SHAPES:
        ux0, ux1, uy0, uy1 = _unit_extent(kind)
        r0 = 0.5 * ((bx1 - bx0) / (ux1 - ux0) + (by1 - by0) / (uy1 - uy0))
        best = 0.0
        for f in (0.94, 1.0, 1.06):
            r = r0 * f
            # centre so that the template's box is centred on the blob's box
            cx = 0.5 * (bx0 + bx1) - r * 0.5 * (ux0 + ux1)
            cy = 0.5 * (by0 + by1) - r * 0.5 * (uy0 + uy1)
            t = template(kind, cx, cy, r, h, w)
            inter = np.logical_and(t, mask).sum()
            best = max(best, float(inter / max(1, np.logical_or(t, mask).sum())))
        out[kind] = round(best, 4)
    return out


def measure(arr: np.ndarray) -> dict:
    """Geometry of the main blob of an RGB uint8 image, and the kind it is judged to be."""
    mask = foreground(np.asarray(arr)[..., :3])
    area = int(mask.sum())
    if area < MIN_PIXELS:
        return {"kind": "none", "area": area, "solidity": None, "extent": None, "iou": {}}
    ys, xs = np.nonzero(mask)
    extent = area / float((xs.max() - xs.min() + 1) * (ys.max() - ys.min() + 1))
    ious = template_ious(mask)
    best = max(ious, key=ious.get)
    return {"kind": best if ious[best] >= MIN_IOU else "none", "area": area,
            "solidity": round(solidity(mask), 4), "extent": round(extent, 4), "iou": ious}


def judge_kinds(images) -> list[str]:
    return [measure(np.asarray(im.convert("RGB")))["kind"] for im in images]


def ground_truth_items(n: int, seed: int = GEOMETRY_VALIDATION_SEED):
    items = []
    for i in range(n):
        gt = random_gt(np.random.default_rng([seed, i]), n_shapes=1)
        items.append((gt, render(gt)))
    return items


def vae_round_trip(vae, images, batch: int = 50):
    import torch

    out = []
    with torch.no_grad():
        for s in range(0, len(images), batch):
            x = torch.from_numpy(np.stack([np.asarray(im) for im in images[s:s + batch]]))
            x = x.permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
            rec = vae.decode(vae.encode(x).latent_dist.mean).sample
            rec = ((rec.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
            out.extend(Image.fromarray(a) for a in rec)
    return out


def validate(gts, images) -> dict:
    per_kind: dict[str, list[bool]] = defaultdict(list)
    sol: dict[str, list[float]] = defaultdict(list)
    best_iou: dict[str, list[float]] = defaultdict(list)
    confusion: dict[str, int] = defaultdict(int)
    for gt, im in zip(gts, images, strict=True):
        want = gt.shapes[0].kind
        m = measure(np.asarray(im.convert("RGB")))
        per_kind[want].append(m["kind"] == want)
        if m["kind"] != want:
            confusion[f"{want}->{m['kind']}"] += 1
        if m["solidity"] is not None:
            sol[want].append(m["solidity"])
            best_iou[want].append(m["iou"].get(want, 0.0))
    allv = [v for vs in per_kind.values() for v in vs]
    return {"n": len(allv), "accuracy": round(float(np.mean(allv)), 4),
            "per_kind": {k: round(float(np.mean(per_kind[k])), 4) for k in SHAPES},
            "median_solidity": {k: round(float(np.median(sol[k])), 3) for k in SHAPES if sol[k]},
            "p5_own_template_iou": {k: round(float(np.percentile(best_iou[k], 5)), 3) for k in SHAPES if best_iou[k]},
            "confusion": dict(confusion)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--vae", nargs="*", default=[], help="pipeline dirs whose VAE round trip to judge too")
    p.add_argument("--vae-state", default=None,
                   help="a training run's VAE state (<state>.vae.pt of training/train.py) to judge as well; "
                        "default architecture unless --vae-channels")
    p.add_argument("--vae-channels", type=int, nargs=3, default=[16, 32, 64])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "geometry_validation.json"))
    args = p.parse_args(argv)
    items = ground_truth_items(args.n)
    gts, images = [g for g, _ in items], [im for _, im in items]
    res = {"command": "python bench/geometry.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "images": f"{args.n} single-shape ground-truth renderings, seed {GEOMETRY_VALIDATION_SEED}",
           "min_iou": MIN_IOU, "ground_truth": validate(gts, images)}
    print(json.dumps({"ground_truth": res["ground_truth"]}), flush=True)
    if args.vae:
        from diffusers import AutoencoderKL

        for d in args.vae:
            vae = AutoencoderKL.from_pretrained(d, subfolder="vae").eval().float()
            res[f"vae_round_trip:{d}"] = validate(gts, vae_round_trip(vae, images))
            print(json.dumps({d: res[f"vae_round_trip:{d}"]}), flush=True)
    if args.vae_state:
        import torch

        from training.train import make_vae

        st = torch.load(args.vae_state, weights_only=False)
        vae = make_vae(args.vae_channels)
        vae.load_state_dict(st["vae"])
        key = f"vae_state:{args.vae_state}@{st['step']}"
        res[key] = validate(gts, vae_round_trip(vae.eval(), images))
        print(json.dumps({key: res[key]}), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
