"""GPU benchmark: raw diffusers against the service's GPU worker, side by side in one run, on the
same pipeline and batch. On a CUDA host, from the repository root:

    .venv/bin/python bench/gpu.py --device cuda

(about 12 minutes on one H100 by estimate, most of it torch.compile; where one command may run
at most 10 minutes, run it as `--families sd15`, then `--families sdxl`: a run adds what it
measured to the results file of an earlier run on the same card.) In CI, on CPU, tiny pipelines
of the same families, in seconds: `.venv/bin/python bench/gpu.py --device cpu --tiny`.

Pipelines of real size are built from configs with random weights, offline (no download): an
SD 1.5-size UNet (block_out_channels 320/640/1280/1280, CLIP-L text encoder) at 512x512 and an
SDXL-size UNet (320/640/1280, transformer layers 1/2/10, CLIP-L + OpenCLIP-bigG) at 1024x1024,
fp16 on CUDA (fp32 on CPU), SDPA attention (diffusers' default processor), the tokenizer of
gpu_tasks/tiny_pipeline.py at CLIP's 77 positions. --tiny takes that module's tiny pipelines.
Each is written to disk and loaded by the worker's own loader (gpu_tasks.pipeline.get_model), the
deployment's default model and one extra served version, one lane each.

For each family, lever and batch size (1, 4, 8):

- raw diffusers: the loaded pipeline called as diffusers documents it (prompts, negative prompts,
  one seeded generator per row, no callback), back to back: seconds per pass, per step (the pass
  over its steps: text encoding and decoding included), images per GPU-second;
- the service: jobs of one image each admitted to the scheduler (actions.admit, as after the
  prompt check), then the lane's batch token run in this process (gpu_tasks.generate.Runner.run,
  what the Celery task gpu_tasks.tasks.run_batch calls): claim, denoise with progress events and
  a cancel check every step and gated previews every IMAGEGEN_PREVIEW_EVERY steps, the hand-off
  (encoding, content credentials, quarantine write, hand-off row) on its own threads. Seconds per step and images per GPU-second over the window from
  the first pass's start to the last pass's end (gaps between passes count); the duty cycle is
  the time inside the pipeline call over that window;
- the cost of previews: the same run with previews off (IMAGEGEN_PREVIEW_EVERY past the steps);
- the cost of the hand-off per image: encoding, credentials, the quarantine write, the hand-off
  transaction, and how long a denoised batch waited for the writer thread;
- the pixels: the service's stored images (read back from quarantine) against raw diffusers'
  for the same rows (prompt, the negative prompt as the worker passed it, the policy's steering
  included, and seed): the worker must not change the picture.

Levers: off, torch.compile (IMAGEGEN_COMPILE) and the first-block cache (IMAGEGEN_STEP_CACHE),
each applied by the worker's own apply_runtime_levers. One the worker refuses for a family (the
first-block cache for a UNet: diffusers has it for transformer pipelines only), or that fails
on the device, is reported with the reason. On CPU torch.compile is left out unless
--levers names it (minutes of compilation on a small machine). Timing: torch.cuda.synchronize()
around every pass on CUDA; wall time on CPU. Writes bench/results/gpu-<device>-<tiny|full>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LEVERS = {"off": {}, "compile": {"IMAGEGEN_COMPILE": True},
          "first-block": {"IMAGEGEN_STEP_CACHE": "first-block", "IMAGEGEN_STEP_CACHE_THRESHOLD": 0.05}}
SIZES = {"sd15": 512, "sdxl": 1024}
PREVIEWS_OFF = 10**9  # IMAGEGEN_PREVIEW_EVERY past any pass's steps


# --- pipelines of real size, from configs ------------------------------------------------------


def _tokenizer(folder: Path):
    """gpu_tasks/tiny_pipeline.py's word-level CLIP tokenizer, at CLIP's 77 positions."""
    from transformers import CLIPTokenizer

    from gpu_tasks.tiny_pipeline import build_tokenizer

    build_tokenizer(folder)  # writes vocab.json and merges.txt there
    return CLIPTokenizer(vocab_file=str(folder / "vocab.json"), merges_file=str(folder / "merges.txt"),
                         unk_token="<|endoftext|>", bos_token="<|startoftext|>", eos_token="<|endoftext|>",
                         pad_token="<|endoftext|>", model_max_length=77)


def _clip(hidden: int, layers: int, heads: int, act: str, projection: bool):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(vocab_size=49408, hidden_size=hidden, intermediate_size=hidden * 4, num_hidden_layers=layers,
                            num_attention_heads=heads, max_position_embeddings=77, hidden_act=act,
                            projection_dim=hidden, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config)


def _vae(scaling_factor: float, size: int):
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                         up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
                         layers_per_block=2, latent_channels=4, sample_size=size, scaling_factor=scaling_factor)


def build_full(family: str, tmp: Path):
    """A pipeline of the family's real size with random weights (its modules on the current
    default device; the scheduler's tables on the CPU, where diffusers keeps them)."""
    import torch
    from diffusers import (
        DDIMScheduler,
        EulerDiscreteScheduler,
        StableDiffusionPipeline,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )

    if family == "sd15":
        unet = UNet2DConditionModel(
            sample_size=64, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280, 1280),
            down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
            up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3, cross_attention_dim=768, attention_head_dim=8)
        with torch.device("cpu"):
            scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                      clip_sample=False, set_alpha_to_one=False, steps_offset=1)
        return StableDiffusionPipeline(vae=_vae(0.18215, 512), text_encoder=_clip(768, 12, 12, "quick_gelu", False),
                                       tokenizer=_tokenizer(tmp / "t1"), unet=unet, scheduler=scheduler,
                                       safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    unet = UNet2DConditionModel(
        sample_size=128, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), transformer_layers_per_block=(1, 2, 10),
        attention_head_dim=(5, 10, 20), use_linear_projection=True, cross_attention_dim=2048,
        addition_embed_type="text_time", addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816)
    with torch.device("cpu"):
        scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                           timestep_spacing="leading", steps_offset=1)
    return StableDiffusionXLPipeline(
        vae=_vae(0.13025, 1024), text_encoder=_clip(768, 12, 12, "quick_gelu", False),
        text_encoder_2=_clip(1280, 32, 20, "gelu", True), tokenizer=_tokenizer(tmp / "t1"),
        tokenizer_2=_tokenizer(tmp / "t2"), unet=unet, scheduler=scheduler, force_zeros_for_empty_prompt=True)


