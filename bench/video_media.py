"""What a delivered clip costs off the GPU: encoding and segmenting, bytes stored, the frame gate.

    .venv/bin/python bench/video_media.py [--clips 20] [--frames 16] [--size 64] [--stride 1,4]

Clips are procedural (a shape moving across a background, the motion module's training data),
so the figures do not depend on a trained model:

- encode-and-segment: CPU seconds per clip of `jobs.media.video.package` (the MP4, the poster, the
  sprite sheet and the two-rendition HLS ladder), the child ffmpeg's CPU included (it is what a
  cpu-pool host pays; none of it runs on the GPU worker), and its wall time;
- bytes stored per clip, by kind of file;
- the frame gate (`safety.frame_gate.judge_frames` with the shipped classifier) per clip at each
  stride, in milliseconds and per judged frame, and as a share of encoding.

Results: bench/results/video_media.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def clips(count: int, frames: int, size: int):
    import numpy as np

    from training.shapes_data import COLOURS, SampleGT, ShapeGT, render_frame

    kinds = ["circle", "square", "triangle"]
    colours = [c for c in COLOURS if c not in ("blue",)]
    rng = np.random.default_rng(0)
    for i in range(count):
        kind, colour = kinds[i % len(kinds)], colours[i % len(colours)]
        start, end = rng.uniform(0.25, 0.75, 2) * size
        yield [np.asarray(render_frame(SampleGT("blue", [ShapeGT(kind, colour, "large", start + (end - start) * t / frames,
                                                                 size / 2, size / 5)]), size, size))
               for t in range(frames)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clips", type=int, default=20)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--fps", type=int, default=8)
    parser.add_argument("--stride", default="1,4")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")
    os.environ.setdefault("IMAGEGEN_IMAGE_CLASSIFIER", f"shapes:{ROOT / 'models' / 'shapes-classifier-v2'}")
    import django

    django.setup()
    import numpy as np
    from PIL import Image

    from jobs.media import video
    from safety import frame_gate

    strides = [int(s) for s in args.stride.split(",")]
    data = list(clips(args.clips, args.frames, args.size))
    encode_cpu, encode_wall, sizes = [], [], {}
    for frames in data:
        arr = np.stack(frames)
        c0, w0 = cpu_seconds(), time.perf_counter()
        package = video.package(arr, args.fps)
        encode_cpu.append(cpu_seconds() - c0)
        encode_wall.append(time.perf_counter() - w0)
        for f in package.files:
            kind = "hls" if f.name.startswith("hls/") else f.name
            sizes.setdefault(kind, []).append(len(f.data))
    per_clip = {kind: sum(values) / len(data) for kind, values in sizes.items()}
    gate = {}
    images = [[Image.fromarray(f) for f in frames] for frames in data]
    frame_gate.judge_frames(images[0])  # the classifier loads once, outside the timing
    for stride in strides:
        took = []
        for clip in images:
            t0 = time.perf_counter()
            verdict = frame_gate.judge_frames(clip, stride=stride)
            took.append(time.perf_counter() - t0)
        judged = len(frame_gate.sampled(args.frames, stride))
        gate[str(stride)] = {"ms_per_clip": 1000 * statistics.median(took), "frames_judged": judged,
                             "ms_per_judged_frame": 1000 * statistics.median(took) / judged,
                             "share_of_encode_cpu": statistics.median(took) / statistics.median(encode_cpu),
                             "last_decision": verdict.decision}
    result = {
        "command": "python bench/video_media.py " + " ".join(sys.argv[1:]),
        "clips": args.clips, "frames": args.frames, "size": f"{args.size}x{args.size}", "fps": args.fps,
        "ladder": [{"name": r.name, "size": f"{args.size * r.scale}x{args.size * r.scale}", "kbps": r.bitrate_kbps}
                   for r in video.LADDER],
        "encode_cpu_seconds_p50": statistics.median(encode_cpu), "encode_wall_seconds_p50": statistics.median(encode_wall),
        "bytes_per_clip": {k: round(v) for k, v in per_clip.items()}, "bytes_per_clip_total": round(sum(per_clip.values())),
        "frame_gate": gate, "load_average_1m": os.getloadavg()[0],
    }
    out = ROOT / "bench" / "results" / "video_media.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"encode and segment: {result['encode_cpu_seconds_p50']:.3f} CPU s per clip (p50), "
          f"{result['encode_wall_seconds_p50']:.3f} s wall")
    print(f"bytes stored per clip: {result['bytes_per_clip_total']:,} ({result['bytes_per_clip']})")
    for stride, g in gate.items():
        print(f"frame gate, stride {stride}: {g['ms_per_clip']:.1f} ms per clip ({g['frames_judged']} frames, "
              f"{g['ms_per_judged_frame']:.2f} ms each), {100 * g['share_of_encode_cpu']:.1f}% of the encoding's CPU")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
