"""What content credentials (C2PA, jobs/media/credentials.py) cost per image file: the encoding alone,
the signing added to it (build the manifest, hash the file, sign, embed), the bytes added, and a
verification, per format and size, median of --repeat runs on one thread.

    .venv/bin/python bench/credentials_cost.py [--sizes 64 512 1024] [--repeat 15]

The signing runs on the GPU worker's encoder threads with the encoding (gpu_tasks/generate.py),
never on the denoising thread. Writes bench/results/credentials_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")
os.environ.setdefault("IMAGEGEN_VAR_DIR", tempfile.mkdtemp(prefix="credentials-cost-"))


def median_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 512, 1024])
    p.add_argument("--repeat", type=int, default=15)
    a = p.parse_args()
    import django

    django.setup()
    import numpy as np
    from PIL import Image

    from jobs.media import credentials, encoding

    rows = []
    for side in a.sizes:
        # A smooth picture with some texture, like a generated one (pure noise would not compress).
        y, x = np.mgrid[0:side, 0:side] / side
        rgb = np.stack([np.sin(6 * x) * 0.5 + 0.5, np.cos(4 * y) * 0.5 + 0.5, x * y], axis=-1)
        rgb += np.random.default_rng(0).normal(0, 0.02, rgb.shape)
        image = Image.fromarray((np.clip(rgb, 0, 1) * 255).astype(np.uint8))
        params = encoding.ImageParameters("a red circle on a blue background", "", 7, 20, 5.0, side, side, "shapes-v1",
                                          "00000000-0000-0000-0000-000000000000")
        for fmt in ("png", "jpeg", "webp"):
            encoded = encoding.encode(image, fmt, None, params)
            signed = credentials.sign(encoded.data, fmt, params)
            assert credentials.verify(signed).trusted
            row = {
                "format": fmt, "side": side,
                "encode_ms": round(median_ms(lambda i=image, f=fmt, p=params: encoding.encode(i, f, None, p), a.repeat), 2),
                "sign_ms": round(median_ms(lambda d=encoded.data, f=fmt, p=params: credentials.sign(d, f, p), a.repeat), 2),
                "verify_ms": round(median_ms(lambda s=signed: credentials.verify(s), a.repeat), 2),
                "bytes": len(encoded.data), "bytes_added": len(signed) - len(encoded.data),
            }
            rows.append(row)
            print(f"{side:5d} {fmt:5s} encode {row['encode_ms']:7.2f} ms  sign +{row['sign_ms']:6.2f} ms "
                  f"({row['sign_ms'] / row['encode_ms']:.0%} of encoding)  verify {row['verify_ms']:6.2f} ms  "
                  f"+{row['bytes_added']} bytes", flush=True)
    out = ROOT / "bench" / "results" / "credentials_cost.json"
    out.write_text(json.dumps({"command": "python bench/credentials_cost.py " + " ".join(sys.argv[1:]),
                               "load_average": os.getloadavg(), "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
