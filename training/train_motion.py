"""Train a motion module for shapes-v2 the AnimateDiff way (issue 47): the image model frozen.

    nice -n 15 .venv/bin/python -m training.train_motion --threads 1 --max-minutes 90 --resume \
        > var/motion_train.log 2>&1 &

What is trained, on clips of training/motion_data.py (16 frames, 64x64):
  * a diffusers ``MotionAdapter`` sized for shapes-v2's UNet (block_out_channels 64/128/192, one
    motion layer per block as the UNet has one resnet per block, a mid-block module, 4 heads,
    sinusoidal positions up to 32 frames), inserted with ``UNetMotionModel.from_unet2d``; the
    temporal attention's output projections start at zero, so step 0 is the image model frame by frame;
  * the embeddings of the motion words only ("moving", "left", "to", "right", "up", "down",
    "bouncing", "spinning", "growing", "shrinking"): shapes-v2's tokenizer knows none of them, so
    its word-level tokenizer is rebuilt with them added and its text encoder gets one new row each;
    every other weight of the text encoder is shapes-v2's, so an image caption encodes as before.
The image UNet, the VAE and the rest of the text encoder are frozen. Loss: shapes-v2's own
(v-prediction, DDPM linear betas, min-SNR-5 weighting), one timestep per clip, fresh noise per frame;
10% empty captions keep classifier-free guidance working. The frames of a pool of clips are encoded
once by the frozen VAE (cached in var/).

Output (--out, default models/shapes-v2-motion): the EMA adapter (``MotionAdapter.save_pretrained``,
fp16), ``tokenizer/`` and ``text_encoder/`` (the extended ones) and training_info.json, written at
every checkpoint; the resumable state (--state, var/) at the same time. Load it with
``training.train_motion.load_pipeline`` (an ``AnimateDiffPipeline`` of shapes-v2's UNet, VAE and
scheduler with the adapter and the extended text encoder).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import signal
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from training import motion_data
from training.shapes_data import vocabulary as image_vocabulary
from training.train import MAX_TOKENS, make_train_scheduler, replace_folder, write_tokenizer_files

BASE = "models/shapes-v2"
OUT = "models/shapes-v2-motion"
STATE = "var/motion/state.pt"
ADAPTER_CONFIG = dict(block_out_channels=(64, 128, 192), motion_layers_per_block=1, motion_num_attention_heads=4,
                      motion_norm_num_groups=8, motion_max_seq_length=32, use_motion_mid_block=True)
DEFAULT_STEPS = 20
DEFAULT_GUIDANCE = 6.0


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


STOP = {"requested": False}


def _request_stop(signum, frame):
    STOP["requested"] = True
    log(f"signal {signum}: checkpointing and stopping")


# ----------------------------------------------------------------------------- text side
def build_tokenizer(tmpdir: Path):
    """shapes-v2's word-level tokenizer with the motion words added (every word one token)."""
    from transformers import CLIPTokenizer

    words = image_vocabulary() + motion_data.vocabulary()
    write_tokenizer_files(tmpdir, words)
    tok = CLIPTokenizer.from_pretrained(str(tmpdir), unk_token="<|unk|>", model_max_length=MAX_TOKENS)
    unk = tok.convert_tokens_to_ids("<|unk|>")
    for w in words:
        ids = tok(w, add_special_tokens=False).input_ids
        assert len(ids) == 1 and ids[0] != unk, (w, ids)
    return tok


def extend_text_encoder(base_te, base_tok, tok):
    """A copy of ``base_te`` for ``tok``'s vocabulary: the rows of tokens ``base_tok`` knows are
    copied by token string, the others start at the mean of the known words' rows plus noise.
    Returns (text encoder, bool mask of the new rows)."""
    from transformers import CLIPTextModel

    cfg = copy.deepcopy(base_te.config)
    cfg.vocab_size = len(tok)
    te = CLIPTextModel(cfg)
    sd = {k: v for k, v in base_te.state_dict().items() if "token_embedding" not in k}
    missing, unexpected = te.load_state_dict(sd, strict=False)
    assert not unexpected and all("token_embedding" in k for k in missing), (missing, unexpected)
    old = base_te.get_input_embeddings().weight.detach()
    new = te.get_input_embeddings().weight
    base_vocab = base_tok.get_vocab()
    words = [base_vocab[w + "</w>"] for w in image_vocabulary()]
    mean, std = old[words].mean(0), old[words].std(0)
    fresh = torch.zeros(len(tok), dtype=torch.bool)
    g = torch.Generator().manual_seed(47)
    with torch.no_grad():
        for t, i in tok.get_vocab().items():
            if t in base_vocab:
                new[i] = old[base_vocab[t]]
            else:
                new[i] = mean + 0.5 * std * torch.randn(mean.shape, generator=g)
                fresh[i] = True
    return te, fresh


