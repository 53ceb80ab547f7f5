"""What each output format costs the GPU worker's hand-off: seconds to encode one image (with its
parameters inside) and the bytes it makes, per size, on this machine's CPU.

    .venv/bin/python bench/encode_formats.py [--sizes 512,1024] [--repeat 5]

Writes bench/results/encode_formats.json. The picture is a smooth gradient with noise (a
generated image compresses somewhere between flat colour and pure noise).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")
os.environ.setdefault("IMAGEGEN_VAR_DIR", str(ROOT / "var"))


def picture(size: int, seed: int = 0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    base = np.stack([x * 255, y * 255, (1 - x) * 200 + 30], axis=-1)
    noisy = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(noisy)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="512,1024")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    import django

    django.setup()
    from jobs.media.encoding import ImageParameters, encode

    params = ImageParameters("a red circle on a blue background", "blurry", 7, 30, 5.0, 0, 0, "bench", "job")
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        image = picture(size)
        for fmt, compression in (("png", None), ("jpeg", 100), ("jpeg", 85), ("webp", 100), ("webp", 85)):
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                encoded = encode(image, fmt, compression, params)
                times.append(time.perf_counter() - started)
            row = {"size": f"{size}x{size}", "format": fmt, "compression": compression,
                   "seconds_median": round(sorted(times)[len(times) // 2], 4), "bytes": len(encoded.data)}
            rows.append(row)
            print(f"{row['size']:>9} {fmt:>4} q={compression!s:>4}  {row['seconds_median'] * 1000:7.1f} ms  {row['bytes']:>9} bytes")
    out = ROOT / "bench" / "results" / "encode_formats.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": "python bench/encode_formats.py " + " ".join(argv or sys.argv[1:]),
                               "rows": rows}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
