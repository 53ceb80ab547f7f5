"""Evaluate the shipped text-to-image model on held-out single-shape captions.

    python bench/model_eval.py --model models/shapes-v1

200 single-shape captions from the procedural generator with a seed disjoint from training
(EVAL_SEED; training used seed 1234), generated at the default 20 steps, guidance 6.0, 64x64.
Judging by pixel statistics, with the named palette of training/shapes_data.py:
  * background colour = the most frequent nearest-palette colour of the border pixels;
  * shape colour = the most frequent nearest-palette colour among the non-background pixels
    (at least MIN_SHAPE_PIXELS of them, else "none");
  * shape kind = argmax of the shipped shapes classifier (models/shapes-classifier-v1), which is
    trained only on the generator's own ground truth (plus VAE round trips), not on generations;
    and, independently, by the geometric judge of bench/geometry.py (the foreground mask's fit to
    each kind's ideal outline, and its solidity: a blob is no star).
Bars (issue 8): shape colour AND background colour correct in >= 85% of images; kind >= 70%.
Writes bench/results/model_eval.json and bench/results/contact_sheet.png (first 16 samples).

Teacher against distilled student (issue 22), one run, one table, the same captions and seeds:

    python bench/model_eval.py --compare --threads 2

generates the teacher (models/shapes-v1) at 20/10/4 steps and the student (models/shapes-v1-lcm)
at 1/2/4/8 steps, judges colours as above and kinds with both shipped classifiers (v1, the bar's,
and v2, the served gate's), times each setting (seconds per image, batches of --batch, --threads),
and writes bench/results/model_eval_student.json. Goal: the student at 4 steps within 5 points of
the teacher at 20 on every accuracy figure. Kinds are judged by the geometric check too
(bench/geometry.py), and a per-kind table follows (v1 / v2 / geometry). Any models instead:

    python bench/model_eval.py --compare --row shapes-v1=models/shapes-v1:20 \
        --row shapes-v1-lcm=models/shapes-v1-lcm:1,4 --results model_eval_geometry.json

Issue 34's goal, per row (kinds_goal_met): every kind >= 90% by shapes-classifier-v1 and by the
geometric judge, shape and background colour >= 98%.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import geometry  # noqa: E402  (bench/geometry.py)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image, ImageDraw, ImageFont  # noqa: E402

from training.shapes_data import COLOUR_NAMES, COLOURS, SHAPES, caption_for, random_gt  # noqa: E402

EVAL_SEED = 20261130
MIN_SHAPE_PIXELS = 12
PALETTE = np.array([COLOURS[n] for n in COLOUR_NAMES], np.float32)


def eval_captions(n: int, seed: int = EVAL_SEED):
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        gt = random_gt(rng, n_shapes=1)
        out.append((caption_for(gt, bool(rng.random() >= 0.3)), gt))
    return out


def nearest_palette(img: np.ndarray) -> np.ndarray:
    d = ((img[..., None, :].astype(np.float32) - PALETTE) ** 2).sum(-1)
    return d.argmin(-1)


def judge_colours(img: np.ndarray) -> tuple[str, str]:
    lab = nearest_palette(img)
    border = np.concatenate([lab[0], lab[-1], lab[:, 0], lab[:, -1]])
    bg = Counter(border.tolist()).most_common(1)[0][0]
    rest = lab[lab != bg]
    if len(rest) < MIN_SHAPE_PIXELS:
        return "none", COLOUR_NAMES[bg]
    fg = Counter(rest.tolist()).most_common(1)[0][0]
    return COLOUR_NAMES[fg], COLOUR_NAMES[bg]


def contact_sheet(images, captions, judged, path: Path, scale=3, cols=4):
    font = ImageFont.load_default()
    tile_w = 64 * scale
    text_h = 52
    rows = (len(images) + cols - 1) // cols
    sheet = Image.new("RGB", (cols * (tile_w + 8) + 8, rows * (tile_w + text_h + 8) + 8), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for k, (im, cap, jd) in enumerate(zip(images, captions, judged, strict=True)):
        x = 8 + (k % cols) * (tile_w + 8)
        y = 8 + (k // cols) * (tile_w + text_h + 8)
        sheet.paste(im.resize((tile_w, tile_w), Image.NEAREST), (x, y))
        words, lines, cur = cap.split(), [], ""
        for w in words:
            if len(cur) + len(w) + 1 > 31:
                lines.append(cur)
                cur = w
            else:
                cur = (cur + " " + w).strip()
        lines.append(cur)
        for j, line in enumerate(lines[:3]):
            draw.text((x, y + tile_w + 2 + 12 * j), line, fill=(0, 0, 0), font=font)
        draw.text((x, y + tile_w + 2 + 12 * 3), jd, fill=(0, 110, 0) if jd.startswith("ok") else (190, 0, 0),
                  font=font)
    sheet.save(path)


def generate(pipe, items, steps: int, guidance: float, batch: int) -> tuple[list[Image.Image], float]:
    """Images for ``items`` (caption, gt) with per-caption seeds EVAL_SEED + index; wall seconds."""
    images: list[Image.Image] = []
    t0 = time.time()
    for s in range(0, len(items), batch):
        chunk = items[s:s + batch]
        gens = [torch.Generator().manual_seed(EVAL_SEED + s + i) for i in range(len(chunk))]
        out = pipe(prompt=[c for c, _ in chunk], num_inference_steps=steps, guidance_scale=guidance,
                   height=64, width=64, generator=gens)
        images.extend(out.images)
    return images, time.time() - t0


def figures(items, images, classifiers: dict) -> dict:
    """Colour, background and kind accuracy of ``images`` against ``items``: kinds by each
    classifier and by the geometric judge (bench/geometry.py), overall and per kind."""
    judged = [judge_colours(np.asarray(im.convert("RGB"))) for im in images]
    res = {
        "shape_colour_accuracy": float(np.mean([fg == gt.shapes[0].colour for (_, gt), (fg, _) in
                                                zip(items, judged, strict=True)])),
        "background_colour_accuracy": float(np.mean([bg == gt.background for (_, gt), (_, bg) in
                                                     zip(items, judged, strict=True)])),
    }
    kinds_by = {name: [max(sc, key=sc.get) for sc in clf.scores(images)] for name, clf in classifiers.items()}
    kinds_by["geometry"] = geometry.judge_kinds(images)
    want = [gt.shapes[0].kind for _, gt in items]
    per_kind = {}
    for name, kinds in kinds_by.items():
        ok = np.array([k == w for k, w in zip(kinds, want, strict=True)])
        res[f"shape_kind_accuracy_{name}"] = float(ok.mean())
        per_kind[name] = {k: round(float(ok[[w == k for w in want]].mean()), 4) for k in SHAPES if k in want}
    out: dict = {k: round(v, 4) for k, v in res.items()}
    out["per_kind"] = per_kind
    return out


def row_specs(args) -> list[tuple[str, str, list[int]]]:
    """(name, path, steps) per model: --row NAME=PATH:S1,S2 ... or the teacher and student."""
    if not args.row:
        return [("teacher", args.model, args.teacher_steps), ("student", args.student, args.student_steps)]
    specs = []
    for spec in args.row:
        name, rest = spec.split("=", 1)
        path, steps = rest.rsplit(":", 1)
        specs.append((name, path, [int(x) for x in steps.split(",")]))
    return specs


def compare(args, argv) -> dict:
    from diffusers import AutoPipelineForText2Image

    from safety.shapes_classifier import ShapesClassifier

    classifiers = {"v1": ShapesClassifier.from_pretrained(ROOT / "models" / "shapes-classifier-v1"),
                   "v2": ShapesClassifier.from_pretrained(ROOT / "models" / "shapes-classifier-v2")}
    items = eval_captions(args.n)
    rows = []
    for role, path, steps_list in row_specs(args):
        pipe = AutoPipelineForText2Image.from_pretrained(path, local_files_only=True)
        pipe.set_progress_bar_config(disable=True)
        generate(pipe, items[:2], 2, args.guidance, args.batch)          # warm-up, not timed
        for steps in steps_list:
            images, wall = generate(pipe, items, steps, args.guidance, args.batch)
            row = {"model": role, "path": path, "scheduler": type(pipe.scheduler).__name__, "steps": steps,
                   **figures(items, images, classifiers), "s_per_image": round(wall / len(items), 4)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    for r in rows:   # issue 34: every kind >= 90% by both independent judges, colours >= 98%
        r["kinds_goal_met"] = bool(min(r["per_kind"]["v1"].values()) >= 0.9 and min(r["per_kind"]["geometry"].values()) >= 0.9
                                   and r["shape_colour_accuracy"] >= 0.98 and r["background_colour_accuracy"] >= 0.98)
    ref = next((r for r in rows if r["model"] == "teacher" and r["steps"] == 20), None)
    s4 = next((r for r in rows if r["model"] == "student" and r["steps"] == 4), None)
    goal = None
    if ref is not None and s4 is not None:
        keys = [k for k in s4 if k.endswith("_accuracy") or "_accuracy_" in k]
        gaps = {k: round(100 * (s4[k] - ref[k]), 1) for k in keys}
        goal = {"rule": "student@4 within 5 points of teacher@20 on every accuracy figure",
                "student4_minus_teacher20_points": gaps, "met": all(g >= -5.0 for g in gaps.values()),
                "speedup_s_per_image": round(ref["s_per_image"] / s4["s_per_image"], 2)}
    return {"command": "python bench/model_eval.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "n_captions": len(items), "captions": f"single-shape, held-out generator seed {EVAL_SEED} (training seed 1234)",
            "seeds": "per caption EVAL_SEED + index, the same for every row", "guidance_scale": args.guidance,
            "size": "64x64", "batch": args.batch, "threads": args.threads,
            "kind_judges": {"v1": "models/shapes-classifier-v1 (the eval bar's)",
                            "v2": "models/shapes-classifier-v2 (the served image gate's)",
                            "geometry": f"bench/geometry.py (template IoU >= {geometry.MIN_IOU}, solidity)"},
            "rows": rows, "goal": goal}


def print_table(res: dict) -> None:
    cols = [k for k in res["rows"][0] if k.endswith("accuracy") or "_accuracy_" in k]
    head = ["model", "steps"] + [c.replace("_accuracy", "") for c in cols] + ["s/image"]
    print(" | ".join(head))
    for r in res["rows"]:
        print(" | ".join([r["model"], str(r["steps"])] + [f"{100 * r[c]:.1f}%" for c in cols] + [f"{r['s_per_image']:.3f}"]))
    judges = list(res["rows"][0]["per_kind"])
    print("\nper kind (" + " / ".join(judges) + ")")
    print(" | ".join(["model", "steps"] + SHAPES))
    for r in res["rows"]:
        cells = [" / ".join(f"{100 * r['per_kind'][j].get(k, float('nan')):.0f}" for j in judges) for k in SHAPES]
        print(" | ".join([r["model"], str(r["steps"])] + cells))
    if res["goal"]:
        print(json.dumps(res["goal"]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/shapes-v1")
    p.add_argument("--classifier", default="models/shapes-classifier-v1")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--guidance", type=float, default=6.0)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("--compare", action="store_true", help="teacher vs distilled student table (issue 22)")
    p.add_argument("--student", default="models/shapes-v1-lcm")
    p.add_argument("--teacher-steps", type=int, nargs="+", default=[20, 10, 4])
    p.add_argument("--student-steps", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--row", action="append", default=[], metavar="NAME=PATH:STEPS",
                   help="with --compare: a model and its step counts, e.g. shapes-v1=models/shapes-v1:20,10 "
                        "(repeatable; replaces the teacher/student rows)")
    p.add_argument("--results", default="model_eval_student.json", help="with --compare: the file under --out")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.compare:
        res = compare(args, argv)
        outdir = Path(args.out)
        outdir.mkdir(parents=True, exist_ok=True)
        (outdir / args.results).write_text(json.dumps(res, indent=1))
        print_table(res)
        return

    from diffusers import AutoPipelineForText2Image

    from safety.shapes_classifier import ShapesClassifier

    pipe = AutoPipelineForText2Image.from_pretrained(args.model, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    clf = ShapesClassifier.from_pretrained(args.classifier)
    items = eval_captions(args.n)
    images, gen_s = generate(pipe, items, args.steps, args.guidance, args.batch)
    scores = clf.scores(images)
    geo_kinds = geometry.judge_kinds(images)
    per_kind_geo = defaultdict(list)

    rows, per_kind, per_colour, per_bg = [], defaultdict(list), defaultdict(list), defaultdict(list)
    for (cap, gt), im, sc, geo in zip(items, images, scores, geo_kinds, strict=True):
        sh = gt.shapes[0]
        fg, bg = judge_colours(np.asarray(im.convert("RGB")))
        kind = max(sc, key=sc.get)
        r = dict(caption=cap, want_colour=sh.colour, want_background=gt.background, want_kind=sh.kind,
                 got_colour=fg, got_background=bg, got_kind=kind, kind_score=round(sc[kind], 3),
                 colour_ok=fg == sh.colour, background_ok=bg == gt.background, kind_ok=kind == sh.kind)
        r["colours_ok"] = r["colour_ok"] and r["background_ok"]
        r["all_ok"] = r["colours_ok"] and r["kind_ok"]
        rows.append(r)
        per_kind[sh.kind].append(r["kind_ok"])
        per_kind_geo[sh.kind].append(geo == sh.kind)
        r["geometry_kind"] = geo
        per_colour[sh.colour].append(r["colour_ok"])
        per_bg[gt.background].append(r["background_ok"])

    def frac(key):
        return round(float(np.mean([r[key] for r in rows])), 4)

    res = {
        "command": "python bench/model_eval.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": args.model, "classifier": args.classifier, "n_captions": len(rows),
        "captions": f"single-shape, held-out generator seed {EVAL_SEED} (training seed 1234)",
        "num_inference_steps": args.steps, "guidance_scale": args.guidance, "size": "64x64",
        "scheduler": type(pipe.scheduler).__name__,
        "shape_colour_accuracy": frac("colour_ok"), "background_colour_accuracy": frac("background_ok"),
        "shape_and_background_colour_accuracy": frac("colours_ok"),
        "shape_kind_accuracy": frac("kind_ok"), "all_correct": frac("all_ok"),
        "bars": {"shape_and_background_colour_accuracy": 0.85, "shape_kind_accuracy": 0.70},
        "per_kind_accuracy": {k: round(float(np.mean(v)), 3) for k, v in sorted(per_kind.items())},
        "shape_kind_accuracy_geometry": round(float(np.mean([g == gt.shapes[0].kind for g, (_, gt) in zip(geo_kinds, items, strict=True)])), 4),
        "per_kind_accuracy_geometry": {k: round(float(np.mean(v)), 3) for k, v in sorted(per_kind_geo.items())},
        "per_shape_colour_accuracy": {k: round(float(np.mean(v)), 3) for k, v in sorted(per_colour.items())},
        "per_background_accuracy": {k: round(float(np.mean(v)), 3) for k, v in sorted(per_bg.items())},
        "kind_confusion": dict(Counter(f"{r['want_kind']}->{r['got_kind']}" for r in rows if not r["kind_ok"])),
        "generation_wall_s": round(gen_s, 1), "s_per_image": round(gen_s / len(rows), 3),
        "threads": args.threads,
    }
    star_p = np.array([sc["star"] for sc in scores])
    heart_p = np.array([sc["heart"] for sc in scores])
    is_star = np.array([r["want_kind"] == "star" for r in rows])
    is_heart = np.array([r["want_kind"] == "heart" for r in rows])
    res["classifier_on_generated"] = {
        "note": "ground truth = the caption's kind, so this mixes generator and classifier errors",
        "top1_agrees_with_caption": res["shape_kind_accuracy"],
        "star_score_ge_0.5_on_star_captions": round(float((star_p[is_star] >= 0.5).mean()), 3),
        "star_score_ge_0.5_on_other_captions": round(float((star_p[~is_star] >= 0.5).mean()), 3),
        "heart_score_ge_0.5_on_heart_captions": round(float((heart_p[is_heart] >= 0.5).mean()), 3),
        "heart_score_ge_0.5_on_other_captions": round(float((heart_p[~is_heart] >= 0.5).mean()), 3),
    }
    res["pass"] = (res["shape_and_background_colour_accuracy"] >= 0.85 and res["shape_kind_accuracy"] >= 0.70)
    res["samples"] = rows[:40]
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "model_eval.json").write_text(json.dumps(res, indent=1))
    judged = [("ok " if r["all_ok"] else "got ") + f"{r['got_colour']} {r['got_kind']} / {r['got_background']}"
              for r in rows[:16]]
    contact_sheet(images[:16], [r["caption"] for r in rows[:16]], judged, outdir / "contact_sheet.png")
    print(json.dumps({k: v for k, v in res.items() if k != "samples"}, indent=1))


if __name__ == "__main__":
    main()