def write_pipeline(family: str, tiny: bool, device: str, out: Path) -> Path:
    """The family's pipeline on disk (kept: a second run with the same --pipelines reuses it)."""
    import torch

    if (out / "model_index.json").exists():
        return out
    if tiny:
        from gpu_tasks.tiny_pipeline import write_tiny_family

        return write_tiny_family(out, family)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp, torch.device(device):  # initialised on the card: seconds, not minutes
        pipe = build_full(family, Path(tmp))
        if device == "cuda":
            pipe.to(torch.float16)
        pipe.save_pretrained(out, safe_serialization=True)
    del pipe
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


# --- timing ---------------------------------------------------------------------------------


def clock(device: str) -> float:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
    return time.perf_counter()


class Costs:
    """Seconds spent in named calls, from any thread, while patched in."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds
            self.calls[name] = self.calls.get(name, 0) + 1

    def wrap(self, name: str, function):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - started)
        return timed


def raw_pass(model, rows, size: int, steps: int, guidance: float, device: str):
    """One raw diffusers call on the worker's pipeline: (seconds, images)."""
    import torch

    kwargs = {"prompt": [r.prompt for r in rows], "negative_prompt": [r.negative_prompt for r in rows],
              "width": size, "height": size, "num_inference_steps": steps, "guidance_scale": guidance,
              "generator": [torch.Generator(device="cpu").manual_seed(int(r.seed)) for r in rows], "output_type": "pil"}
    started = clock(device)
    with torch.inference_mode():
        images = model.pipe(**kwargs).images
    return clock(device) - started, images


# --- the service's path ------------------------------------------------------------------------


def admit_jobs(owner, version: str, size: int, steps: int, guidance: float, n: int, tag: str) -> list[str]:
    """n one-image jobs past the prompt check, in their shape's bucket (the service's own admit)."""
    from jobs import actions
    from jobs.models import GenerationJob

    ids = []
    for i in range(n):
        job = GenerationJob.objects.create(owner=owner, prompt=f"a red circle on a blue background {tag} {i}",
                                           width=size, height=size, steps=steps, guidance_scale=guidance, seed=7919 * i,
                                           count=1, progress_total=steps, model_version=version)
        if actions.admit(job.id) is None:
            raise RuntimeError(f"job {job.id} was not admitted")
        ids.append(str(job.id))
    return ids


