"""One subject at every menu size (issue 46 item 3): does a one-shape caption give one shape?

    python bench/one_subject.py --model models/shapes-v2 --steps 20 12 --n 40 --label before

For each size on the menu (imagegen/config/limits.py: 64x64, 96x64, 64x96, 96x96) and each step
count, N held-out single-shape captions (generator seed ONE_SUBJECT_SEED, neither training's 1234
nor bench/model_eval.py's) are drawn through the served call (gpu_tasks/pipeline.py: the diffusers
pipeline, one seeded CPU generator per row, seed ONE_SUBJECT_SEED + index, the served guidance:
serving.json's guidance_scale, else the deployment default 5.0) and judged by pixels:

  * background = the most frequent nearest-palette colour on the border (as bench/model_eval.py);
  * shapes = connected components (8-connected) of the pixels whose nearest palette colour is not
    the background's; a component is a speck, and not counted, when its area is under
    SPECK_PIXELS (scaled by the frame's shorter side / 64, squared) or under SPECK_SHARE of the
    largest component's area;
  * one shape: exactly one component is left;
  * kind right: bench/geometry.py's template judge on the largest component;
  * colours right: the largest component's most frequent palette colour is the caption's shape
    colour and the background is the caption's.

Goal (issue 46): at every menu size one shape in >= 95% and kinds and colours right in >= 95%.
Writes bench/results/one_subject_<label>.json and, with --sheets DIR, one contact sheet per size
and step count (the first --sheet-n images, 2x, a green bar under an image judged all right).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import geometry  # noqa: E402  (bench/geometry.py)
import numpy as np  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

from training.shapes_data import COLOUR_NAMES, COLOURS, random_gt  # noqa: E402

ONE_SUBJECT_SEED = 46_003
MENU = [(64, 64), (96, 64), (64, 96), (96, 96)]  # (width, height): imagegen/config/limits.py's size_menu default
SERVED_GUIDANCE = 5.0  # IMAGEGEN_DEFAULT_GUIDANCE: the default model's guidance (scheduling/catalogue.py)
SPECK_PIXELS = 12
SPECK_SHARE = 0.1
GOAL = 0.95
PALETTE = np.array([COLOURS[n] for n in COLOUR_NAMES], np.float32)


def captions(n: int, seed: int = ONE_SUBJECT_SEED):
    """(caption, ground truth) for n held-out single-shape scenes (the size word kept in 70%):
    bench/model_eval.py's captions, from this benchmark's own seed."""
    from model_eval import eval_captions  # bench/model_eval.py

    return eval_captions(n, seed)


def components(arr: np.ndarray) -> tuple[str, list[tuple[int, str]], np.ndarray]:
    """(background colour, [(area, colour)] of the shapes largest first, specks left out, mask of
    the largest shape) of an RGB uint8 image."""
    from scipy import ndimage

    h, w = arr.shape[:2]
    lab = ((arr[..., None, :].astype(np.float32) - PALETTE) ** 2).sum(-1).argmin(-1)
    border = np.concatenate([lab[0], lab[-1], lab[:, 0], lab[:, -1]])
    bg = int(np.bincount(border, minlength=len(PALETTE)).argmax())
    comps, n = ndimage.label(lab != bg, structure=np.ones((3, 3), bool))
    if n == 0:
        return COLOUR_NAMES[bg], [], np.zeros((h, w), bool)
    areas = np.bincount(comps.ravel(), minlength=n + 1)[1:]
    floor = max(SPECK_PIXELS * (min(h, w) / 64) ** 2, SPECK_SHARE * float(areas.max()))
    kept = [int(i) for i in np.argsort(-areas) if areas[i] >= floor]
    shapes = []
    for i in kept:
        colour = Counter(lab[comps == i + 1].tolist()).most_common(1)[0][0]
        shapes.append((int(areas[i]), COLOUR_NAMES[colour]))
    return COLOUR_NAMES[bg], shapes, comps == kept[0] + 1


def judge(image: Image.Image, gt) -> dict:
    arr = np.asarray(image.convert("RGB"))
    bg, shapes, largest = components(arr)
    want = gt.shapes[0]
    kind = "none"
    if largest.sum() >= geometry.MIN_PIXELS:
        # the template judge on the largest shape alone, drawn on the background colour
        alone = np.where(largest[..., None], np.asarray(COLOURS[shapes[0][1]], np.uint8), np.asarray(COLOURS[bg], np.uint8))
        kind = geometry.measure(alone)["kind"]
    res = {"shapes": len(shapes), "kind": kind, "colour": shapes[0][1] if shapes else "none", "background": bg}
    res["one_shape"] = len(shapes) == 1
    res["kind_right"] = kind == want.kind
    res["colours_right"] = res["colour"] == want.colour and bg == gt.background
    res["all_right"] = res["one_shape"] and res["kind_right"] and res["colours_right"]
    return res


def draw(pipe, items, width: int, height: int, steps: int, guidance: float, batch: int, seed: int = ONE_SUBJECT_SEED):
    """Images for the items, one generator per row seeded seed + index, as the generate stage does."""
    import torch

    images = []
    for s in range(0, len(items), batch):
        chunk = items[s : s + batch]
        gens = [torch.Generator(device="cpu").manual_seed(seed + s + i) for i in range(len(chunk))]
        with torch.inference_mode():
            out = pipe(
                prompt=[c for c, _ in chunk],
                width=width,
                height=height,
                num_inference_steps=steps,
                guidance_scale=guidance,
                generator=gens,
                output_type="pil",
            )
        images.extend(out.images)
    return images


def contact_sheet(images, verdicts, path: Path, cols: int = 8, scale: int = 2) -> None:
    w, h = images[0].size
    tw, th = w * scale, h * scale
    rows = (len(images) + cols - 1) // cols
    sheet = Image.new("RGB", (cols * (tw + 4) + 4, rows * (th + 10) + 4), (255, 255, 255))
    pen = ImageDraw.Draw(sheet)
    for k, (im, v) in enumerate(zip(images, verdicts, strict=True)):
        x, y = 4 + (k % cols) * (tw + 4), 4 + (k // cols) * (th + 10)
        sheet.paste(im.resize((tw, th), Image.NEAREST), (x, y))
        pen.rectangle([x, y + th + 1, x + tw - 1, y + th + 4], fill=(0, 150, 0) if v["all_right"] else (200, 0, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path, optimize=True)


def validate(n: int) -> dict:
    """The judge on ground-truth renderings at every menu size (training/shapes_data.py's frames):
    one-shape scenes should count one shape with kind and colours right, two-shape scenes two."""
    from training.shapes_data import render_frame

    out = {}
    for width, height in MENU:
        one, two = [], []
        for i in range(n):
            for shapes, got in ((1, one), (2, two)):
                gt = random_gt(
                    np.random.default_rng([ONE_SUBJECT_SEED + 1, width, height, shapes, i]),
                    n_shapes=shapes,
                    width=width,
                    height=height,
                )
                v = judge(render_frame(gt, width, height), gt)
                got.append(v["all_right"] if shapes == 1 else v["shapes"] == 2)
        out[f"{width}x{height}"] = {
            "one_shape_scenes_all_right": round(float(np.mean(one)), 4),
            "two_shape_scenes_counted_two": round(float(np.mean(two)), 4),
        }
    return out


def before_after_sheets(before: Path, after: Path, out_dir: Path, n: int, steps: int, sizes: list[str]) -> list[Path]:
    """One sheet per size: the first n captions by `before` (top row) and `after` (bottom row),
    the same seeds, at native size, a green or red bar under each by the judge."""
    from diffusers import AutoPipelineForText2Image

    pipes = []
    for model in (before, after):
        pipe = AutoPipelineForText2Image.from_pretrained(str(model), local_files_only=True)
        pipe.set_progress_bar_config(disable=True)
        pipes.append((pipe, served_guidance(model)))
    items = captions(n)
    written = []
    for size in sizes:
        width, height = (int(v) for v in size.split("x"))
        images, verdicts = [], []
        for pipe, guidance in pipes:
            drawn = draw(pipe, items, width, height, steps, guidance, batch=n)
            images += drawn
            verdicts += [judge(im, gt) for im, (_, gt) in zip(drawn, items, strict=True)]
        path = out_dir / f"{size}.png"
        contact_sheet(images, verdicts, path, cols=n, scale=1)
        written.append(path)
    return written


def served_guidance(model: Path) -> float:
    try:
        return float(json.loads((model / "serving.json").read_text()).get("guidance_scale", SERVED_GUIDANCE))
    except FileNotFoundError:
        return SERVED_GUIDANCE


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "models" / "shapes-v2"))
    p.add_argument("--steps", type=int, nargs="+", default=[20, 12])
    p.add_argument("--n", type=int, default=40, help="captions per size (the same for every size and step count)")
    p.add_argument("--sizes", nargs="+", default=[f"{w}x{h}" for w, h in MENU], help="WIDTHxHEIGHT ...")
    p.add_argument("--guidance", type=float, default=None, help="default: the served guidance")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--label", default="run")
    p.add_argument("--sheets", default=None, help="write contact sheets here (DIR/<label>_<size>_<steps>.png)")
    p.add_argument("--sheet-n", type=int, default=16)
    p.add_argument("--validate", type=int, default=0, help="judge N ground-truth renderings per size and stop")
    p.add_argument(
        "--before-after",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        default=None,
        help="write one small sheet per size to --sheets: --sheet-n captions by BEFORE above AFTER (the first --steps), and stop",
    )
    args = p.parse_args(argv)
    if args.before_after:
        for path in before_after_sheets(
            *(Path(m) for m in args.before_after), Path(args.sheets or "."), args.sheet_n, args.steps[0], args.sizes
        ):
            print(f"wrote {path}")
        return
    if args.validate:
        print(json.dumps(validate(args.validate), indent=1))
        return

    import torch
    from diffusers import AutoPipelineForText2Image

    torch.set_num_threads(args.threads)
    model = Path(args.model)
    guidance = args.guidance if args.guidance is not None else served_guidance(model)
    pipe = AutoPipelineForText2Image.from_pretrained(str(model), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    items = captions(args.n)
    rows = []
    for size in args.sizes:
        width, height = (int(v) for v in size.split("x"))
        for steps in args.steps:
            t0 = time.time()
            images = draw(pipe, items, width, height, steps, guidance, args.batch)
            verdicts = [judge(im, gt) for im, (_, gt) in zip(images, items, strict=True)]
            share = {
                k: round(float(np.mean([v[k] for v in verdicts])), 4)
                for k in ("one_shape", "kind_right", "colours_right", "all_right")
            }
            row = {
                "size": size,
                "steps": steps,
                **share,
                "shape_counts": dict(sorted(Counter(v["shapes"] for v in verdicts).items())),
                "goal_met": share["one_shape"] >= GOAL and share["kind_right"] >= GOAL and share["colours_right"] >= GOAL,
                "s_per_image": round((time.time() - t0) / len(items), 3),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.sheets:
                n = min(args.sheet_n, len(images))
                contact_sheet(images[:n], verdicts[:n], Path(args.sheets) / f"{args.label}_{size}_{steps}.png")
    res = {
        "command": "python bench/one_subject.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": str(args.model),
        "guidance_scale": guidance,
        "n_per_size": args.n,
        "captions": f"single-shape, generator seed {ONE_SUBJECT_SEED} (held out); image seeds {ONE_SUBJECT_SEED} + index",
        "judge": f"palette segmentation, 8-connected components, specks < {SPECK_PIXELS} px x (short side/64)^2 "
        f"or < {SPECK_SHARE:.0%} of the largest; kind by bench/geometry.py on the largest",
        "goal": f"one shape, kind right and colours right each >= {GOAL:.0%} at every size",
        "goal_met": all(r["goal_met"] for r in rows),
        "rows": rows,
    }
    out = ROOT / "bench" / "results" / f"one_subject_{args.label}.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
