"""What a request-hash cache hit costs now that each job gets a file of its own
(jobs.media.cache.own_copies): the cached file read, decoded, encoded again with the job's own
parameters, signed with its own content credentials, written to quarantine and published (local
storage), per size and output format; CPU milliseconds of this process (time.process_time) and
wall milliseconds, median of --repeat runs on one thread.

    .venv/bin/python bench/cache_copy.py [--sizes 64 512] [--repeat 15]

Where it runs: a hit answered at once (the owner's own repeat, a global scope) in the web process
that answers the submit; a cross-user hit (k-anonymous scope) in its lane's GPU worker at its
reveal (jobs/actions/lifecycle.py reveal_start). Writes bench/results/cache_copy.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")
os.environ.setdefault("IMAGEGEN_VAR_DIR", tempfile.mkdtemp(prefix="cache-copy-"))


def picture(size: int, seed: int = 0):
    """A smooth gradient with noise: compresses as a generated image does, between flat and noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    base = np.stack([x * 255, y * 255, (1 - x) * 200 + 30], axis=-1)
    return Image.fromarray(np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8))


def job_like(size: int, output_format: str):
    return SimpleNamespace(
        id=uuid.uuid4(), prompt="a red circle on a blue background", negative_prompt="blurry", seed=7, steps=20,
        guidance_scale=5.0, width=size, height=size, model_version="bench", scheduler="", rewrite=False,
        rewriter_version="", revised_prompt="", rewritten_at=None, steering="", regenerates=None,
        output_format=output_format, output_compression=None, drawn_prompt="a red circle on a blue background")


def source_image(size: int):
    """A cached image as a fresh job leaves it: a signed PNG in public storage."""
    from jobs.media import credentials, encoding
    from jobs.media.storage import publish_object, store_quarantined

    job = job_like(size, "png")
    parameters = encoding.ImageParameters.of(job, 7)
    encoded, content_sha256 = credentials.credentialed(encoding.encode(picture(size), "png", None, parameters),
                                                       "png", parameters)
    stored = store_quarantined(encoded.data, encoded.extension)
    publish_object(stored.key)
    return SimpleNamespace(storage_key=stored.key, source_key="", job=job, width=size, height=size,
                           byte_size=stored.byte_size, sha256=stored.sha256, content_type=encoded.content_type,
                           content_sha256=content_sha256)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="+", type=int, default=[64, 512])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    import django

    django.setup()
    from jobs.media import cache

    rows = []
    for size in args.sizes:
        source = source_image(size)
        for fmt in ("png", "jpeg", "webp"):
            cpu, wall = [], []
            for n in range(args.repeat + 1):
                job = job_like(size, fmt)
                started_cpu, started = time.process_time(), time.perf_counter()
                copies = cache.own_copies(job, {0: source})
                cache.publish(copies)
                if n:  # the first run warms the signer and the codecs
                    cpu.append((time.process_time() - started_cpu) * 1000)
                    wall.append((time.perf_counter() - started) * 1000)
                cache.discard(copies)
            row = {"size": f"{size}x{size}", "source": "png", "format": fmt,
                   "cpu_ms_median": round(statistics.median(cpu), 2), "wall_ms_median": round(statistics.median(wall), 2),
                   "cpu_ms_max": round(max(cpu), 2), "source_bytes": source.byte_size}
            rows.append(row)
            print(f"{row['size']:>9} png -> {fmt:<4}  cpu {row['cpu_ms_median']:7.2f} ms  wall {row['wall_ms_median']:7.2f} ms")
    out = ROOT / "bench" / "results" / "cache_copy.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": "python bench/cache_copy.py " + " ".join(argv or sys.argv[1:]),
                               "cpu": os.cpu_count(), "repeat": args.repeat, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