def service_run(runner, model, owner, version: str, size: int, batch: int, passes: int, a, previews: bool) -> dict:
    """`passes` full batches through the worker's generate path; its figures."""
    from django.test import override_settings

    from jobs import actions
    from jobs.media import credentials, encoding
    from jobs.media import storage as media_storage
    from jobs.models import GenerationJob, JobStage

    costs, timed, handoffs = Costs(), [], []
    original_generate, original_hand_off = model.generate, runner._hand_off

    def timed_generate(rows, *args, **kwargs):
        started = clock(a.device)
        out = original_generate(rows, *args, **kwargs)
        timed.append((started, clock(a.device), list(rows)))
        return out

    def timed_hand_off(item):
        started = time.time()
        try:
            return original_hand_off(item)
        finally:
            handoffs.append((started - (item.pass_started + item.seconds), time.time() - started, len(item.rows)))

    ids = admit_jobs(owner, version, size, a.steps, a.guidance, passes * batch, f"b{batch} {'on' if previews else 'off'}")
    every = {} if previews else {"IMAGEGEN_PREVIEW_EVERY": PREVIEWS_OFF}
    with ExitStack() as stack:
        stack.enter_context(override_settings(IMAGEGEN_BATCH_CAP=batch, **every))
        stack.enter_context(mock.patch.object(model, "generate", timed_generate))
        stack.enter_context(mock.patch.object(model, "preview_images", costs.wrap("preview", model.preview_images)))
        stack.enter_context(mock.patch.object(runner, "_hand_off", timed_hand_off))
        for module, name, label in ((encoding, "encode", "encode"), (credentials, "credentialed", "credentials"),
                                    (media_storage, "store_quarantined", "store"), (actions, "hand_off", "handoff_db")):
            stack.enter_context(mock.patch.object(module, name, costs.wrap(label, getattr(module, name))))
        waiting = GenerationJob.objects.filter(id__in=ids, stage=JobStage.WAITING_GPU)
        while waiting.exists():
            if not runner.run():  # a batch token: back to back while there is work, at most TOKEN_BUDGET seconds
                raise RuntimeError(f"{waiting.count()} jobs wait for a GPU, but the scheduler gave the lane none")
        deadline = time.monotonic() + 600
        while len(handoffs) < len(timed) or GenerationJob.objects.filter(id__in=ids, stage=JobStage.GENERATE).exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the hand-off did not finish")
            time.sleep(0.01)
    done = GenerationJob.objects.filter(id__in=ids, stage=JobStage.CLASSIFY).count()
    if done != len(ids):
        bad = GenerationJob.objects.filter(id__in=ids).exclude(stage=JobStage.CLASSIFY).first()
        raise RuntimeError(f"{len(ids) - done} jobs did not reach classify: {bad.stage} {bad.reason}")
    window = timed[-1][1] - timed[0][0]
    inside = sum(end - start for start, end, _ in timed)
    images = sum(len(rows) for _, _, rows in timed)
    per_image = {k: costs.seconds.get(k, 0.0) / images for k in ("encode", "credentials", "store", "handoff_db")}
    return {
        "passes": len(timed), "batch_sizes": sorted({len(rows) for _, _, rows in timed}),
        "pass_seconds": inside / len(timed), "s_per_step": window / (len(timed) * a.steps),
        "images_per_gpu_second": images / window, "duty_cycle": inside / window,
        "gap_between_passes_seconds": (window - inside) / max(1, len(timed) - 1),
        "previews_per_pass": costs.calls.get("preview", 0) / len(timed),
        "preview_making_seconds_per_pass": costs.seconds.get("preview", 0.0) / len(timed),
        "handoff_s_per_image": {**per_image, "total": sum(h[1] for h in handoffs) / images},
        "handoff_queue_wait_seconds": sum(h[0] for h in handoffs) / len(handoffs),
        "first_rows": timed[0][2],
    }


def cancel_unfinished(version: str) -> None:
    """After a failed figure: its jobs still queued or running are cancelled, so the next
    figure's batches take only their own."""
    from jobs import actions
    from jobs.models import GenerationJob, JobStage

    for job in GenerationJob.objects.filter(model_version=version, stage__in=[JobStage.WAITING_GPU, JobStage.GENERATE]):
        actions.cancel_job(job, "the bench's figure failed")


