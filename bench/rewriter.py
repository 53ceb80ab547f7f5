"""The prompt rewriter's benchmark (issue 30).

    python bench/rewriter.py --rewriter models/rewriter-v2 --n 200 [--split heldout2]

On --n held-out free-form single-shape prompts (training/rewriter_data.py's held-out split,
written with templates the rewriter never saw; English and three other languages), the shipped
image model (--model, 20 steps, guidance 6, 64x64, per-prompt seeds) draws three images per
scene: from the prompt as the user wrote it, from the rewriter's output, and from the scene's
caption in the model's own grammar (the reference). Each is judged as in bench/model_eval.py:
shape colour and background colour by the palette, kind by the shipped classifier
(models/shapes-classifier-v1). Also: the rewriter's exact-match rate against the reference
caption, prompts already in the grammar left as written (they must be), and its milliseconds per
prompt at batch 1 and 16 (one thread).

Goal: colour and kind adherence of rewritten free-form prompts within 5 points of the reference;
prompts in the grammar unchanged. Writes bench/results/rewriter.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import model_eval  # noqa: E402  (bench/model_eval.py)
import torch  # noqa: E402

from gpu_tasks.rewriter import Rewriter, parse_canonical  # noqa: E402
from training.rewriter_data import sample, samples  # noqa: E402

HELDOUT_SEED = 20261202


def scenes(n: int, split: str = "heldout") -> list:
    """Held-out free-form single-shape prompts and their reference captions."""
    out, i = [], 0
    while len(out) < n:
        s = sample(split, HELDOUT_SEED + 7, i)
        i += 1
        scene = parse_canonical(s.target)
        if s.lang in ("ood", "canonical") or scene is None or len(scene["kinds"]) != 1:
            continue
        out.append((s, scene))
    return out


def timing(rw: Rewriter, prompts: list[str], batch: int, reps: int = 3) -> float:
    """Milliseconds per prompt, rewriting ``prompts`` in batches of ``batch`` (best of reps)."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for k in range(0, len(prompts), batch):
            rw.rewrite(prompts[k:k + batch])
        best = min(best, (time.perf_counter() - t0) / len(prompts))
    return round(1000 * best, 2)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rewriter", default="models/rewriter-v2")
    p.add_argument("--split", default="heldout", choices=["heldout", "heldout2"],
                   help="heldout: the split that guided rewriter-v2's training frames; heldout2: written before "
                        "v2 was trained and never used to choose its data")
    p.add_argument("--model", default="models/shapes-v1")
    p.add_argument("--classifier", default="models/shapes-classifier-v1")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--guidance", type=float, default=6.0)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from diffusers import AutoPipelineForText2Image
    from diffusers.utils import logging as diffusers_logging

    from safety.shapes_classifier import ShapesClassifier

    diffusers_logging.set_verbosity_error()   # free-form prompts overflow CLIP's 24 tokens: a warning per batch
    rw = Rewriter(ROOT / args.rewriter)
    items = scenes(args.n, args.split)
    free = [s.source for s, _ in items]
    refs = [s.target for s, _ in items]
    rewritten = [r.prompt for r in rw.rewrite(free)]
    canon = [s.target for s in samples("heldout", HELDOUT_SEED, 400) if s.lang == "canonical"]
    unchanged = [r.prompt for r in rw.rewrite(canon)] == canon

    pipe = AutoPipelineForText2Image.from_pretrained(ROOT / args.model, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    clf = {"v1": ShapesClassifier.from_pretrained(ROOT / args.classifier)}

    def gt_of(scene):
        return SimpleNamespace(background=scene["background"],
                               shapes=[SimpleNamespace(colour=scene["colours"][0], kind=scene["kinds"][0])])

    rows = {}
    for name, prompts in (("as_written", free), ("rewritten", rewritten), ("reference_grammar", refs)):
        batch = [(pr, gt_of(sc)) for pr, (_, sc) in zip(prompts, items, strict=True)]
        images, wall = model_eval.generate(pipe, batch, args.steps, args.guidance, args.batch)
        fig = model_eval.figures(batch, images, clf)
        fig.pop("per_kind")
        fig.pop("shape_kind_accuracy_geometry", None)
        rows[name] = {**fig, "s_per_image": round(wall / len(batch), 4)}
        print(name, json.dumps(rows[name]), flush=True)
    keys = ("shape_colour_accuracy", "background_colour_accuracy", "shape_kind_accuracy_v1")
    gap = {k: round(100 * (rows["rewritten"][k] - rows["reference_grammar"][k]), 1) for k in keys}
    ms1 = timing(rw, free[:32], 1)
    ms16 = timing(rw, free[:64], 16)
    res = {
        "command": "python bench/rewriter.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rewriter": args.rewriter, "split": args.split, "rewriter_version": rw.version, "image_model": args.model, "steps": args.steps,
        "n": len(items), "languages": sorted({s.lang for s, _ in items}),
        "exact_match": round(sum(a == b for a, b in zip(rewritten, refs, strict=True)) / len(items), 4),
        "canonical_prompts_unchanged": unchanged, "rows": rows,
        "rewritten_minus_reference_points": gap,
        "goal_met": all(g >= -5.0 for g in gap.values()) and unchanged,
        "ms_per_prompt": {"batch_1": ms1, "batch_16": ms16},
        "share_of_image_time_batch_16": round(ms16 / 1000 / rows["rewritten"]["s_per_image"], 4),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "rewriter.json" if args.split == "heldout" else f"rewriter_{args.split}.json"
    (out / name).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("exact_match", "canonical_prompts_unchanged", "rewritten_minus_reference_points",
                                          "goal_met", "ms_per_prompt", "share_of_image_time_batch_16")}))
    return res


if __name__ == "__main__":
    main()