def encode_text(tok, te, captions: list[str]) -> torch.Tensor:
    ids = tok(captions, padding="max_length", max_length=MAX_TOKENS, truncation=True, return_tensors="pt").input_ids
    return te(ids)[0]


# ----------------------------------------------------------------------------- model
def make_motion_unet(unet2d, adapter=None):
    """shapes-v2's UNet with motion modules (``adapter``'s, or fresh ones whose output starts at zero)."""
    from diffusers import MotionAdapter, UNetMotionModel

    fresh = adapter is None
    if fresh:
        adapter = MotionAdapter(**ADAPTER_CONFIG)
    unet = UNetMotionModel.from_unet2d(unet2d, adapter)
    if fresh:
        for name, mod in unet.named_modules():
            if "motion_modules" in name and name.endswith("proj_out"):
                torch.nn.init.zeros_(mod.weight)
                torch.nn.init.zeros_(mod.bias)
    unet.freeze_unet2d_params()
    return unet


def motion_state(unet) -> dict[str, torch.Tensor]:
    return {k: v for k, v in unet.state_dict().items() if ".motion_modules." in k}


def to_adapter(motion_sd: dict[str, torch.Tensor]):
    from diffusers import MotionAdapter

    adapter = MotionAdapter(**ADAPTER_CONFIG)
    adapter.load_state_dict({k: v.float() for k, v in motion_sd.items()}, strict=True)
    return adapter


def load_pipeline(motion_dir: str | Path = OUT, base: str | Path = BASE, dtype=torch.float32):
    """AnimateDiffPipeline: shapes-v2's UNet, VAE and scheduler, the motion adapter and the
    extended tokenizer and text encoder from ``motion_dir``."""
    from diffusers import AnimateDiffPipeline, AutoencoderKL, DPMSolverMultistepScheduler, MotionAdapter, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    motion_dir, base = Path(motion_dir), Path(base)
    pipe = AnimateDiffPipeline(
        vae=AutoencoderKL.from_pretrained(base, subfolder="vae", torch_dtype=dtype),
        text_encoder=CLIPTextModel.from_pretrained(motion_dir, subfolder="text_encoder", torch_dtype=dtype),
        tokenizer=CLIPTokenizer.from_pretrained(motion_dir, subfolder="tokenizer"),
        unet=UNet2DConditionModel.from_pretrained(base, subfolder="unet", torch_dtype=dtype),
        motion_adapter=MotionAdapter.from_pretrained(motion_dir, torch_dtype=dtype),
        scheduler=DPMSolverMultistepScheduler.from_pretrained(base, subfolder="scheduler"),
    )
    pipe.set_progress_bar_config(disable=True)
    from gpu_tasks import motion_text

    motion_text.attach(pipe.unet, motion_dir, dtype)  # the caption to the temporal layers, where it ships
    return pipe


