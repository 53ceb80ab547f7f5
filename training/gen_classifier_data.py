"""Generate the demo classifier's data with the shipped generator, in bounded, resumable chunks.

    nice -n 15 env OMP_NUM_THREADS=1 .venv/bin/python -m training.gen_classifier_data \\
        --out /tmp/imagegen-clfdata --split train --counts 64x64:5000,96x64:1000,64x96:1000,96x96:1000 \\
        --max-minutes 60

Each chunk of CHUNK items (training/classifier_data.py: prompt, labels, seed) is one pipeline
call made the way the service makes a batch (gpu_tasks/pipeline.py: one seeded generator per
row, empty negative prompt, 20 steps, guidance 6) and lands as one .npz file written atomically;
a rerun skips the chunks already on disk, so the job can be stopped (--max-minutes) and resumed.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from training.classifier_data import GUIDANCE, STEPS, Item, item

CHUNK = 32


def parse_counts(text: str) -> list[tuple[int, int, int]]:
    """'64x64:5000,96x64:1000' -> [(64, 64, 5000), (96, 64, 1000)]."""
    out = []
    for part in text.split(","):
        size, _, n = part.strip().partition(":")
        w, _, h = size.partition("x")
        out.append((int(w), int(h), int(n)))
    return out


def load_pipeline(model: str, threads: int = 1):
    import torch
    from diffusers import AutoPipelineForText2Image

    torch.set_num_threads(threads)
    pipe = AutoPipelineForText2Image.from_pretrained(model, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def generate(pipe, items: list[Item], width: int, height: int, steps: int = STEPS,
             guidance: float = GUIDANCE, negatives: list[str] | None = None) -> np.ndarray:
    """uint8 (N, height, width, 3): the service's way of making one batch (`negatives`: each
    item's negative prompt, e.g. the policy's steering; none by default)."""
    import torch

    generators = [torch.Generator(device="cpu").manual_seed(it.seed) for it in items]
    with torch.inference_mode():
        out = pipe(prompt=[it.prompt for it in items], negative_prompt=negatives or ["" for _ in items], width=width,
                   height=height, num_inference_steps=steps, guidance_scale=guidance, generator=generators,
                   output_type="pil")
    return np.stack([np.asarray(im.convert("RGB")) for im in out.images])


def chunk_path(root: Path, split: str, width: int, height: int, chunk: int) -> Path:
    return root / split / f"{width}x{height}" / f"{chunk:05d}.npz"


def make_chunk(pipe, root: Path, split: str, width: int, height: int, chunk: int, steps: int = STEPS,
               guidance: float = GUIDANCE, negative_of=None) -> Path:
    path = chunk_path(root, split, width, height, chunk)
    if path.exists():
        return path
    items = [item(split, width, height, i) for i in range(chunk * CHUNK, (chunk + 1) * CHUNK)]
    images = generate(pipe, items, width, height, steps, guidance, [negative_of(it) for it in items] if negative_of else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, images=images, prompts=np.array([it.prompt for it in items]),
                        labels=np.array(["|".join(it.labels) for it in items]),
                        groups=np.array([it.group for it in items]),
                        seeds=np.array([it.seed for it in items], np.int64))
    os.replace(tmp, path)
    return path


def load(root: Path, split: str, width: int, height: int, n: int) -> dict[str, np.ndarray]:
    """The first n items of a split at one size, as arrays; raises if chunks are missing."""
    parts = [np.load(chunk_path(root, split, width, height, c)) for c in range(-(-n // CHUNK))]
    return {k: np.concatenate([p[k] for p in parts])[:n] for k in ("images", "prompts", "labels", "groups", "seeds")}


def missing(root: Path, split: str, counts: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    return [(w, h, c) for w, h, n in counts for c in range(-(-n // CHUNK))
            if not chunk_path(root, split, w, h, c).exists()]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--split", required=True, choices=["train", "calib", "eval"])
    p.add_argument("--counts", required=True, help="WxH:N,... items per menu size (rounded up to chunks)")
    p.add_argument("--model", default="models/shapes-v1")
    p.add_argument("--max-minutes", type=float, default=60.0)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    root = Path(a.out)
    todo = missing(root, a.split, parse_counts(a.counts))
    print(f"{len(todo)} chunks of {CHUNK} to make", flush=True)
    if not todo:
        return
    pipe = load_pipeline(a.model, a.threads)
    started = time.monotonic()
    # Round-robin over sizes, so a stopped run leaves every size partly done rather than one empty.
    by_size: dict[tuple[int, int], list[int]] = {}
    for w, h, c in todo:
        by_size.setdefault((w, h), []).append(c)
    order = []
    while any(by_size.values()):
        for key in list(by_size):
            if by_size[key]:
                order.append((*key, by_size[key].pop(0)))
    for done, (w, h, c) in enumerate(order, 1):
        if time.monotonic() - started > a.max_minutes * 60:
            print(f"stopped after {a.max_minutes} min; rerun to resume", flush=True)
            return
        t = time.monotonic()
        make_chunk(pipe, root, a.split, w, h, c)
        print(f"{time.strftime('%H:%M:%S')} {a.split} {w}x{h} chunk {c} ({done}/{len(order)}) "
              f"{(time.monotonic() - t) / CHUNK:.3f} s/image", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