def stored_pixels(rows):
    """The service's images of `rows`, read back from quarantine storage."""
    import numpy as np
    from PIL import Image

    from jobs.media.storage import quarantine_storage
    from jobs.models import GeneratedImage

    out = []
    for row in rows:
        image = GeneratedImage.objects.get(job_id=row.job_id, index=row.index)
        with quarantine_storage().open(image.storage_key) as fh:
            out.append(np.asarray(Image.open(fh).convert("RGB"), dtype=np.int16))
    return out


# --- one family -------------------------------------------------------------------------------


def lever_support(model, lever: str, device: str, asked: list[str]) -> str | None:
    """Why the lever is not measured here (None: it is)."""
    from django.test import override_settings

    from gpu_tasks import families

    if lever == "compile" and device == "cpu" and lever not in asked:
        return "skipped on CPU (minutes of inductor compilation on a small machine); --levers off,compile runs it"
    with override_settings(**LEVERS[lever]):
        problems = families.check(model.pipe, model.family)
    return "; ".join(problems) or None


def apply_lever(model, lever: str):
    """The lever on the loaded pipeline through the worker's own apply_runtime_levers; returns its undo."""
    from django.test import override_settings

    from gpu_tasks.pipeline import apply_runtime_levers

    name = model.family.denoiser
    original = getattr(model.pipe, name)
    with override_settings(**LEVERS[lever]):
        apply_runtime_levers(model.pipe, model.family)

    def undo() -> None:
        setattr(model.pipe, name, original)
        if lever == "first-block":
            original.disable_cache()
    return undo


