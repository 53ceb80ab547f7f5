"""Evaluate the motion module (models/shapes-v2-motion) on held-out captions, with a geometric motion judge.

    .venv/bin/python bench/motion_eval.py --validate           # the judge on ground-truth clips (~100%)
    .venv/bin/python bench/motion_eval.py --n 32 --steps 20    # generated clips on held-out captions

Captions: clips of training/motion_data.py whose (colour, kind, motion) triple is in HELD_OUT, so
never seen in training (seed EVAL_SEED; one fixed generator seed per caption). Each generated clip
(AnimateDiffPipeline: shapes-v2's UNet, VAE and scheduler with the adapter, 16 frames of 64x64) is
judged frame by frame with the existing judges: shape and background colour by
bench/model_eval.py's ``judge_colours``, kind by bench/geometry.py's template fit. Those know only
upright shapes, so a *spinning* clip's frames are judged after turning the mask upright for each
kind (by its angular harmonic of the kind's symmetry order; the template fit is the same).

The motion judge (``judge_motion``) sees only pixels: per frame the foreground blob of
bench/geometry.py, its centroid, area and orientation (the phase of the mask's angular harmonic of
the kind's symmetry order: 3 triangle, 4 square, 5 star, 1 heart; unwrapped frame to frame). From
the path it names one motion, in this order:
  * "incoherent": a frame without a blob, or a centroid jump over MAX_JUMP px between frames;
  * "grow" / "shrink": the area at the end over that at the start >= AREA_RATIO (or <= its inverse);
  * "right" / "left": horizontal net travel >= MIN_TRAVEL px and over twice the vertical one;
  * "bounce": the vertical path goes one way >= MIN_BOUNCE px and back >= MIN_BOUNCE px;
  * "up" / "down": vertical net travel >= MIN_TRAVEL px;
  * "spin": total turn >= MIN_TURN degrees;
  * else "still".
A clip's motion is right when the judged motion is the caption's. Goal (issue 47): kind, colour and
motion each right in >= 90% (kind and colour per frame, motion per clip).
Writes bench/results/motion_eval.json (or --results) and a contact sheet of every clip's frames.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import geometry  # noqa: E402  (bench/geometry.py)
import numpy as np  # noqa: E402
from model_eval import judge_colours  # noqa: E402
from PIL import Image, ImageDraw, ImageFont  # noqa: E402

from training import motion_data  # noqa: E402

EVAL_SEED = 20261207
VALIDATION_SEED = 4848
MAX_JUMP = 9.0        # px between consecutive frames (ground truth moves at most ~5)
AREA_RATIO = 1.8      # ground truth grows its area (17/7)^2 ~ 5.9x
MIN_TRAVEL = 10.0     # px (ground truth travels 24..30)
MIN_BOUNCE = 6.0      # px each way (ground truth falls 16..22 and rises as much)
MIN_TURN = 30.0       # degrees (ground truth turns 90..128)
SYMMETRY = {"triangle": 3, "square": 4, "star": 5, "heart": 1}


# ----------------------------------------------------------------------------- per frame
def blob(frame: np.ndarray) -> np.ndarray:
    return geometry.foreground(frame)


def harmonics(mask: np.ndarray) -> dict[int, complex]:
    """Angular harmonics of the mask about its centroid, weighted by r^2 (so order 1 is the
    third moment: a heart's point); their phases over k give the orientation mod 360/k."""
    ys, xs = np.nonzero(mask)
    dx, dy = xs - xs.mean(), -(ys - ys.mean())            # y up: counter-clockwise is positive
    z = dx + 1j * dy
    r2 = np.abs(z) ** 2
    th = np.angle(z)
    return {k: complex(np.sum(r2 * np.exp(1j * k * th))) for k in (1, 3, 4, 5)}


def frame_measures(frame: np.ndarray) -> dict | None:
    mask = blob(frame)
    if mask.sum() < geometry.MIN_PIXELS:
        return None
    ys, xs = np.nonzero(mask)
    return {"x": float(xs.mean()), "y": float(ys.mean()), "area": int(mask.sum()), "h": harmonics(mask), "mask": mask}


def kind_upright(mask: np.ndarray) -> str:
    ious = geometry.template_ious(mask)
    best = max(ious, key=ious.get)
    return best if ious[best] >= geometry.MIN_IOU else "none"


@cache
def _template_phase(kind: str) -> float:
    """Orientation (degrees, mod 360/k) of the upright kind's order-k harmonic."""
    k = SYMMETRY[kind]
    mask = geometry.template(kind, 32.0, 32.0, 14.0, 64, 64)
    return float(np.degrees(np.angle(harmonics(mask)[k])) / k)


def kind_any_rotation(mask: np.ndarray) -> str:
    """bench/geometry.py's template fit of each kind after turning the mask upright for that kind
    (by the phase of its order-k harmonic against the upright template's); circles as they are."""
    from scipy import ndimage

    ys, xs = np.nonzero(mask)
    h, w = mask.shape
    # centre the blob, so turning it keeps it in the frame
    centred = ndimage.shift(mask.astype(np.float32), (h / 2 - ys.mean(), w / 2 - xs.mean()), order=1)
    hs = harmonics(centred >= 0.5)
    best = {"circle": geometry.template_ious(mask)["circle"]}
    for kind, k in SYMMETRY.items():
        period = 360.0 / k
        turn = (_template_phase(kind) - np.degrees(np.angle(hs[k])) / k + period / 2) % period - period / 2
        m = ndimage.rotate(centred, float(turn), reshape=False, order=1) >= 0.5
        best[kind] = geometry.template_ious(m)[kind] if m.sum() >= geometry.MIN_PIXELS else 0.0
    kind = max(best, key=lambda k_: best[k_])
    return kind if best[kind] >= geometry.MIN_IOU else "none"


# ----------------------------------------------------------------------------- motion
def _ends(v: np.ndarray, n: int = 3) -> tuple[float, float]:
    return float(v[:n].mean()), float(v[-n:].mean())


def turn_degrees(hs: list[dict[int, complex]], k: int) -> float:
    """Total unwrapped turn (degrees, counter-clockwise positive) of the order-k orientation."""
    ph = np.array([np.angle(h[k]) for h in hs])
    d = np.angle(np.exp(1j * np.diff(ph)))                 # wrapped to (-pi, pi]
    return float(np.degrees(d.sum() / k))


def judge_motion(frames: np.ndarray, kind: str | None = None) -> dict:
    """The motion of a clip (frames, H, W, 3) uint8 from its blob's path. ``kind`` picks the
    symmetry order of the turn measure (the judged kind; with none, the strongest harmonic)."""
    ms = [frame_measures(f) for f in frames]
    out: dict = {"frames_with_blob": sum(m is not None for m in ms)}
    if any(m is None for m in ms):
        return dict(out, motion="incoherent", why="a frame without a shape")
    x = np.array([m["x"] for m in ms])
    y = np.array([m["y"] for m in ms])
    area = np.array([m["area"] for m in ms], dtype=np.float64)
    jump = float(np.max(np.hypot(np.diff(x), np.diff(y))))
    x0, x1 = _ends(x)
    y0, y1 = _ends(y)
    a0, a1 = _ends(area)
    dx, dy, ratio = x1 - x0, y1 - y0, a1 / max(a0, 1.0)
    # vertical reversal: the larger of (down then up) and (up then down), each leg's smaller part
    i_lo, i_hi = int(np.argmax(y)), int(np.argmin(y))
    bounce = max(min(y[i_lo] - y0, y[i_lo] - y1), min(y0 - y[i_hi], y1 - y[i_hi]))
    if kind in SYMMETRY:
        k = SYMMETRY[kind]
    else:
        norm = {k: np.mean([abs(m["h"][k]) / max(1.0, float(np.sum(m["area"] ** 2))) for m in ms]) for k in (3, 4, 5)}
        k = max(norm, key=lambda j: norm[j])
    turn = turn_degrees([m["h"] for m in ms], k) if kind != "circle" else 0.0
    out.update(dx=round(dx, 2), dy=round(dy, 2), area_ratio=round(ratio, 3), bounce=round(float(bounce), 2),
               turn_deg=round(turn, 1), max_jump=round(jump, 2), symmetry_order=k,
               path=[[round(float(a), 1), round(float(b), 1)] for a, b in zip(x, y, strict=True)])
    if jump > MAX_JUMP:
        motion = "incoherent"
    elif ratio >= AREA_RATIO:
        motion = "grow"
    elif ratio <= 1 / AREA_RATIO:
        motion = "shrink"
    elif abs(dx) >= MIN_TRAVEL and abs(dx) > 2 * abs(dy):
        motion = "right" if dx > 0 else "left"
    elif bounce >= MIN_BOUNCE and abs(dx) < MIN_TRAVEL:
        motion = "bounce"
    elif abs(dy) >= MIN_TRAVEL:
        motion = "down" if dy > 0 else "up"
    elif abs(turn) >= MIN_TURN:
        motion = "spin"
    else:
        motion = "still"
    out["motion"] = motion
    return out


# ----------------------------------------------------------------------------- a whole clip
def judge_clip(frames: np.ndarray, want: dict) -> dict:
    """Per-frame colours and kinds and the clip's motion against ``want`` (colour, kind, background, motion)."""
    colours, kinds = [], []
    for f in frames:
        fg, bg = judge_colours(f)
        colours.append((fg, bg))
        mask = blob(f)
        if mask.sum() < geometry.MIN_PIXELS:
            kinds.append("none")
        elif want["motion"] == "spin":
            kinds.append(kind_any_rotation(mask))
        else:
            kinds.append(kind_upright(mask))
    majority = Counter(kinds).most_common(1)[0][0]
    mot = judge_motion(frames, kind=majority)
    return {
        "caption": want["caption"], "want_motion": want["motion"], "got_motion": mot["motion"],
        "motion_ok": mot["motion"] == want["motion"],
        "kind_ok_frames": int(sum(k == want["kind"] for k in kinds)),
        "colour_ok_frames": int(sum(fg == want["colour"] for fg, _ in colours)),
        "background_ok_frames": int(sum(bg == want["background"] for _, bg in colours)),
        "frames": len(frames), "kinds": dict(Counter(kinds)), "colours": dict(Counter(fg for fg, _ in colours)),
        "motion_measures": {k: v for k, v in mot.items() if k != "motion"},
    }


def summarise(rows: list[dict]) -> dict:
    nf = sum(r["frames"] for r in rows)
    per_motion: dict[str, list[bool]] = defaultdict(list)
    for r in rows:
        per_motion[r["want_motion"]].append(r["motion_ok"])
    return {
        "clips": len(rows), "frames": nf,
        "kind_right_frames": round(sum(r["kind_ok_frames"] for r in rows) / nf, 4),
        "colour_right_frames": round(sum(r["colour_ok_frames"] for r in rows) / nf, 4),
        "background_right_frames": round(sum(r["background_ok_frames"] for r in rows) / nf, 4),
        "motion_right_clips": round(float(np.mean([r["motion_ok"] for r in rows])), 4),
        "all_right_clips": round(float(np.mean([r["motion_ok"] and r["kind_ok_frames"] == r["frames"]
                                                and r["colour_ok_frames"] == r["frames"]
                                                and r["background_ok_frames"] == r["frames"] for r in rows])), 4),
        "motion_right_per_motion": {m: f"{sum(v)}/{len(v)}" for m, v in sorted(per_motion.items())},
        "motion_confusion": dict(Counter(f"{r['want_motion']}->{r['got_motion']}" for r in rows if not r["motion_ok"])),
    }


def want_of(gt: motion_data.ClipGT) -> dict:
    return {"caption": gt.caption, "colour": gt.colour, "kind": gt.kind, "background": gt.background, "motion": gt.motion}


def eval_items(n: int, seed: int = EVAL_SEED) -> list[motion_data.ClipGT]:
    """``n`` held-out captions (their ground-truth clips too), cycling through the motions evenly."""
    out = []
    i = 0
    while len(out) < n:
        rng = np.random.default_rng([seed, i])
        i += 1
        want_motion = motion_data.MOTION_NAMES[len(out) % len(motion_data.MOTION_NAMES)]
        for _ in range(1000):
            gt = motion_data.random_clip(rng, held_out=True)
            if gt.motion == want_motion:
                out.append(gt)
                break
    return out


# ----------------------------------------------------------------------------- sheets
def contact_sheet(clips: list[np.ndarray], rows: list[dict], path: Path, every: int = 2, scale: int = 2) -> None:
    font = ImageFont.load_default()
    tile = 64 * scale
    ncol = (motion_data.FRAMES + every - 1) // every
    text_h = 14
    sheet = Image.new("RGB", (ncol * tile, len(clips) * (tile + text_h)), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for i, (frames, r) in enumerate(zip(clips, rows, strict=True)):
        y = i * (tile + text_h)
        ok = r["motion_ok"] and r["kind_ok_frames"] == r["frames"] and r["colour_ok_frames"] == r["frames"]
        draw.text((2, y + 1), f"{r['caption']}  ->  {r['got_motion']}, kinds {r['kinds']}",
                  fill=(0, 110, 0) if ok else (190, 0, 0), font=font)
        for j, f in enumerate(frames[::every]):
            sheet.paste(Image.fromarray(f).resize((tile, tile), Image.NEAREST), (j * tile, y + text_h))
    sheet.save(path)


# ----------------------------------------------------------------------------- runs
def validate(n: int, vae=None) -> dict:
    """The judges on ground-truth clips (training's triples and held-out ones alike), or on their
    round trip through ``vae`` (what the decoder alone does to corners and edges)."""
    rows = []
    for i in range(n):
        rng = np.random.default_rng([VALIDATION_SEED, i])
        gt = motion_data.random_clip(rng, held_out=bool(i % 4 == 0))
        frames = motion_data.render_clip(gt)
        if vae is not None:
            frames = np.stack([np.asarray(im) for im in geometry.vae_round_trip(vae, [Image.fromarray(f) for f in frames])])
        rows.append(judge_clip(frames, want_of(gt)))
    return {"summary": summarise(rows), "failures": [r for r in rows if not r["motion_ok"]][:10]}


def generate(pipe, items, steps: int, guidance: float, batch: int) -> tuple[list[np.ndarray], float]:
    import torch

    clips: list[np.ndarray] = []
    t0 = time.time()
    for s in range(0, len(items), batch):
        chunk = items[s:s + batch]
        gens = [torch.Generator().manual_seed(EVAL_SEED + s + j) for j in range(len(chunk))]
        out = pipe(prompt=[g.caption for g in chunk], num_frames=motion_data.FRAMES, height=64, width=64,
                   num_inference_steps=steps, guidance_scale=guidance, generator=gens, output_type="np")
        for v in out.frames:
            clips.append((np.clip(np.asarray(v), 0, 1) * 255).round().astype(np.uint8))
    return clips, time.time() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--validate", action="store_true", help="judge ground-truth clips only")
    p.add_argument("--n", type=int, default=32, help="held-out captions (or ground-truth clips with --validate)")
    p.add_argument("--model", default="models/shapes-v2-motion")
    p.add_argument("--base", default="models/shapes-v2")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--guidance", type=float, default=6.0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--results", default=None, help="file under bench/results/")
    args = p.parse_args(argv)
    command = "python bench/motion_eval.py " + " ".join(argv if argv is not None else sys.argv[1:])
    outdir = ROOT / "bench" / "results"
    if args.validate:
        from diffusers import AutoencoderKL

        vae = AutoencoderKL.from_pretrained(args.base, subfolder="vae").float().eval()
        res = {"command": command, "clips": f"{args.n} ground-truth clips of training/motion_data.py, seed {VALIDATION_SEED}",
               "ground_truth": validate(args.n), f"vae_round_trip:{args.base}": validate(args.n, vae)}
        (outdir / (args.results or "motion_judge_validation.json")).write_text(json.dumps(res, indent=1))
        print(json.dumps({k: v["summary"] for k, v in res.items() if isinstance(v, dict)}, indent=1))
        return
    import torch

    from training.train_motion import load_pipeline

    torch.set_num_threads(args.threads)
    pipe = load_pipeline(args.model, args.base)
    items = eval_items(args.n)
    clips, wall = generate(pipe, items, args.steps, args.guidance, args.batch)
    rows = [judge_clip(c, want_of(gt)) for c, gt in zip(clips, items, strict=True)]
    info = json.loads((Path(args.model) / "training_info.json").read_text())
    name = args.results or "motion_eval.json"
    res = {"command": command, "model": args.model, "base": args.base, "adapter_step": info.get("step"),
           "captions": f"{len(items)} held-out (colour, kind, motion) captions, seed {EVAL_SEED}, generator seed "
                       f"{EVAL_SEED} + index", "num_inference_steps": args.steps, "guidance_scale": args.guidance,
           "frames": motion_data.FRAMES, "size": "64x64", "threads": args.threads,
           "generation_wall_s": round(wall, 1), "s_per_clip": round(wall / len(items), 2),
           "goal": {"kind_right_frames": 0.9, "colour_right_frames": 0.9, "motion_right_clips": 0.9},
           "summary": summarise(rows), "clips": rows}
    res["goal_met"] = all(res["summary"][k] >= v for k, v in res["goal"].items())
    (outdir / name).write_text(json.dumps(res, indent=1))
    contact_sheet(clips, rows, (outdir / name).with_name(Path(name).stem + "_sheet.png"))
    print(json.dumps(res["summary"], indent=1), "goal met:", res["goal_met"])


if __name__ == "__main__":
    main()
