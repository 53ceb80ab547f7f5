"""What a video costs against an image, and how soon one plays, on the shipped video model.

    .venv/bin/python bench/video_cost.py [--steps 20] [--batches 1,4] [--repeats 3] [--service 6]

Side by side in one process, on the same device and threads (the accelerator's seconds: "GPU-
seconds" on a GPU host, CPU seconds here):

- generation: seconds per pass of `b` images of shapes-v2 (gpu_tasks.pipeline.LoadedModel) and of
  `b` clips of shapes-v2-motion (gpu_tasks.video_model.VideoModel: shapes-v2's UNet with a motion
  module, 16 frames), 64x64, the same steps; per output and per frame, and the ratio clip / image
  (the design's claim: cost grows with the frame count);
- the frame gate (safety.frame_gate.judge_frames with the shipped classifier, every frame) per
  clip, as a share of the clip's generation;
- packaging off the GPU worker (the publish stage: jobs.media.video.package and the MP4's content
  credentials), CPU seconds per clip, the child ffmpeg's included; bytes stored per clip.

With `--service N`: `scripts/run.py` (what `make run` runs: SQLite, its own Redis, every worker)
on a fresh var folder, then N video jobs submitted one after another through the API; submit to
playable (the job done and its MP4 and playlist fetched by their URLs) p50 and max.

Writes bench/results/video_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")
os.environ.setdefault("IMAGEGEN_VAR_DIR", tempfile.mkdtemp(prefix="video-cost-"))

CAPTIONS = ["a red circle moving left to right on a blue background", "a yellow square bouncing on a black background",
            "a green triangle spinning on a white background", "a blue circle growing on a yellow background"]


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(fn, repeats: int) -> tuple[float, object]:
    """The median wall seconds of `repeats` calls (after one warm-up call), and the last result."""
    out = fn()
    walls = []
    for _ in range(repeats):
        started = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - started)
    return statistics.median(walls), out


def in_process(args) -> dict:
    import django

    django.setup()
    import numpy as np
    from django.conf import settings
    from PIL import Image

    from gpu_tasks.pipeline import LoadedModel
    from gpu_tasks.rows import Row
    from gpu_tasks.video_model import VideoModel
    from jobs.media import credentials, video
    from jobs.media.encoding import ImageParameters
    from safety import frame_gate

    image_model = LoadedModel(ROOT / "models" / "shapes-v2", settings.IMAGEGEN_DEVICE, "shapes-v2")
    clip_model = VideoModel(ROOT / "models" / "shapes-v2-motion", ROOT / "models" / "shapes-v2", 16, settings.IMAGEGEN_DEVICE)
    rows_out: list[dict] = []
    strips = []
    for b in [int(x) for x in args.batches.split(",")]:
        rows = [Row("bench", i, CAPTIONS[i % len(CAPTIONS)], "", 100 + i) for i in range(b)]
        image_s, _ = timed(lambda rows=rows: image_model.generate(rows, 64, 64, args.steps, 5.0), args.repeats)
        clip_s, made = timed(lambda rows=rows: clip_model.generate(rows, 64, 64, args.steps, 6.0), args.repeats)
        strips.extend(made)
        rows_out.append({"batch": b, "image_pass_s": round(image_s, 4), "clip_pass_s": round(clip_s, 4),
                         "s_per_image": round(image_s / b, 4), "s_per_clip": round(clip_s / b, 4),
                         "s_per_clip_frame": round(clip_s / b / 16, 4), "clip_over_image": round(clip_s / image_s, 2)})
        print(f"batch {b}: image pass {image_s:.3f} s, clip pass {clip_s:.3f} s, clip / image x{clip_s / image_s:.1f} "
              f"({clip_s / b / 16 * 1000:.1f} ms a frame, {image_s / b * 1000:.1f} ms an image)", flush=True)
    gate_ms, encode_cpu, encode_wall, sizes = [], [], [], []
    for strip in strips[:8]:
        frames = video.frames_of(strip, 16)
        pictures = [Image.fromarray(f) for f in frames]
        started = time.perf_counter()
        frame_gate.judge_frames(pictures, stride=1)
        gate_ms.append((time.perf_counter() - started) * 1000)
        cpu0, wall0 = cpu_seconds(), time.perf_counter()
        package = video.package(frames, 8)
        signed = credentials.sign(package.file("video.mp4").data, "mp4", ImageParameters(
            prompt=CAPTIONS[0], negative_prompt="", width=64, height=64, steps=args.steps, guidance_scale=6.0, seed=0,
            model_version="shapes-v2-motion", scheduler="", job_id="bench"))
        encode_cpu.append(cpu_seconds() - cpu0)
        encode_wall.append(time.perf_counter() - wall0)
        sizes.append(sum(len(f.data) for f in package.files) - len(package.file("video.mp4").data) + len(signed))
    per_clip = rows_out[-1]["s_per_clip"]
    gate = statistics.median(gate_ms)
    print(f"frame gate {gate:.1f} ms a clip ({gate / 1000 / per_clip:.1%} of its generation at batch "
          f"{rows_out[-1]['batch']}); packaging {statistics.median(encode_cpu):.3f} CPU s a clip; "
          f"{statistics.median(sizes) / 1024:.1f} KiB stored a clip", flush=True)
    del np
    return {"steps": args.steps, "size": "64x64", "frames": 16, "device": settings.IMAGEGEN_DEVICE,
            "torch_threads": settings.IMAGEGEN_TORCH_THREADS, "passes": rows_out,
            "frame_gate_ms_per_clip_p50": round(gate, 2),
            "frame_gate_share_of_generation": round(gate / 1000 / per_clip, 4),
            "package_cpu_s_per_clip_p50": round(statistics.median(encode_cpu), 4),
            "package_wall_s_per_clip_p50": round(statistics.median(encode_wall), 4),
            "bytes_stored_per_clip_p50": int(statistics.median(sizes))}


def service(n: int, steps: int) -> dict:
    """scripts/run.py on a fresh var folder; n video jobs one after another, submit to playable."""
    import httpx

    from bench.common import pct

    var = Path(tempfile.mkdtemp(prefix="video-cost-run-"))
    port = 18000 + os.getpid() % 1000
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "IMAGEGEN_VAR_DIR")}
    env.update(IMAGEGEN_VAR_DIR=str(var), PORT=str(port))
    log = open(var / "run.log", "ab")
    proc = subprocess.Popen([sys.executable, "scripts/run.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (var / "run-info.txt").exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"make run did not become ready; see {var / 'run.log'}")
            time.sleep(0.5)
        token = next(line.split()[-1] for line in (var / "run-info.txt").read_text().splitlines() if "API token" in line)
        base, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Token {token}"}
        seconds = []
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            for i in range(n):
                started = time.monotonic()
                answer = client.post("/api/v1/jobs", json={"prompt": CAPTIONS[i % len(CAPTIONS)], "frames": 16,
                                                           "steps": steps, "seed": 500 + i, "rewrite": "off"})
                answer.raise_for_status()
                job_id = answer.json()["id"]
                while True:
                    polled = client.get(f"/api/v1/jobs/{job_id}")
                    if polled.status_code == 429:  # the read rate limit: wait as told
                        time.sleep(float(polled.headers.get("Retry-After", "1")))
                        continue
                    polled.raise_for_status()
                    job = polled.json()
                    if job["status"] in ("done", "failed", "blocked", "cancelled", "review"):
                        break
                    if time.monotonic() - started > 300:
                        raise RuntimeError(f"job {job_id} not done after 300 s")
                    time.sleep(0.25)  # the poll interval of this client (under the read rate limit)
                if job["status"] != "done":
                    print(f"job {i}: {job['status']} ({job['reason']})", flush=True)
                    continue
                clip = job["videos"][0]
                assert client.get(clip["url"]).status_code == 200 and client.get(clip["playlist_url"]).status_code == 200
                seconds.append(time.monotonic() - started)
                print(f"job {i}: playable after {seconds[-1]:.2f} s", flush=True)
        return {"jobs": n, "playable": len(seconds), "steps": steps,
                "submit_to_playable_s_p50": round(pct(seconds, 0.5), 3) if seconds else None,
                "submit_to_playable_s_max": round(max(seconds), 3) if seconds else None}
    finally:
        from scripts.procs import stop_group

        stop_group(proc, 15)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batches", default="1,4")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--service", type=int, default=0, help="video jobs through scripts/run.py (0: none)")
    args = p.parse_args()
    out: dict = {"command": "python bench/video_cost.py " + " ".join(sys.argv[1:]), **in_process(args)}
    if args.service:
        out["service"] = service(args.service, args.steps)
        print(f"submit to playable p50 {out['service']['submit_to_playable_s_p50']} s", flush=True)
    path = ROOT / "bench" / "results" / "video_cost.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