# ----------------------------------------------------------------------------- data
@torch.no_grad()
def encode_pool(vae, n: int, seed: int, cache: Path, batch: int = 256) -> tuple[torch.Tensor, list[str]]:
    """Scaled VAE latents (n, frames, 4, 16, 16) and captions of clips 0..n-1 of ``seed``, cached."""
    if cache.exists():
        d = torch.load(cache, weights_only=False)
        if d["n"] == n and d["seed"] == seed:
            log(f"latent pool from {cache}")
            return d["lat"], d["captions"]
    t0 = time.time()
    frames, caps = [], []
    for i in range(n):
        f, c, _ = motion_data.clip(seed, i)
        frames.append(f)
        caps.append(c)
    arr = np.concatenate(frames)                       # n*F, 64, 64, 3
    log(f"rendered {n} clips in {time.time() - t0:.1f}s")
    sf = vae.config.scaling_factor
    lats = []
    for s in range(0, len(arr), batch):
        x = torch.from_numpy(arr[s:s + batch]).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
        lats.append(vae.encode(x).latent_dist.mean * sf)
    lat = torch.cat(lats).view(n, motion_data.FRAMES, 4, 16, 16).contiguous()
    log(f"encoded {n * motion_data.FRAMES} frames in {time.time() - t0:.1f}s; latent std {lat.std():.3f}")
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(dict(n=n, seed=seed, lat=lat, captions=caps), cache)
    return lat, caps


