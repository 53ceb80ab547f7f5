"""Choose the demo classifier's thresholds on held-out generated images (the "calib" split).

    .venv/bin/python -m training.calibrate_classifier --data /tmp/imagegen-clfdata \\
        --model models/shapes-classifier-v3 --write-policy safety/policy.json

The demo policy has three thresholds for this classifier: star >= block -> block, star >= review
-> review, heart >= review -> review (hearts never block). On the calib split (every menu size;
seeds and out-of-vocabulary prompts disjoint from training and from the evaluation), a grid search
picks the set that maximises the worst margin over the four groups against the goals

    plain shapes allowed 98%, out-of-vocabulary allowed 95%, stars blocked 95%, hearts reviewed 95%

over all sizes pooled (ties: the larger sum of the four rates, then the higher thresholds). The chosen thresholds
and the calib figures go to <model>/calibration.json; --write-policy also writes them into the
policy file's image.classifiers[<version>] section (nothing else in the file changes).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image

from safety.shapes_classifier import ShapesClassifier
from training.classifier_data import SIZES_MENU
from training.gen_classifier_data import chunk_path

GOALS = {"plain": 0.98, "other": 0.95, "star": 0.95, "heart": 0.95}
GRID = np.round(np.concatenate([np.arange(0.01, 0.1, 0.01), np.arange(0.1, 0.97, 0.02)]), 2)


def load_scores(clf: ShapesClassifier, root: Path, split: str) -> dict[str, dict[str, np.ndarray]]:
    """size -> {"star": scores, "heart": scores, "group": groups} for the single-shape and "other" items."""
    out = {}
    for w, h in SIZES_MENU:
        images, groups = [], []
        c = 0
        while chunk_path(root, split, w, h, c).exists():
            part = np.load(chunk_path(root, split, w, h, c))
            images += [Image.fromarray(im) for im in part["images"]]
            groups += [str(g) for g in part["groups"]]
            c += 1
        keep = [i for i, g in enumerate(groups) if g in GOALS]
        scores = clf.scores([images[i] for i in keep]) if keep else []
        out[f"{w}x{h}"] = {
            "star": np.array([s["star"] for s in scores]),
            "heart": np.array([s["heart"] for s in scores]),
            "group": np.array([groups[i] for i in keep]),
        }
    return out


def rates(d: dict[str, np.ndarray], star_block: float, star_review: float, heart_review) -> dict[str, np.ndarray]:
    """Per group, the share judged as the goal wants, for each heart_review in the array."""
    s, h = d["star"][:, None], d["heart"][:, None]
    hr = np.asarray(heart_review, dtype=float)[None, :]
    blocked = s >= star_block
    reviewed = ~blocked & ((s >= star_review) | (h >= hr))
    allowed = ~blocked & ~reviewed
    want = {"plain": allowed, "other": allowed, "star": np.broadcast_to(blocked, allowed.shape), "heart": reviewed}
    return {g: want[g][d["group"] == g].mean(0) if (d["group"] == g).any() else np.ones(hr.shape[1]) for g in GOALS}


def search(data: dict) -> tuple[dict, dict]:
    # All sizes pooled: per size, a calib group has only 16-60 images, and a maximin over 16 such
    # cells chases the noise of the smallest one. The evaluation still reports every size.
    pooled = {k: np.concatenate([d[k] for d in data.values()]) for k in ("star", "heart", "group")}
    best, best_key = None, None
    alt, alt_key = None, None  # benign first: plain and other at their goals, then the most stars/hearts
    for sb in GRID:
        for sr in GRID[GRID <= sb]:
            per = rates(pooled, sb, sr, GRID)
            margin = np.min([per[g] - GOALS[g] for g in GOALS], axis=0)
            total = np.sum([per[g] for g in GOALS], axis=0)
            for k, hr in enumerate(GRID):
                key = (round(float(margin[k]), 6), round(float(total[k]), 6), float(sb), float(sr), float(hr))
                if best_key is None or key > best_key:
                    best_key = key
                    best = {"star_block": float(sb), "star_review": float(sr), "heart_review": float(hr)}
                if per["plain"][k] >= GOALS["plain"] and per["other"][k] >= GOALS["other"]:
                    akey = (round(float(min(per["star"][k] - GOALS["star"], per["heart"][k] - GOALS["heart"])), 6),
                            round(float(total[k]), 6), float(sb), float(sr), float(hr))
                    if alt_key is None or akey > alt_key:
                        alt_key = akey
                        alt = {"star_block": float(sb), "star_review": float(sr), "heart_review": float(hr)}
    figures = {"all sizes": {g: float(v[0]) for g, v in rates(pooled, best["star_block"], best["star_review"],
                                                               [best["heart_review"]]).items()}}
    figures |= {size: {g: float(v[0]) for g, v in rates(d, best["star_block"], best["star_review"],
                                                           [best["heart_review"]]).items()}
               for size, d in data.items()}
    if alt is not None:
        figures["benign_first_alternative"] = {"thresholds": alt, "all sizes": {
            g: float(v[0]) for g, v in rates(pooled, alt["star_block"], alt["star_review"], [alt["heart_review"]]).items()}}
    return best, figures


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--model", default="models/shapes-classifier-v3")
    p.add_argument("--split", default="calib")
    p.add_argument("--write-policy", default=None)
    a = p.parse_args(argv)
    clf = ShapesClassifier.from_pretrained(a.model)
    data = load_scores(clf, Path(a.data), a.split)
    best, figures = search(data)
    counts = {size: {g: int((d["group"] == g).sum()) for g in GOALS} for size, d in data.items()}
    result = {"version": clf.version, "split": a.split, "goals": GOALS, "thresholds": best,
              "calib_rates": figures, "calib_counts": counts,
              "command": "python -m training.calibrate_classifier " + " ".join(argv or __import__("sys").argv[1:])}
    (Path(a.model) / "calibration.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    if a.write_policy:
        path = Path(a.write_policy)
        policy = json.loads(path.read_text())
        policy["image"].setdefault("classifiers", {})[clf.version] = {"labels": {
            "star": {"category": "demo_forbidden", "review": best["star_review"], "block": best["star_block"]},
            "heart": {"category": "demo_borderline", "review": best["heart_review"], "block": 1.01},
        }}
        path.write_text(json.dumps(policy, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote image.classifiers[{clf.version!r}] into {path}")


if __name__ == "__main__":
    main()
