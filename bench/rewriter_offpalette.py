"""Off-palette prompts through the prompt rewriter (issue 45, item 11).

    python bench/rewriter_offpalette.py [--rewriter models/rewriter-v2]

The shipped image model draws six colours and five kinds. On the prompts below (written for this
benchmark, none from the rewriter's training data: colours and shapes outside the grammar, mixed
phrasings), the share whose revised prompt keeps the nearest drawable colour and kind of every
shape (and the background's colour, where the prompt names one), for

* ``before``: the learned rewriter alone (models/rewriter-v2 on the prompt as written, with the
  serving guard: a rewrite outside the grammar keeps the user's prompt), as it ran before;
* ``after``: gpu_tasks/rewriter.Rewriter, with the nearest-drawable mapping (gpu_tasks/nearest.py).

The expected scene of each prompt is written by hand here, from the nearest drawable a person
would pick, not computed by gpu_tasks/nearest.py (so a disagreement between the two shows as a
miss). Also: prompts naming only things the model cannot draw, which must come back unchanged
with a note. Writes bench/results/rewriter_offpalette.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_tasks import nearest  # noqa: E402
from gpu_tasks.rewriter import KEEP, Rewriter, parse_canonical  # noqa: E402

# prompt, the expected shapes "colour kind[, colour kind]", the expected background (None: not named)
CASES: list[tuple[str, str, str | None]] = [
    ("a pink heart on a white background", "red heart", "white"),
    ("a pink heart on a black background", "red heart", "black"),
    ("a navy oval on a beige background", "blue circle", "white"),
    ("a teal pentagon on a black background", "green circle", "black"),
    ("a crimson rhombus on a white background", "red square", "white"),
    ("a gold diamond on a navy background", "yellow square", "blue"),
    ("a violet star on a white background", "blue star", "white"),
    ("a maroon rectangle on a lime background", "red square", "green"),
    ("a turquoise circle on a black background", "green circle", "black"),
    ("an orange square on a white background", "yellow square", "white"),
    ("a purple heart on a yellow background", "blue heart", "yellow"),
    ("a brown triangle on a white background", "red triangle", "white"),
    ("a grey star on a black background", "white star", "black"),
    ("a grey star on a white background", "black star", "white"),
    ("a silver circle on a blue background", "white circle", "blue"),
    ("a magenta square on a black background", "blue square", "black"),
    ("a cyan triangle on a red background", "green triangle", "red"),
    ("an indigo heart on a white background", "blue heart", "white"),
    ("a lavender star on a black background", "white star", "black"),
    ("a coral circle on a blue background", "red circle", "blue"),
    ("a salmon heart on a black background", "red heart", "black"),
    ("a khaki square on a blue background", "yellow square", "blue"),
    ("a mint triangle on a black background", "green triangle", "black"),
    ("a charcoal star on a yellow background", "black star", "yellow"),
    ("a burgundy oval on a white background", "red circle", "white"),
    ("a pink ellipse against a black backdrop", "red circle", "black"),
    ("draw a hexagon in teal on a white background", "green circle", "white"),
    ("an octagon, coloured orange, on a blue background", "yellow circle", "blue"),
    ("a big pink heart on a white background", "large red heart", "white"),
    ("a tiny purple star against a yellow backdrop", "small blue star", "yellow"),
    ("please draw a large violet diamond on a black background", "large blue square", "black"),
    ("a small brown rectangle on a white background", "small red square", "white"),
    ("a pink heart", "red heart", None),
    ("a purple star", "blue star", None),
    ("an orange oval", "yellow circle", None),
    ("a rhombus", "square", None),
    ("a teal parallelogram", "green square", None),
    ("a pentagon", "circle", None),
    ("a red rhombus on a blue background", "red square", "blue"),
    ("a green oval on a white background", "green circle", "white"),
    ("a yellow pentagon on a black background", "yellow circle", "black"),
    ("a blue rectangle on a yellow background", "blue square", "yellow"),
    ("a white hexagon on a red background", "white circle", "red"),
    ("a black trapezoid on a white background", "black square", "white"),
    ("a red cone on a white background", "red triangle", "white"),
    ("a yellow hexagram on a blue background", "yellow star", "blue"),
    ("a pink star on a navy background", "red star", "blue"),
    ("a purple circle on a grey background", "blue circle", "white"),
    ("a red heart on a pink background", "red heart", "white"),
    ("a yellow square on a purple background", "yellow square", "blue"),
    ("a white star on a teal background", "white star", "green"),
    ("a black circle on an orange background", "black circle", "yellow"),
    ("a green triangle on a brown background", "green triangle", "red"),
    ("a pink heart and a purple star on a white background", "red heart, blue star", "white"),
    ("an orange circle and a teal square on a black background", "yellow circle, green square", "black"),
    ("a grey oval and a red star on a blue background", "white circle, red star", "blue"),
    ("a pink heart over a light blue background", "red heart", "blue"),
    ("a dark grey star on a white background", "black star", "white"),
    ("a light grey heart on a black background", "white heart", "black"),
    ("a pinkish heart on a white background", "red heart", "white"),
    ("a purplish diamond on a white background", "blue square", "white"),
    ("a magenta oval on a white canvas", "blue circle", "white"),
    ("an orange arrow on a black background", "yellow triangle", "black"),
    ("a turquoise rhombus, black background", "green square", "black"),
    ("on a beige background, a brown heart", "red heart", "white"),
    ("a heart in pink on a white background", "red heart", "white"),
    ("a violet pentagon floating on a black background", "blue circle", "black"),
    ("i want a maroon diamond on a silver background", "red square", "white"),
    # other phrasings: the mapping alone does not reach the grammar, the learned rewriter writes the caption
    ("show me a pink heart placed on white", "red heart", "white"),
    ("render a teal oval with a black background please", "green circle", "black"),
    ("a heart, pink, against a white wall", "red heart", "white"),
    ("purple star, yellow backdrop", "blue star", "yellow"),
    ("could you draw an orange rhombus over a navy backdrop", "yellow square", "blue"),
    ("a maroon pentagon sitting on a white surface", "red circle", "white"),
    ("a lavender heart under a night sky", "white heart", "black"),
    ("a big turquoise ellipse on a black canvas", "large green circle", "black"),
    ("i would like a small grey diamond on a yellow background", "small white square", "yellow"),
    ("a coral hexagon against the sky", "red circle", "blue"),
    ("a rectangle painted pink on a black background", "red square", "black"),
    ("generate a brown oval on a white backdrop, sharp", "red circle", "white"),
    ("a violet heart in the night sky", "blue heart", "black"),
    ("an indigo rhombus and a yellow star on a white background", "blue square, yellow star", "white"),
    ("a peach star on a blue background", "yellow star", "blue"),
    ("a salmon-coloured oval on black", "red circle", "black"),
    ("a plum heart on white", "blue heart", "white"),
    ("a hexagon the colour of the sea on white", "blue circle", "white"),
    ("a navy blue pentagon on a white background", "blue circle", "white"),
    ("a light pink heart on a black background", "red heart", "black"),
    ("a tan cone on a blue background", "yellow triangle", "blue"),
    # the rewriter's other languages
    ("un cœur rose sur fond blanc", "red heart", "white"),
    ("une étoile violette sur fond noir", "blue star", "black"),
    ("ein grauer kreis auf blauem hintergrund", "white circle", "blue"),
    ("un cuadrado morado sobre fondo amarillo", "blue square", "yellow"),
]
# Things this model cannot draw: the prompt comes back as written, with a note.
NOT_DRAWABLE = ["a cat", "a pink cat on a white background", "a dog in the rain", "a purple car", "a house on a hill"]


def expected(shapes: str, bg: str | None) -> tuple[list[tuple[str | None, str, str]], str | None]:
    out = []
    for part in shapes.split(", "):
        words = part.split()
        size = words[0] if words[0] in ("small", "large") else None
        words = words[1:] if size else words
        colour, kind = (words[0], words[1]) if len(words) == 2 else (None, words[0])
        out.append((size, colour, kind))
    return out, bg


def keeps(revised: str, shapes, bg) -> dict[str, bool]:
    """Whether the revised prompt keeps each shape's colour and kind (and the background)."""
    scene = parse_canonical(revised)
    if scene is None:
        return {"colour": False, "kind": False, "background": False, "all": False}
    got = list(zip(scene["colours"], scene["kinds"], strict=True))
    kind_ok = sorted(k for _, _, k in shapes) == sorted(k for _, k in got)
    colour_ok = all((c, k) in got for _, c, k in shapes if c) and kind_ok
    bg_ok = bg is None or scene["background"] == bg
    return {"colour": colour_ok, "kind": kind_ok, "background": bg_ok, "all": colour_ok and kind_ok and bg_ok}