def measure_batch(model, runner, owner, version: str, size: int, batch: int, a) -> dict:
    """One batch size: raw diffusers, the service with previews on and off, the pixels."""
    import numpy as np
    import torch

    from gpu_tasks.pipeline import Row

    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    warm = [Row("warm-up", i, f"warm up {i}", "", i) for i in range(batch)]
    warm_seconds, _ = raw_pass(model, warm, size, a.steps, a.guidance, a.device)  # compiles, allocates
    # Half the raw passes before the service's, half after: drift (a neighbour's load, the
    # card's clocks) falls on both alike.
    before = [raw_pass(model, warm, size, a.steps, a.guidance, a.device)[0] for _ in range(a.raw_passes // 2)]
    on = service_run(runner, model, owner, version, size, batch, a.passes, a, previews=True)
    off = service_run(runner, model, owner, version, size, batch, a.passes, a, previews=False)
    rows = on.pop("first_rows")
    off.pop("first_rows")
    # Raw diffusers is given the rows as the worker gave them to the pipeline (the policy's
    # steering in their negative prompts), so the pictures must be the same.
    after = [raw_pass(model, rows, size, a.steps, a.guidance, a.device) for _ in range(a.raw_passes - len(before))]
    seconds = statistics.median(before + [s for s, _ in after])
    ours = [np.asarray(im.convert("RGB"), dtype=np.int16) for im in after[-1][1]]
    diff = max(int(np.abs(x - y).max()) for x, y in zip(ours, stored_pixels(rows), strict=True))
    entry = {
        "raw": {"pass_seconds": seconds, "s_per_step": seconds / a.steps, "images_per_gpu_second": batch / seconds,
                "first_pass_seconds": warm_seconds},
        "service": on, "service_previews_off": off,
        "service_over_raw": on["images_per_gpu_second"] / (batch / seconds),
        "preview_cost_s_per_step": on["s_per_step"] - off["s_per_step"],
        "pixels": {"images": len(ours), "max_abs_diff": diff, "equal": diff == 0},
        "negative_prompt": rows[0].negative_prompt,
    }
    if a.device == "cuda":
        entry["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return entry


def measure_family(family: str, version: str, owner, a, asked_levers: list[str]) -> dict:
    from gpu_tasks.generate import runner_for
    from gpu_tasks.pipeline import get_model
    from scheduling.lanes import lane_of

    size = 64 if a.tiny else SIZES[family]
    model = get_model(version)  # the worker's loader, from disk
    runner = runner_for(lane_of(version))
    denoiser = getattr(model.pipe, model.family.denoiser)
    result: dict = {"size": f"{size}x{size}", "steps": a.steps, "guidance": a.guidance,
                    "dtype": str(denoiser.dtype).replace("torch.", ""),
                    "attention": sorted({type(p).__name__ for p in denoiser.attn_processors.values()}),
                    "denoiser_parameters": sum(p.numel() for p in denoiser.parameters()), "levers": {}}
    # The service's one-time costs (the image gate's classifier for previews, a content-credentials
    # signer per encoder thread) are paid here, not by the first figure.
    service_run(runner, model, owner, version, size, min(2, max(a.batches)), 1, a, previews=True)
    print(f"{family} at {size}x{size}, {result['denoiser_parameters'] / 1e6:.0f}M denoiser parameters, "
          f"{result['dtype']}, {result['attention']} (loaded and warmed up at {time.monotonic() - a.started:.0f}s)",
          flush=True)
    for lever in a.levers:
        why = lever_support(model, lever, a.device, asked_levers)
        if why is not None:
            result["levers"][lever] = {"unsupported": why}
            print(f"  {lever:12s} not measured: {why}", flush=True)
            continue
        undo = apply_lever(model, lever)
        by_batch: dict = {}
        try:
            for batch in a.batches:
                try:
                    by_batch[str(batch)] = measure_batch(model, runner, owner, version, size, batch, a)
                except Exception as exc:  # the device cannot run it (no compiler, out of memory): say so, go on
                    traceback.print_exc()
                    cancel_unfinished(version)
                    by_batch[str(batch)] = {"failed": f"on {a.device}: {type(exc).__name__}: {str(exc)[:300]}"}
                    print(f"  {lever:12s} batch {batch} failed {by_batch[str(batch)]['failed']}", flush=True)
                    break
                e, on = by_batch[str(batch)], by_batch[str(batch)]["service"]
                print(f"  {lever:12s} batch {batch}: raw {e['raw']['s_per_step'] * 1000:8.1f} ms/step "
                      f"{e['raw']['images_per_gpu_second']:7.2f} img/s | service {on['s_per_step'] * 1000:8.1f} "
                      f"ms/step {on['images_per_gpu_second']:7.2f} img/s duty {on['duty_cycle']:.3f} | previews "
                      f"{e['preview_cost_s_per_step'] * 1000:+.1f} ms/step | hand-off "
                      f"{on['handoff_s_per_image']['total'] * 1000:.0f} ms/image | pixels equal {e['pixels']['equal']}",
                      flush=True)
        finally:
            undo()
        result["levers"][lever] = by_batch
    return result


# --- the run ----------------------------------------------------------------------------------


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or platform.machine()
    return f"CPU: {cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def table(results: dict) -> str:
    lines = ["| family | lever | batch | raw ms/step | service ms/step | raw img/s | service img/s | service/raw | "
             "duty cycle | previews ms/step | hand-off ms/image | pixels equal |", "|---" * 12 + "|"]
    for family, r in results.items():
        for lever, by_batch in r["levers"].items():
            if "unsupported" in by_batch:
                lines.append(f"| {family} | {lever} | - | not measured: {by_batch['unsupported']} |")
                continue
            for batch, e in by_batch.items():
                if "failed" in e:
                    lines.append(f"| {family} | {lever} | {batch} | failed {e['failed']} |")
                    continue
                s = e["service"]
                lines.append(
                    f"| {family} | {lever} | {batch} | {e['raw']['s_per_step'] * 1000:.1f} | {s['s_per_step'] * 1000:.1f} | "
                    f"{e['raw']['images_per_gpu_second']:.2f} | {s['images_per_gpu_second']:.2f} | "
                    f"{e['service_over_raw']:.3f} | {s['duty_cycle']:.3f} | {e['preview_cost_s_per_step'] * 1000:+.1f} | "
                    f"{s['handoff_s_per_image']['total'] * 1000:.1f} | {e['pixels']['equal']} |")
    return "\n".join(lines)


def merge_earlier(report: dict, out: Path) -> None:
    """Keep what an earlier run on the same device, with the same pass settings, measured and
    this one did not (a GPU host runs one family, or one lever, per command)."""
    same = ("device", "tiny", "batches", "steps", "service_passes", "raw_passes")
    try:
        earlier = json.loads(out.read_text())
    except (OSError, ValueError):
        return
    if any(earlier.get(k) != report[k] for k in same):
        return
    for family, measured in earlier.get("families", {}).items():
        mine = report["families"].setdefault(family, measured)
        for lever, figures in measured.get("levers", {}).items():
            mine["levers"].setdefault(lever, figures)
    report["earlier_commands"] = earlier.get("earlier_commands", []) + [earlier.get("command")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny pipelines of the same families (CI, CPU)")
    p.add_argument("--families", default="sd15,sdxl")
    p.add_argument("--batches", default="1,4,8")
    p.add_argument("--levers", default="", help="of off,compile,first-block (default: all)")
    p.add_argument("--steps", type=int, default=0, help="steps per pass (default 20; 5 with --tiny)")
    p.add_argument("--passes", type=int, default=0, help="service passes per figure (default 2)")
    p.add_argument("--raw-passes", type=int, default=0, help="timed raw passes per figure (default 2)")
    p.add_argument("--guidance", type=float, default=5.0)
    p.add_argument("--pipelines", default="", help="folder to keep the written pipelines in and reuse (default: temporary)")
    p.add_argument("--out", default="", help="results file (default bench/results/gpu-<device>-<tiny|full>.json)")
    a = p.parse_args()
    a.steps = a.steps or (5 if a.tiny else 20)
    a.passes = max(2, a.passes or 2)
    a.raw_passes = max(1, a.raw_passes or 2)
    a.batches = [int(b) for b in a.batches.split(",") if b]
    families = [f for f in a.families.split(",") if f]
    asked_levers = [lever for lever in a.levers.split(",") if lever]
    a.levers = asked_levers or list(LEVERS)
    unknown = [x for x in families if x not in SIZES] + [x for x in a.levers if x not in LEVERS]
    if unknown:
        p.error(f"unknown {', '.join(unknown)} (families: {', '.join(SIZES)}; levers: {', '.join(LEVERS)})")
    import diffusers
    import torch
    import transformers

    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here (use --device cpu --tiny)")
    started = a.started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="imagegen-bench-gpu-"))
    pipelines = Path(a.pipelines) if a.pipelines else scratch / "pipelines"
    paths = {f: write_pipeline(f, a.tiny, a.device, pipelines / f"{f}-{'tiny' if a.tiny else 'full'}") for f in families}
    print(f"pipelines ready in {time.monotonic() - started:.0f}s", flush=True)
    versions = {f: f"bench-{f}" for f in families}
    from scripts.stack import Stack

    sizes = sorted({64 if a.tiny else SIZES[f] for f in families})
    os.environ.pop("CELERY_BROKER_URL", None)
    # A stack of its own (a private Redis, a SQLite file), whatever the environment names: the
    # bench's batch tokens and buckets never meet another stack's workers.
    stack = Stack(
        REDIS_URL="", DATABASE_URL="", IMAGEGEN_ACCELERATOR="real", IMAGEGEN_MODEL_NAME="bench",
        IMAGEGEN_MODEL_PATH=str(paths[families[0]]), IMAGEGEN_MODEL_VERSION=versions[families[0]],
        IMAGEGEN_EXTRA_MODELS=",".join(f"{versions[f]}={paths[f]}" for f in families[1:]) or "none",
        IMAGEGEN_REWRITER_PATH="", IMAGEGEN_SIZE_MENU=",".join(f"{s}x{s}" for s in sizes),
        IMAGEGEN_DEVICE=a.device, IMAGEGEN_DTYPE="float16" if a.device == "cuda" else "float32",
        IMAGEGEN_CACHE_ENABLED="false", IMAGEGEN_WARM_UP="false", IMAGEGEN_LEASE_SECONDS="120",
    )
    try:
        stack.apply_to_this_process()
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        print(f"database ready at {time.monotonic() - started:.0f}s", flush=True)
        owner, _ = get_user_model().objects.get_or_create(username="bench-gpu")
        results = {f: measure_family(f, versions[f], owner, a, asked_levers) for f in families}
    finally:
        from gpu_tasks.generate import close_runners

        close_runners()
        stack.close()
        shutil.rmtree(stack.var, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
        if not a.pipelines:
            shutil.rmtree(pipelines, ignore_errors=True)
    out = Path(a.out) if a.out else ROOT / "bench" / "results" / f"gpu-{a.device}-{'tiny' if a.tiny else 'full'}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    from django.conf import settings

    report: dict = {
        "command": "python bench/gpu.py " + " ".join(sys.argv[1:]), "device": device_name(a.device),
        "torch": torch.__version__, "diffusers": diffusers.__version__, "tiny": a.tiny,
        "batches": a.batches, "steps": a.steps, "service_passes": a.passes, "raw_passes": a.raw_passes,
        "preview_every": settings.IMAGEGEN_PREVIEW_EVERY, "preview_min_interval": settings.IMAGEGEN_PREVIEW_MIN_INTERVAL,
        "encode_threads": settings.IMAGEGEN_ENCODE_THREADS, "seconds": time.monotonic() - started, "families": results,
    }
    merge_earlier(report, out)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(table(report["families"]))
    print(f"wrote {out} in {report['seconds']:.0f}s on {report['device']}")


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")
    main()