# ----------------------------------------------------------------------------- saving
def save(out: Path, motion_sd, emb_rows: torch.Tensor, fresh: torch.Tensor, te, tok, meta: dict, cond=None) -> None:
    """The adapter (fp16), the extended tokenizer and text encoder (fp32, as shapes-v2's), the
    caption's conditioner of the temporal layers when trained (gpu_tasks/motion_text.py), the meta."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    to_adapter(motion_sd).to(torch.float16).save_pretrained(tmp, safe_serialization=True)
    te_out = copy.deepcopy(te).float().requires_grad_(False)
    with torch.no_grad():
        te_out.get_input_embeddings().weight[fresh] = emb_rows
    te_out.save_pretrained(tmp / "text_encoder", safe_serialization=True)
    tok.save_pretrained(tmp / "tokenizer")
    if cond is not None:
        from gpu_tasks import motion_text

        motion_text.save(cond, tmp)
    (tmp / "training_info.json").write_text(json.dumps(meta, indent=1))
    if (out / "serving.json").exists():  # how the service serves it is not the training's to drop
        (tmp / "serving.json").write_bytes((out / "serving.json").read_bytes())
    for f in [tmp, *tmp.rglob("*")]:              # mkdtemp's 0700 and safetensors' 0600: readable as models/ is
        f.chmod(0o755 if f.is_dir() else 0o644)
    replace_folder(tmp, out)


def lr_factor(step: int, warmup: int, steps: int) -> float:
    ramp = min(1.0, (step + 1) / warmup)
    return ramp * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps)))


# ----------------------------------------------------------------------------- training
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default=BASE)
    p.add_argument("--out", default=OUT)
    p.add_argument("--state", default=STATE)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pool", type=int, default=3000, help="clips whose latents are precomputed")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=4, help="clips per step (x16 frames)")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--emb-lr", type=float, default=2e-3, help="learning rate of the motion words' embeddings")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--ema", type=float, default=0.995)
    p.add_argument("--min-snr", type=float, default=5.0)
    p.add_argument("--p-drop", type=float, default=0.1, help="share of empty captions")
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--max-minutes", type=float, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--warm-from", default=None,
                   help="start from a shipped motion folder (its adapter, its motion words' rows and its conditioner, "
                        "the EMA weights) with a fresh optimiser: how a run continues without var/'s state")
    p.add_argument("--text-cond", action="store_true",
                   help="train the caption's conditioner of the temporal layers (gpu_tasks/motion_text.py)")
    p.add_argument("--cond-lr", type=float, default=1e-3)
    p.add_argument("--high-noise", type=float, default=0.0,
                   help="share of timesteps drawn from the noisiest 40%% (where a clip's layout and path are decided)")
    p.add_argument("--time-steps", type=int, default=0, help="only time this many steps (no saving), then exit")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    signal.signal(signal.SIGTERM, _request_stop)
    signal.signal(signal.SIGINT, _request_stop)
    train(args)


def train(args) -> None:
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    t_start = time.time()
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    base = Path(args.base)
    vae = AutoencoderKL.from_pretrained(base, subfolder="vae").float().eval().requires_grad_(False)
    unet2d = UNet2DConditionModel.from_pretrained(base, subfolder="unet").float()
    base_te = CLIPTextModel.from_pretrained(base, subfolder="text_encoder").float()
    base_tok = CLIPTokenizer.from_pretrained(base, subfolder="tokenizer")
    tok = build_tokenizer(Path(tempfile.mkdtemp(prefix="motion_tok_")))
    te, fresh = extend_text_encoder(base_te, base_tok, tok)
    te.eval().requires_grad_(False)
    # only the motion words' rows learn: the others' gradient is zeroed (and with no weight decay
    # on this group, Adam leaves them exactly as shapes-v2 has them)
    emb_weight = te.get_input_embeddings().weight
    emb_weight.requires_grad_(True)
    emb_weight.register_hook(lambda g: g * fresh.view(-1, 1).to(g.dtype))
    log(f"tokenizer: {len(base_tok)} -> {len(tok)} tokens ({int(fresh.sum())} new rows)")

    warm = Path(args.warm_from) if args.warm_from else None
    if warm is not None:
        from diffusers import MotionAdapter

        unet = make_motion_unet(unet2d, MotionAdapter.from_pretrained(warm).float())
        warm_te = CLIPTextModel.from_pretrained(warm, subfolder="text_encoder").float()
        assert CLIPTokenizer.from_pretrained(warm, subfolder="tokenizer").get_vocab() == tok.get_vocab(), \
            "the warm start's tokenizer is not this one"
        with torch.no_grad():
            emb_weight[fresh] = warm_te.get_input_embeddings().weight[fresh]
        log(f"warm start from {warm}")
    else:
        unet = make_motion_unet(unet2d)
    trainable = [p_ for p_ in unet.parameters() if p_.requires_grad]
    cond = None
    if args.text_cond:
        from gpu_tasks import motion_text

        cond = (motion_text.load(warm) if warm is not None else None) or \
            motion_text.for_unet(unet, te.config.hidden_size)
        cond.train().requires_grad_(True)
        motion_text.hook(unet, cond)
        log(f"caption conditioner of the temporal layers: {sum(p_.numel() for p_ in cond.parameters()):,} params")
    log(f"motion module params: {sum(p_.numel() for p_ in trainable):,}; frozen UNet params: "
        f"{sum(p_.numel() for p_ in unet.parameters() if not p_.requires_grad):,}")
    old_rows = emb_weight.detach()[~fresh].clone()

    lat, caps = encode_pool(vae, args.pool, motion_data.TRAIN_SEED, Path(args.state).parent / f"pool_{args.pool}.pt")
    n_pool = lat.shape[0]

    ema_sd = {k: v.detach().clone() for k, v in motion_state(unet).items()}
    ema_emb = emb_weight.detach()[fresh].clone()
    groups = [{"params": trainable, "lr": args.lr, "weight_decay": 0.01},
              {"params": [emb_weight], "lr": args.emb_lr, "weight_decay": 0.0}]
    ema_cond = None
    if cond is not None:
        groups.append({"params": list(cond.parameters()), "lr": args.cond_lr, "weight_decay": 0.0})
        ema_cond = copy.deepcopy(cond).requires_grad_(False)
    opt = torch.optim.AdamW(groups)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, args.warmup, args.steps))
    noise_sched = make_train_scheduler()
    acp = noise_sched.alphas_cumprod
    state_path = Path(args.state)
    start = 0
    if args.resume and state_path.exists():
        st = torch.load(state_path, weights_only=False)
        unet.load_state_dict(st["motion"], strict=False)
        with torch.no_grad():
            emb_weight[fresh] = st["emb_rows"]
        ema_sd, ema_emb = st["ema_motion"], st["ema_emb"]
        if cond is not None:
            cond.load_state_dict(st["cond"])
            ema_cond.load_state_dict(st["ema_cond"])
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        torch.set_rng_state(st["torch_rng"])
        rng.bit_generator.state = st["np_rng"]
        start = st["step"]
        log(f"resumed from step {start}")

    def text_states(captions):
        return encode_text(tok, te, captions)

    F_ = motion_data.FRAMES
    unet.train()
    t0 = time.time()
    loss_avg = None
    for step in range(start, args.steps):
        idx = rng.integers(n_pool, size=args.batch)
        batch_caps = ["" if rng.random() < args.p_drop else caps[i] for i in idx]
        z0 = lat[idx].permute(0, 2, 1, 3, 4)                     # B, C, F, H, W
        noise = torch.randn_like(z0)
        t = torch.randint(0, 1000, (args.batch,))
        if args.high_noise > 0:
            high = torch.rand(args.batch) < args.high_noise
            t = torch.where(high, torch.randint(600, 1000, (args.batch,)), t)
        a = acp[t].view(-1, 1, 1, 1, 1)
        zt = a.sqrt() * z0 + (1 - a).sqrt() * noise
        target = a.sqrt() * noise - (1 - a).sqrt() * z0         # v-prediction
        enc = text_states(batch_caps)
        pred = unet(zt, t, encoder_hidden_states=enc.repeat_interleave(F_, dim=0)).sample
        per = (pred - target).pow(2).mean(dim=(1, 2, 3, 4))
        if args.min_snr > 0:
            snr = a.view(-1) / (1 - a.view(-1))
            w = snr.clamp(max=args.min_snr) / (snr + 1)
            loss = (w * per).mean() / w.mean().detach()
        else:
            loss = per.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable + [emb_weight] + (list(cond.parameters()) if cond is not None else []), 1.0)
        opt.step()
        sched.step()
        assert torch.equal(emb_weight.detach()[~fresh], old_rows), "a shapes-v2 word's embedding moved"
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            cur = motion_state(unet)
            for k, v in ema_sd.items():
                v.mul_(decay).add_(cur[k].detach(), alpha=1 - decay)
            ema_emb.mul_(decay).add_(emb_weight.detach()[fresh], alpha=1 - decay)
            if cond is not None:
                for e, c in zip(ema_cond.parameters(), cond.parameters(), strict=True):
                    e.mul_(decay).add_(c.detach(), alpha=1 - decay)
        loss_avg = loss.item() if loss_avg is None else 0.98 * loss_avg + 0.02 * loss.item()
        done = step + 1
        s_per_step = (time.time() - t0) / (done - start)
        if args.time_steps:
            log(f"step {done}: loss {loss.item():.4f} {time.time() - t0:.2f}s so far")
            if done - start >= args.time_steps:
                log(f"timing: {s_per_step:.3f} s/step at batch {args.batch} x {F_} frames, {args.threads} thread(s)")
                return
            continue
        if step % 10 == 0 or done == args.steps:
            log(f"step {done}/{args.steps} loss {loss.item():.4f} avg {loss_avg:.4f} lr {sched.get_last_lr()[0]:.2e} "
                f"{s_per_step:.3f}s/step")
        out_of_time = (args.max_minutes > 0 and time.time() - t_start > 60 * args.max_minutes) or STOP["requested"]
        if done % args.ckpt_every == 0 or done == args.steps or out_of_time:
            meta = dict(vars(args), step=done, total_wall_s=round(time.time() - t_start, 1),
                        s_per_step=round(s_per_step, 3), adapter_config=ADAPTER_CONFIG, base=str(args.base),
                        frames=F_, fps=motion_data.FPS, train_dataset_seed=motion_data.TRAIN_SEED,
                        held_out=sorted(" ".join(x) for x in motion_data.HELD_OUT),
                        new_words=motion_data.vocabulary(), default_inference_steps=DEFAULT_STEPS,
                        default_guidance_scale=DEFAULT_GUIDANCE)
            save(Path(args.out), ema_sd, ema_emb, fresh, te, tok, meta, ema_cond)
            state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp_state = state_path.with_name(state_path.name + ".tmp")
            torch.save(dict(motion=motion_state(unet), emb_rows=emb_weight.detach()[fresh].clone(), ema_motion=ema_sd,
                            ema_emb=ema_emb, opt=opt.state_dict(), sched=sched.state_dict(),
                            torch_rng=torch.get_rng_state(), np_rng=rng.bit_generator.state, step=done,
                            cond=cond.state_dict() if cond is not None else None,
                            ema_cond=ema_cond.state_dict() if ema_cond is not None else None), tmp_state)
            tmp_state.replace(state_path)
            log(f"checkpoint at step {done} -> {args.out}")
        if out_of_time:
            log(f"stopping at step {done}: " + ("signal" if STOP["requested"] else f"--max-minutes {args.max_minutes}"))
            break


if __name__ == "__main__":
    main()