def learned_alone(rw: Rewriter, prompts: list[str]) -> list[str]:
    """The rewriter before issue 45 item 11: the model on the prompt as written, its guard kept."""
    out = []
    for prompt, text in zip(prompts, rw._generate(prompts), strict=True):
        text = " ".join(text.split())
        out.append(prompt if parse_canonical(prompt) else text if text != KEEP and parse_canonical(text) else prompt)
    return out


def path(prompt: str, rewrite) -> str:
    """How the rewrite was reached: the mapping alone put the prompt in the grammar; the learned
    rewriter wrote it from the mapped words; or the rewriter's caption was refused (it lost a
    nearest drawable) and the mapped words were kept."""
    mapped = " ".join(nearest.plan(prompt).text.split())
    if parse_canonical(mapped.lower()):
        return "mapping"
    return "mapped_words_kept" if rewrite.prompt == mapped else "learned_rewriter"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--rewriter", default="models/rewriter-v2")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)
    rw = Rewriter(ROOT / args.rewriter, threads=1)
    prompts = [c[0] for c in CASES]
    wanted = [expected(shapes, bg) for _, shapes, bg in CASES]
    before = learned_alone(rw, prompts)
    after_rewrites = rw.rewrite(prompts)
    after = [r.prompt for r in after_rewrites]
    paths = [path(p, r) for p, r in zip(prompts, after_rewrites, strict=True)]
    rows, res = [], {}
    for name, revised in (("before", before), ("after", after)):
        marks = [keeps(r, *w) for r, w in zip(revised, wanted, strict=True)]
        res[name] = {k: round(sum(m[k] for m in marks) / len(marks), 4) for k in ("all", "colour", "kind", "background")}
        res[name]["kept"] = sum(m["all"] for m in marks)
        for i, m in enumerate(marks):
            if name == "after" or not m["all"]:
                rows.append({"set": name, "prompt": prompts[i], "revised": revised[i], "ok": m["all"],
                             **({"notes": list(after_rewrites[i].notes), "path": paths[i]} if name == "after" else {})})
    res["after"]["paths"] = {k: paths.count(k) for k in sorted(set(paths))}
    nd = rw.rewrite(NOT_DRAWABLE)
    nd_before = learned_alone(rw, NOT_DRAWABLE)
    result = {
        "command": "python bench/rewriter_offpalette.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rewriter": args.rewriter, "rewriter_version": rw.version, "n": len(CASES),
        "keeps_nearest_colour_and_kind": {"before": res["before"], "after": res["after"]},
        "not_drawable": {
            "n": len(NOT_DRAWABLE),
            "before_swapped": sum(b != p for b, p in zip(nd_before, NOT_DRAWABLE, strict=True)),
            "after_kept_as_written_with_a_note": sum(r.prompt == p and bool(r.notes) for r, p in zip(nd, NOT_DRAWABLE, strict=True)),
            "rows": [{"prompt": p, "before": b, "after": r.prompt, "notes": list(r.notes)}
                     for p, b, r in zip(NOT_DRAWABLE, nd_before, nd, strict=True)],
        },
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rewriter_offpalette.json").write_text(json.dumps(result, indent=1))
    for row in rows:
        if not row["ok"]:
            print(f"{row['set']:6s} miss: {row['prompt']!r} -> {row['revised']!r}")
    print(json.dumps({k: result[k] for k in ("n", "keeps_nearest_colour_and_kind")}))
    print(json.dumps({k: v for k, v in result["not_drawable"].items() if k != "rows"}))
    return result


if __name__ == "__main__":
    main()
