"""Distil the shipped teacher (models/shapes-v1, 20 DPM-Solver++ steps, guidance 6) into a few-step
latent consistency student (LCMScheduler, 1-8 steps, one UNet pass per step).

    python -m training.distill --teacher models/shapes-v1 --run var/distill-run --out models/shapes-v1-lcm

Re-running the same command resumes from <run>/state.pt. ``touch <run>/STOP`` makes a running
job save, export and exit; ``--export-only`` just exports the best checkpoint so far.

Method (reasons in docs/model.md, "The distilled student"):
  1. Teacher trajectories. For seeded captions from the procedural generator (TRAJ_SEED, disjoint
     from training seed 1234 and the evaluation seed) and seeded initial noise, the teacher is run
     exactly as it is served: 20 DPM-Solver++ steps with classifier-free guidance 6. The latent at
     each of the 20 timesteps and the final latent are kept (shards of --shard-size trajectories
     under <run>/traj/, each a pure function of its index, written atomically, reused on resume).
  2. Consistency regression. The student (the teacher's UNet plus a zero-initialised guidance
     embedding, ``time_cond_proj_dim``) learns the consistency function of the teacher's guided
     ODE: from any trajectory point x_t it predicts the trajectory's end point, through LCM's
     boundary parametrisation (c_skip * x_t + c_out * x0(v)). Because the teacher's whole
     trajectory is precomputed, the target is the teacher's own 20-step output rather than the
     bootstrapped one-step target of consistency distillation, so no teacher or target-network
     pass is needed per training step. Timesteps used by the 1/2/4/8-step LCM schedules are
     drawn more often. More shards are generated while training runs (one every --shard-every
     steps, up to --trajectories), so data grows with the step count, deterministically.
  3. EMA weights; every --ckpt-minutes the state is saved and the EMA student is validated
     (Validator: 1-step latent MSE against the teacher on held-out trajectories, and colour /
     background / kind accuracy of its 4-step images on held-out captions); the best one by the
     accuracies is kept and exported in diffusers' layout with an LCMScheduler.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from training.shapes_data import caption_for, random_gt
from training.train import replace_folder

TRAJ_SEED = 777_000          # captions + noise of the teacher trajectories (training used 1234)
VAL_SEED = 888_000           # held-out validation trajectories
TEACHER_STEPS = 20
GUIDANCE = 6.0
COND_DIM = 256               # guidance-embedding width (diffusers' LCM convention)
ORIGINAL_STEPS = 20          # LCMScheduler grid = the teacher's 20-step grid
STUDENT_STEPS = (1, 2, 4, 8)
DEFAULT_STUDENT_STEPS = 4


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- models
def load_teacher(path: str):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(path, local_files_only=True, safety_checker=None,
                                                   requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    for m in (pipe.unet, pipe.text_encoder, pipe.vae):
        m.float().eval().requires_grad_(False)
    return pipe


def make_student(teacher_unet):
    from diffusers import UNet2DConditionModel

    cfg = dict(teacher_unet.config)
    cfg["time_cond_proj_dim"] = COND_DIM
    student = UNet2DConditionModel.from_config(cfg)
    missing, unexpected = student.load_state_dict(teacher_unet.state_dict(), strict=False)
    assert not unexpected and missing == ["time_embedding.cond_proj.weight"], (missing, unexpected)
    torch.nn.init.zeros_(student.time_embedding.cond_proj.weight)   # starts as the teacher exactly
    return student.float()


def make_lcm_scheduler():
    from diffusers import LCMScheduler

    return LCMScheduler(num_train_timesteps=1000, beta_schedule="linear", beta_start=0.0001, beta_end=0.02,
                        prediction_type="v_prediction", original_inference_steps=ORIGINAL_STEPS,
                        timestep_scaling=10.0, set_alpha_to_one=True, steps_offset=1)


def guidance_embedding(n: int, w: float = GUIDANCE) -> torch.Tensor:
    """Same as StableDiffusionPipeline.get_guidance_scale_embedding(guidance_scale - 1)."""
    wt = torch.full((n,), float(w - 1)) * 1000.0
    half = COND_DIM // 2
    emb = math.log(10000.0) / (half - 1)
    emb = torch.exp(torch.arange(half, dtype=torch.float32) * -emb)
    emb = wt[:, None] * emb[None, :]
    return torch.cat([torch.sin(emb), torch.cos(emb)], dim=1)


# ----------------------------------------------------------------------------- trajectories
@dataclass(frozen=True)
class Mix:
    """What the teacher is shown besides captions in its grammar, and how it is steered.
    oov_share: the share of prompts outside the grammar (training/classifier_data.py TRAIN_OOV,
    disjoint from the evaluation's), so the student learns what the served teacher draws for a
    prompt it cannot read. steer: kinds the teacher is steered away from unless the caption names
    them, as the service steers a model that takes a negative prompt (safety/policy.json
    image.steer: "a star and a heart"); a student takes no negative prompt, so it has to learn it."""

    oov_share: float = 0.0
    steer: tuple[str, ...] = ()

    def negative(self, caption: str) -> str:
        from safety.image_policy import STEER_JOIN

        words = set(caption.split())
        return STEER_JOIN.join(f"a {kind}" for kind in self.steer if kind not in words and f"{kind}s" not in words)


def shard_captions(seed: int, index: int, n: int, mix: Mix = Mix()) -> list[str]:
    from training.classifier_data import TRAIN_OOV

    caps = []
    for i in range(n):
        rng = np.random.default_rng([seed, index, i])
        gt = random_gt(rng, p_two=0.25)
        caps.append(caption_for(gt, [bool(rng.random() >= 0.3) for _ in gt.shapes]))
        if mix.oov_share and np.random.default_rng([seed, index, i, 1]).random() < mix.oov_share:
            caps[-1] = TRAIN_OOV[int(np.random.default_rng([seed, index, i, 2]).integers(len(TRAIN_OOV)))]
    return caps


@torch.no_grad()
def teacher_trajectories(teacher, captions: list[str], seed: int, batch: int = 128, mix: Mix = Mix()) -> dict:
    """Run the teacher as served (20 DPM-Solver++ steps, CFG 6, steered as `mix` says) and keep
    every step's latent."""
    from diffusers import DPMSolverMultistepScheduler

    xs, x0s, encs = [], [], []
    for s in range(0, len(captions), batch):
        caps = captions[s:s + batch]
        negatives = [mix.negative(c) for c in caps] if mix.steer else None
        cond, uncond = teacher.encode_prompt(caps, "cpu", 1, True, negative_prompt=negatives)
        sched = DPMSolverMultistepScheduler.from_config(teacher.scheduler.config)
        sched.set_timesteps(TEACHER_STEPS)
        g = torch.Generator().manual_seed(seed * 1000 + s)
        x = torch.randn((len(caps), 4, 16, 16), generator=g) * sched.init_noise_sigma
        traj = []
        for t in sched.timesteps:
            traj.append(x.half())
            inp = sched.scale_model_input(torch.cat([x, x]), t)
            v = teacher.unet(inp, t, encoder_hidden_states=torch.cat([uncond, cond])).sample
            vu, vc = v.chunk(2)
            x = sched.step(vu + GUIDANCE * (vc - vu), t, x).prev_sample
        xs.append(torch.stack(traj, 1))
        x0s.append(x.half())
        encs.append(cond.half())
    return {"xt": torch.cat(xs), "x0": torch.cat(x0s), "enc": torch.cat(encs), "captions": captions,
            "teacher_timesteps": [int(t) for t in sched.timesteps]}


def get_shard(run: Path, teacher, kind: str, index: int, size: int, mix: Mix = Mix()) -> dict:
    path = run / "traj" / f"{kind}_{index:03d}.pt"
    if path.exists():
        return torch.load(path, weights_only=False)
    seed = (TRAJ_SEED if kind == "train" else VAL_SEED) + index
    t = time.time()
    d = teacher_trajectories(teacher, shard_captions(seed, index, size, mix), seed, mix=mix)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save(d, path)
    log(f"generated {kind} shard {index} ({size} teacher trajectories) in {time.time() - t:.0f}s")
    return d


class Data:
    def __init__(self):
        self.xt: list[torch.Tensor] = []
        self.x0: list[torch.Tensor] = []
        self.enc: list[torch.Tensor] = []
        self.cat = None

    def add(self, d: dict) -> None:
        self.xt.append(d["xt"])
        self.x0.append(d["x0"])
        self.enc.append(d["enc"])
        self.cat = (torch.cat(self.xt), torch.cat(self.x0), torch.cat(self.enc))

    def __len__(self) -> int:
        return 0 if self.cat is None else len(self.cat[1])


# ----------------------------------------------------------------------------- student maths
def boundary(sched, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c_skip, c_out = sched.get_scalings_for_boundary_condition_discrete(t.float())
    return c_skip.view(-1, 1, 1, 1), c_out.view(-1, 1, 1, 1)


def consistency(student, sched, xt: torch.Tensor, t: torch.Tensor, enc: torch.Tensor) -> torch.Tensor:
    """The student's consistency function f(x_t, t): LCMScheduler.step's ``denoised``."""
    acp = sched.alphas_cumprod[t].view(-1, 1, 1, 1)
    v = student(xt, t, encoder_hidden_states=enc, timestep_cond=guidance_embedding(len(xt))).sample
    x0 = acp.sqrt() * xt - (1 - acp).sqrt() * v
    c_skip, c_out = boundary(sched, t)
    return c_skip * xt + c_out * x0


@torch.no_grad()
def student_sample(student, enc: torch.Tensor, steps: int, seed: int, x_init: torch.Tensor) -> torch.Tensor:
    """Multi-step LCM sampling as the pipeline does it (same scheduler, seeded re-noising)."""
    sched = make_lcm_scheduler()
    sched.set_timesteps(steps)
    g = torch.Generator().manual_seed(seed)
    x = x_init.clone()
    den = x
    for t in sched.timesteps:
        v = student(x, t, encoder_hidden_states=enc, timestep_cond=guidance_embedding(len(x))).sample
        out = sched.step(v, t, x, generator=g)
        x, den = out.prev_sample, out.denoised
    return den


def judge_captions(seed: int, n: int) -> tuple[list[str], list]:
    """Held-out single-shape captions (and ground truths) for the checkpoint choice."""
    caps, gts = [], []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        gt = random_gt(rng, n_shapes=1)
        caps.append(caption_for(gt, bool(rng.random() >= 0.3)))
        gts.append(gt)
    return caps, gts


class Validator:
    """Latent MSE of the 1-step student against the teacher's 20-step end point on held-out
    trajectories (a paired figure: same noise, one deterministic jump), and, for the multi-step
    samples (LCM re-noises with fresh noise, so they are not paired with the teacher's), the share
    of held-out single-shape captions whose 4-step image has the caption's colour, background and
    kind (pixel statistics and shapes-classifier-v1, as bench/model_eval.py judges)."""

    def __init__(self, teacher, val: dict, n_judge: int):
        from safety.shapes_classifier import ShapesClassifier

        self.val, self.vae = val, teacher.vae
        root = Path(__file__).resolve().parents[1]
        self.clf = ShapesClassifier.from_pretrained(root / "models" / "shapes-classifier-v1")
        caps, self.gts = judge_captions(VAL_SEED + 1, n_judge)
        with torch.no_grad():
            self.enc = teacher.encode_prompt(caps, "cpu", 1, False)[0]
        self.noise = torch.randn((n_judge, 4, 16, 16), generator=torch.Generator().manual_seed(VAL_SEED + 1))

    @torch.no_grad()
    def __call__(self, student) -> dict:
        from PIL import Image

        from bench.model_eval import judge_colours

        student.eval()
        v = self.val
        res = {"val_mse_1step": round(float(F.mse_loss(
            student_sample(student, v["enc"].float(), 1, VAL_SEED, v["xt"][:, 0].float()), v["x0"].float())), 5)}
        lat = student_sample(student, self.enc, DEFAULT_STUDENT_STEPS, VAL_SEED + 2, self.noise)
        px = self.vae.decode(lat / self.vae.config.scaling_factor).sample
        u8 = ((px.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
        images = [Image.fromarray(a) for a in u8]
        kinds = [max(sc, key=sc.get) for sc in self.clf.scores(images)]
        judged = [judge_colours(a) for a in u8]
        n = len(images)
        res["val4_colour"] = round(sum(fg == gt.shapes[0].colour for (fg, _), gt in zip(judged, self.gts, strict=True)) / n, 4)
        res["val4_background"] = round(sum(bg == gt.background for (_, bg), gt in zip(judged, self.gts, strict=True)) / n, 4)
        res["val4_kind"] = round(sum(k == gt.shapes[0].kind for k, gt in zip(kinds, self.gts, strict=True)) / n, 4)
        res["val4_score"] = round((res["val4_colour"] + res["val4_background"] + 2 * res["val4_kind"]) / 4, 4)
        student.train()
        return res


# ----------------------------------------------------------------------------- export
def export(teacher_path: str, teacher, student_sd: dict, out: Path, info: dict) -> None:
    from diffusers import StableDiffusionPipeline

    student = make_student(teacher.unet)
    student.load_state_dict(student_sd)
    pipe = StableDiffusionPipeline(
        vae=teacher.vae.half(), text_encoder=teacher.text_encoder.float(), tokenizer=teacher.tokenizer,
        unet=student.half(), scheduler=make_lcm_scheduler(), safety_checker=None, feature_extractor=None,
        requires_safety_checker=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    pipe.save_pretrained(tmp, safe_serialization=True)
    teacher.vae.float()
    # the VAE is the teacher's, unchanged, so its preview map is too
    shutil.copy(Path(teacher_path) / "preview_decoder.json", tmp / "preview_decoder.json")
    (tmp / "training_info.json").write_text(json.dumps(info, indent=1))
    replace_folder(tmp, out)
    for d, _, files in os.walk(out):                   # mkdtemp made it private
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    log(f"exported student (step {info['student_step']}) -> {out}")


# ----------------------------------------------------------------------------- main
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", default="models/shapes-v1")
    p.add_argument("--run", default="var/distill-run", help="resumable state, trajectories, log")
    p.add_argument("--out", default="models/shapes-v1-lcm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="1: on a shared, oversubscribed CPU two threads ran ~10x slower than one")
    p.add_argument("--steps", type=int, default=8000, help="student optimiser steps in all")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--ema", type=float, default=0.998)
    p.add_argument("--shard-size", type=int, default=128)
    p.add_argument("--initial-shards", type=int, default=4)
    p.add_argument("--shard-every", type=int, default=60, help="one more shard every N steps")
    p.add_argument("--trajectories", type=int, default=1536, help="train trajectories in all")
    p.add_argument("--val-size", type=int, default=64)
    p.add_argument("--judge-size", type=int, default=96, help="held-out captions judged per checkpoint")
    p.add_argument("--p-schedule", type=float, default=0.7,
                   help="share of samples at timesteps of the 1/2/4/8-step LCM schedules")
    p.add_argument("--ckpt-minutes", type=float, default=5.0)
    p.add_argument("--oov-share", type=float, default=0.0,
                   help="share of teacher prompts outside the caption grammar (Mix; 0: captions only)")
    p.add_argument("--steer", default="", help="kinds the teacher is steered away from unless asked, e.g. "
                   "star,heart (Mix; as the service steers the teacher; default: none)")
    p.add_argument("--export-only", action="store_true")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    run = Path(args.run)
    run.mkdir(parents=True, exist_ok=True)
    command = "python -m training.distill " + " ".join(a for a in (argv if argv is not None else sys.argv[1:])
                                                       if a != "--export-only")
    teacher = load_teacher(args.teacher)
    lcm = make_lcm_scheduler()
    lcm.set_timesteps(ORIGINAL_STEPS)
    grid = lcm.timesteps.clone()                       # student timestep of each trajectory point
    used = set()
    for n in STUDENT_STEPS:
        lcm.set_timesteps(n)
        used |= set(lcm.timesteps.tolist())
    used_idx = np.array([j for j, t in enumerate(grid.tolist()) if t in used])

    student = make_student(teacher.unet)
    ema = make_student(teacher.unet).eval().requires_grad_(False)
    opt = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=0.0)
    warm = 100
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    rng = np.random.default_rng(args.seed)
    state_path, best_path, log_path = run / "state.pt", run / "best.pt", run / "log.jsonl"
    step, wall_before, best = 0, 0.0, None
    if state_path.exists():
        st = torch.load(state_path, weights_only=False)
        student.load_state_dict(st["student"])
        ema.load_state_dict(st["ema"])
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        rng.bit_generator.state = st["np_rng"]
        step, wall_before, best = st["step"], st["wall_s"], st.get("best")
        log(f"resumed from step {step} ({wall_before / 60:.1f} min trained before)")

    def info(best_rec):
        return {"method": "latent consistency distillation on precomputed teacher trajectories (LCMScheduler)",
                "teacher": args.teacher, "teacher_steps": TEACHER_STEPS, "teacher_scheduler": "DPMSolverMultistepScheduler",
                "guidance_scale_distilled": GUIDANCE, "time_cond_proj_dim": COND_DIM,
                "original_inference_steps": ORIGINAL_STEPS, "student_step": best_rec["step"],
                "steps_run": step, "train_wall_s": round(wall_before, 1), "val": best_rec,
                "trajectories": shards_for(step) * args.shard_size, "traj_seed": TRAJ_SEED, "val_seed": VAL_SEED,
                "default_inference_steps": DEFAULT_STUDENT_STEPS, "default_guidance_scale": GUIDANCE,
                "command": command, "args": vars(args), "threads": args.threads}

    mix = Mix(args.oov_share, tuple(k for k in args.steer.split(",") if k))
    val = get_shard(run, teacher, "val", 0, args.val_size, mix)
    validate = Validator(teacher, val, args.judge_size)
    data = Data()
    n_target = max(1, args.trajectories // args.shard_size)

    def shards_for(s):
        return min(n_target, args.initial_shards + s // args.shard_every)

    def better(rec, old) -> bool:
        """Higher accuracy score wins; within one judged caption's worth (the score moves by
        0.5 / judge_size for one caption's kind) it is noise, and the lower paired 1-step MSE wins."""
        if old is None or "val4_score" not in old:
            return True
        tol = 0.5 / args.judge_size + 1e-9
        if abs(rec["val4_score"] - old["val4_score"]) <= tol:
            return rec["val_mse_1step"] < old["val_mse_1step"]
        return rec["val4_score"] > old["val4_score"]

    if args.export_only:
        if best is None or not best_path.exists():
            sys.exit(f"no checkpoint in {run} yet")
        recs = [json.loads(line) for line in log_path.read_text().splitlines()]
        last = recs[-1] if recs else None
        if last is not None and last["step"] == step and last["step"] != best["step"] and better(last, best):
            # the latest state beats the kept one under the current rule (a rule changed after a run)
            best = last
            atomic_save(ema.state_dict(), best_path)
            st = torch.load(state_path, weights_only=False)
            st["best"] = best
            atomic_save(st, state_path)
            log(f"latest checkpoint (step {step}) replaces the kept one")
        export(args.teacher, teacher, torch.load(best_path, weights_only=False), Path(args.out), info(best))
        return

    def checkpoint():
        nonlocal best, wall_before, t_mark
        wall_before += time.time() - t_mark
        t_mark = time.time()
        rec = {"step": step, "wall_s": round(wall_before, 1), "loss_avg": round(loss_avg or 0.0, 5),
               "trajectories": len(data), **validate(ema)}
        if better(rec, best):
            best = rec
            atomic_save(ema.state_dict(), best_path)
        atomic_save({"student": student.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
                     "sched": sched.state_dict(), "np_rng": rng.bit_generator.state, "step": step,
                     "wall_s": wall_before, "best": best}, state_path)
        with log_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        log(f"checkpoint step {step}: {rec} (best at step {best['step']})")
        t_mark = time.time()

    t_mark = time.time()
    loss_avg = None
    if step == 0 and not log_path.exists():
        for k in range(shards_for(0)):
            data.add(get_shard(run, teacher, "train", k, args.shard_size, mix))
        checkpoint()                                   # step 0 = the teacher used as a one/few-step model
    last_ckpt = time.time()
    student.train()
    stop = run / "STOP"
    t0, s0 = time.time(), step
    while step < args.steps and not stop.exists():
        while len(data.xt) < shards_for(step):
            data.add(get_shard(run, teacher, "train", len(data.xt), args.shard_size, mix))
        xt_all, x0_all, enc_all = data.cat
        i = rng.integers(len(x0_all), size=args.batch)
        sched_pick = rng.random(args.batch) < args.p_schedule
        j = np.where(sched_pick, used_idx[rng.integers(len(used_idx), size=args.batch)],
                     rng.integers(len(grid), size=args.batch))
        it, jt = torch.from_numpy(i), torch.from_numpy(j)
        xt, x0, enc = xt_all[it, jt].float(), x0_all[it].float(), enc_all[it].float()
        t = grid[jt]
        pred = consistency(student, lcm, xt, t, enc)
        loss = F.mse_loss(pred, x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        sched.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for ps, pe in zip(student.parameters(), ema.parameters(), strict=True):
                pe.mul_(decay).add_(ps.detach(), alpha=1 - decay)
        step += 1
        loss_avg = loss.item() if loss_avg is None else 0.98 * loss_avg + 0.02 * loss.item()
        if step % 25 == 0:
            log(f"step {step}/{args.steps} loss {loss.item():.5f} avg {loss_avg:.5f} "
                f"{(time.time() - t0) / (step - s0):.3f}s/step trajectories {len(data)}")
        if time.time() - last_ckpt > 60 * args.ckpt_minutes:
            checkpoint()
            last_ckpt = time.time()
    if step > s0 or best is None:
        checkpoint()
    if stop.exists():
        log(f"{stop} found: stopped at step {step}")
    export(args.teacher, teacher, torch.load(best_path, weights_only=False), Path(args.out), info(best))


if __name__ == "__main__":
    main()
