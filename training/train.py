"""Train the shipped "shapes" latent text-to-image model (diffusers StableDiffusionPipeline layout).

    python -m training.train --out models/shapes-v1            # full run (VAE, preview decoder, UNet)

Stages (all seeded, single-threaded by default):
  1. AutoencoderKL: 64x64x3 pixels <-> 16x16x4 latents (3 block levels, 4x downsampling);
     the scaling_factor is measured so that scaled latents have ~unit standard deviation.
  2. Preview decoder: least-squares linear map scaled-latent (4 ch + bias) -> 4x-downsampled RGB,
     written to <out>/preview_decoder.json.
  3. A tiny CLIPTextModel (trained jointly) + a small UNet2DConditionModel on the scaled latents,
     v-prediction, DDPM linear betas, 10% empty captions (classifier-free guidance), EMA weights.
The pipeline (EMA UNet + text encoder, VAE, tokenizer, DPMSolverMultistep scheduler) is saved
with StableDiffusionPipeline.save_pretrained every --ckpt-every steps and at the end, so an
interruption still leaves a loadable model in --out. Resumable state goes to --state (the UNet
stage) and <state>.vae.pt beside it (the VAE stage); with --resume, re-running the same command
continues either stage where it stopped (SIGTERM / Ctrl-C save a checkpoint first).

Aspect-ratio buckets (issue 46, as SDXL was trained): --buckets 64x64=1,96x64=1,64x96=1,96x96=1
draws a pool of scenes per frame (training/shapes_data.py draws them at that frame), encodes each
with the (reused) VAE, and makes every batch one bucket, buckets drawn in proportion to their
weights. --finetune-unet continues the UNet of --warm-from with the VAE and text encoder frozen,
its own step count and learning-rate schedule (steps counted from 0):

    nice -n 15 python -m training.train --out var/shapes-v2-ar/model --warm-from models/shapes-v2 \
        --vae-from models/shapes-v2 --finetune-unet --buckets 64x64=1,96x64=1,64x96=1,96x96=1 ...

shapes-v2 (issue 34; docs/model.md) is this script with a sharper VAE (fine-tuned from v1's with an
edge-aware loss: L1 on pixels and on image gradients, --vae-edge-weight), a wider UNet, min-SNR
loss weighting (--min-snr) and a longer run.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import signal
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from training.shapes_data import ShapesDataset, caption_for, vocabulary

TRAIN_SEED = 1234          # dataset seed used for training (eval uses a disjoint seed)
MAX_TOKENS = 24            # tokenizer model_max_length == text encoder context used
SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|unk|>"]
DEFAULT_STEPS = 20         # documented default number of inference steps
DEFAULT_GUIDANCE = 6.0


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


STOP = {"requested": False}   # set by SIGTERM / SIGINT: the running stage checkpoints and stops


def _request_stop(signum, frame):
    STOP["requested"] = True
    log(f"signal {signum}: checkpointing and stopping")


# ----------------------------------------------------------------------------- tokenizer
def write_tokenizer_files(d: Path, words: list[str]) -> None:
    """Word-level BPE for CLIPTokenizer: every caption word merges to one token ``word</w>``.

    tokenizers' BPE needs every merge part in the vocab, so the left-to-right prefix chain of
    each word is included. Characters that never start/continue a known word map to <|unk|>.
    """
    d.mkdir(parents=True, exist_ok=True)
    words = sorted(set(words), key=lambda w: (-len(w), w))
    vocab: dict[str, int] = {t: i for i, t in enumerate(SPECIALS)}
    merges: list[tuple[str, str]] = []

    def add(t):
        if t not in vocab:
            vocab[t] = len(vocab)

    for w in words:
        syms = list(w[:-1]) + [w[-1] + "</w>"]
        for s in syms:
            add(s)
        cur = syms[0]
        for s in syms[1:]:
            if (cur, s) not in merges:
                merges.append((cur, s))
            cur = cur + s
            add(cur)
    (d / "vocab.json").write_text(json.dumps(vocab, indent=0))
    (d / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))


def build_tokenizer(tmpdir: Path):
    from transformers import CLIPTokenizer

    write_tokenizer_files(tmpdir, vocabulary())
    tok = CLIPTokenizer.from_pretrained(str(tmpdir), unk_token="<|unk|>", model_max_length=MAX_TOKENS)
    unk = tok.convert_tokens_to_ids("<|unk|>")
    for w in vocabulary():
        ids = tok(w, add_special_tokens=False).input_ids
        assert len(ids) == 1 and ids[0] != unk, (w, ids)
    return tok


# ----------------------------------------------------------------------------- model configs
def make_vae(channels=(16, 32, 64), layers_per_block=1):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=tuple(channels), layers_per_block=layers_per_block, latent_channels=4,
        norm_num_groups=1, sample_size=64, mid_block_add_attention=False,
    )


def make_text_encoder(tok, hidden=128, layers=3):
    from transformers import CLIPTextConfig, CLIPTextModel

    cfg = CLIPTextConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 4,
        num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=32,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        projection_dim=hidden,
    )
    return CLIPTextModel(cfg)


def make_unet(channels=(32, 64, 128), cross_dim=128, layers_per_block=1, attn_top=False):
    from diffusers import UNet2DConditionModel

    top_down = "CrossAttnDownBlock2D" if attn_top else "DownBlock2D"
    top_up = "CrossAttnUpBlock2D" if attn_top else "UpBlock2D"
    return UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=layers_per_block,
        block_out_channels=tuple(channels),
        down_block_types=(top_down, "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", top_up),
        cross_attention_dim=cross_dim, attention_head_dim=8, norm_num_groups=8,
    )


def make_train_scheduler():
    from diffusers import DDPMScheduler

    return DDPMScheduler(num_train_timesteps=1000, beta_schedule="linear", beta_start=0.0001,
                         beta_end=0.02, prediction_type="v_prediction", clip_sample=False)


def make_infer_scheduler():
    from diffusers import DPMSolverMultistepScheduler

    return DPMSolverMultistepScheduler(num_train_timesteps=1000, beta_schedule="linear",
                                       beta_start=0.0001, beta_end=0.02, prediction_type="v_prediction",
                                       algorithm_type="dpmsolver++", solver_order=2, steps_offset=1)


def n_params(m) -> int:
    return sum(p.numel() for p in m.parameters())


# ----------------------------------------------------------------------------- data
def to_tensor(imgs_u8: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(imgs_u8).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


class Pool:
    """A fixed pool of training samples from the seeded generator (re-captioned at random)."""

    def __init__(self, n: int, seed: int = TRAIN_SEED, width: int = 64, height: int = 64):
        ds = ShapesDataset(seed=seed, p_two=0.25, width=width, height=height)
        t = time.time()
        self.imgs, _, self.gts = ds.arrays(range(n))
        log(f"generated pool of {n} {width}x{height} samples in {time.time() - t:.1f}s")

    def sample_weights(self, kind_weights: dict[str, float]) -> np.ndarray | None:
        """Probability of drawing each pool sample when kinds are oversampled: a sample weighs
        the largest weight among its shapes' kinds (kinds not named weigh 1); None when no kind
        is weighted (uniform draws, as v1 and shapes-v2 up to step 3600 were trained)."""
        if not kind_weights:
            return None
        w = np.array([max(kind_weights.get(s.kind, 1.0) for s in gt.shapes) for gt in self.gts])
        return w / w.sum()

    def crops(self, idx, size: int, rng: np.random.Generator, jitter: float = 10.0) -> np.ndarray:
        """size x size windows (a multiple of 4), each near one of its image's shapes."""
        out = []
        n = self.imgs.shape[1]
        for i in idx:
            sh = self.gts[i].shapes[int(rng.integers(len(self.gts[i].shapes)))]
            ox, oy = (int(np.clip(c - size / 2 + rng.uniform(-jitter, jitter), 0, n - size)) // 4 * 4
                      for c in (sh.cx, sh.cy))
            out.append(self.imgs[i, oy:oy + size, ox:ox + size])
        return np.stack(out)

    def captions(self, idx, rng: np.random.Generator, p_no_size=0.3, p_drop=0.1) -> list[str]:
        caps = []
        for i in idx:
            if rng.random() < p_drop:
                caps.append("")
            else:
                gt = self.gts[i]
                caps.append(caption_for(gt, [bool(rng.random() >= p_no_size) for _ in gt.shapes]))
        return caps


def parse_buckets(spec: str) -> list[tuple[int, int, float]]:
    """``"64x64=2,96x64=1"`` -> ``[(64, 64, 2.0), (96, 64, 1.0)]`` (width, height, weight); sides are
    multiples of 16 (two 2x downsamplings of 4x-downsampled latents); the weight defaults to 1."""
    out = []
    for part in filter(None, spec.split(",")):
        frame, _, weight = part.partition("=")
        try:
            w, h = (int(v) for v in frame.lower().split("x"))
            wt = float(weight or 1)
        except ValueError:
            raise SystemExit(f"--buckets: {part!r} is not WIDTHxHEIGHT=WEIGHT") from None
        if w % 16 or h % 16 or w <= 0 or h <= 0 or wt <= 0:
            raise SystemExit(f"--buckets: {part!r}: sides must be positive multiples of 16, the weight positive")
        out.append((w, h, wt))
    if not out:
        raise SystemExit("--buckets: no bucket")
    return out


class Bucket:
    """One aspect-ratio bucket: its pool, the pool's latents and its share of the batches."""

    def __init__(self, width: int, height: int, weight: float, pool: Pool, lat_mean: torch.Tensor):
        self.width, self.height, self.weight, self.pool, self.lat_mean = width, height, weight, pool, lat_mean

    @property
    def name(self) -> str:
        return f"{self.width}x{self.height}"


# ----------------------------------------------------------------------------- stage 1: VAE
def vae_state_path(state: str | Path) -> Path:
    state = Path(state)
    return state.with_name(state.stem + ".vae.pt")


def _image_grads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x[..., 1:, :] - x[..., :-1, :], x[..., :, 1:] - x[..., :, :-1]


def train_vae(pool: Pool, steps: int, batch: int, lr: float, seed: int, kl_weight: float,
              vae_noise: float = 0.1, edge_weight: float = 0.0, init_from: str | None = None,
              channels=(16, 32, 64), layers_per_block: int = 1, state: Path | None = None,
              resume: bool = False, ckpt_every: int = 100, crop: int = 0):
    """Train (or, with init_from, fine-tune) the autoencoder; resumable through ``state``.

    edge_weight > 0 adds L1 on pixels and on horizontal/vertical image differences: plain MSE is
    dominated by the flat areas, and the v1 VAE (MSE only, 400 steps) rounded a star's points
    off (bench/geometry.py: 31% of its round-tripped ground-truth stars still look like stars).
    crop > 0 trains on crop x crop windows around a shape (the autoencoder is convolutional, so
    it then runs on whole images): a quarter of the pixels per sample for crop 32, so four
    times the samples, all of them edges and corners rather than flat background.
    """
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    if init_from:
        from diffusers import AutoencoderKL
        vae = AutoencoderKL.from_pretrained(init_from, subfolder="vae").float()
        log(f"VAE initialised from {init_from}")
    else:
        vae = make_vae(channels, layers_per_block)
    log(f"VAE params: {n_params(vae):,}")
    opt = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    start = 0
    if resume and state is not None and state.exists():
        st = torch.load(state, weights_only=False)
        vae.load_state_dict(st["vae"])
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        torch.set_rng_state(st["torch_rng"])
        rng.bit_generator.state = st["np_rng"]
        start = st["step"]
        log(f"VAE resumed from step {start}/{steps}")

    def checkpoint(done: int) -> None:
        if state is not None:
            tmp = state.with_name(state.name + ".tmp")
            torch.save(dict(vae=vae.state_dict(), opt=opt.state_dict(), sched=sched.state_dict(),
                            torch_rng=torch.get_rng_state(), np_rng=rng.bit_generator.state, step=done), tmp)
            tmp.replace(state)

    vae.train()
    t0 = time.time()
    for step in range(start, steps):
        idx = rng.integers(len(pool.imgs), size=batch)
        x = to_tensor(pool.crops(idx, crop, rng) if crop else pool.imgs[idx])
        post = vae.encode(x).latent_dist
        # deterministic-ish autoencoder: decode the posterior mean plus a small fixed noise so the
        # decoder tolerates imperfect diffusion outputs; L2 (the KL mean term) keeps latents bounded.
        z = post.mean + vae_noise * torch.randn_like(post.mean)
        rec = vae.decode(z).sample
        mse = F.mse_loss(rec, x)
        kl = (0.5 * post.mean ** 2).mean()
        loss = mse + kl_weight * kl
        if edge_weight > 0:
            (ry, rx), (ty, tx) = _image_grads(rec), _image_grads(x)
            loss = loss + edge_weight * (F.l1_loss(rec, x) + F.l1_loss(ry, ty) + F.l1_loss(rx, tx))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        sched.step()
        done = step + 1
        if step % 25 == 0 or done == steps:
            log(f"vae step {done}/{steps} mse {mse.item():.5f} kl {kl.item():.3f} loss {loss.item():.4f} "
                f"{(time.time() - t0) / (done - start):.3f}s/step")
        if done % ckpt_every == 0 or done == steps or STOP["requested"]:
            checkpoint(done)
            if STOP["requested"]:
                log(f"VAE stopped at step {done}; state -> {state}")
                raise SystemExit(0)
    if start == 0 and steps == 0:
        checkpoint(0)
    vae.eval()
    return vae


@torch.no_grad()
def encode_pool(vae, pool: Pool, bs: int = 256):
    means, stds = [], []
    for i in range(0, len(pool.imgs), bs):
        d = vae.encode(to_tensor(pool.imgs[i:i + bs])).latent_dist
        means.append(d.mean)
        stds.append(d.std)
    return torch.cat(means), torch.cat(stds)


@torch.no_grad()
def fit_preview_decoder(lat_scaled: torch.Tensor, imgs_u8: np.ndarray) -> dict:
    """Least squares: scaled latent pixel (4 + bias) -> RGB in [0,1] of the 4x-downsampled image."""
    target = torch.from_numpy(imgs_u8).permute(0, 3, 1, 2).float() / 255.0
    target = F.avg_pool2d(target, 4)                               # N,3,16,16
    X = lat_scaled.permute(0, 2, 3, 1).reshape(-1, 4).double()
    X = torch.cat([X, torch.ones(len(X), 1, dtype=X.dtype)], 1)
    Y = target.permute(0, 2, 3, 1).reshape(-1, 3).double()
    sol = torch.linalg.lstsq(X, Y).solution                       # 5 x 3
    pred = (X @ sol).clamp(0, 1)
    rmse = float(((pred - Y) ** 2).mean().sqrt())
    W = sol[:4].T                                                   # 3 x 4
    b = sol[4]
    return {"weight": [[float(v) for v in row] for row in W], "bias": [float(v) for v in b],
            "latent_scaled": True, "fit_rmse": rmse}


# ----------------------------------------------------------------------------- saving
def save_pipeline(out: Path, vae, text_encoder, tokenizer, unet, preview: dict | None, meta: dict,
                  fp16: bool = True):
    from diffusers import StableDiffusionPipeline

    # UNet and VAE weights are stored as fp16 (diffusers loads them into fp32 modules by default);
    # the text encoder stays fp32 because transformers keeps the stored dtype, which would give a
    # mixed-dtype pipeline when it is loaded without torch_dtype.
    dtype = torch.float16 if fp16 else torch.float32
    pipe = StableDiffusionPipeline(
        vae=copy.deepcopy(vae).to(dtype), text_encoder=copy.deepcopy(text_encoder).float(),
        tokenizer=tokenizer, unet=copy.deepcopy(unet).to(dtype), scheduler=make_infer_scheduler(),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )
    out = Path(out)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    pipe.save_pretrained(tmp, safe_serialization=True)
    if preview is not None:
        (tmp / "preview_decoder.json").write_text(json.dumps(preview, indent=1))
    (tmp / "training_info.json").write_text(json.dumps(meta, indent=1))
    replace_folder(tmp, out)


def replace_folder(tmp: Path, out: Path) -> None:
    """Put the finished folder `tmp` at `out`, whole: a reader sees the old model or the new one."""
    old = None
    if out.exists():
        old = out.with_name(out.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old)


# ----------------------------------------------------------------------------- stage 3: UNet
REWARM_STEPS = 50   # a warm start's fresh optimiser ramps its learning rate up again over these


def lr_factor(step: int, warmup: int, steps: int, warm_step: int = 0) -> float:
    """Linear warm-up, then cosine decay to 10% at `steps`; a warm start at `warm_step` ramps
    up again (its optimiser has no moments yet) and then follows the same cosine."""
    ramp = min(1.0, (step + 1) / warmup)
    if warm_step:
        ramp = min(ramp, (step - warm_step + 1) / REWARM_STEPS)
    return ramp * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps)))


def warm_start(pipeline_dir: str | Path, unet, te) -> int:
    """Load a saved pipeline's (EMA) UNet and text encoder into the modules being trained and
    return the UNet step it was saved at. This continues a run whose full state (optimiser
    moments, raw weights) is gone, from the pipeline a checkpoint leaves in --out: the folder
    that can be committed, where the full state (four copies of the weights) is too big to."""
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextModel

    pipeline_dir = Path(pipeline_dir)
    unet.load_state_dict(UNet2DConditionModel.from_pretrained(pipeline_dir, subfolder="unet").float().state_dict())
    te.load_state_dict(CLIPTextModel.from_pretrained(pipeline_dir, subfolder="text_encoder").float().state_dict())
    return int(json.loads((pipeline_dir / "training_info.json").read_text())["unet_step"])


def parse_kind_weights(spec: str | None) -> dict[str, float]:
    """``"star=2,triangle=1.5"`` -> ``{"star": 2.0, "triangle": 1.5}``; unknown kinds are refused."""
    from training.shapes_data import SHAPES

    out: dict[str, float] = {}
    for part in filter(None, (spec or "").split(",")):
        kind, _, value = part.partition("=")
        kind = kind.strip()
        if kind not in SHAPES or not value:
            raise SystemExit(f"--kind-weights: {part!r} is not KIND=WEIGHT with KIND one of {', '.join(SHAPES)}")
        out[kind] = float(value)
        if out[kind] <= 0:
            raise SystemExit(f"--kind-weights: the weight of {kind} must be positive")
    return out


def train_unet(args, vae, tokenizer, buckets: list[Bucket], preview, out: Path, t_start):
    torch.manual_seed(args.seed + 1)
    rng = np.random.default_rng(args.seed + 1)
    sf = vae.config.scaling_factor
    unet = make_unet(args.unet_channels, cross_dim=args.te_hidden, layers_per_block=args.unet_layers,
                     attn_top=args.attn_top)
    te = make_text_encoder(tokenizer, hidden=args.te_hidden, layers=args.te_layers)
    log(f"UNet params: {n_params(unet):,}  text encoder params: {n_params(te):,}")
    state_path = Path(args.state)
    warm_step = 0
    if args.finetune_unet:
        if not args.warm_from:
            raise SystemExit("--finetune-unet needs --warm-from")
        base_step = warm_start(args.warm_from, unet, te)     # the state, if any, overrides the UNet below
        te.requires_grad_(False)
        log(f"fine-tuning the UNet of {args.warm_from} (its step {base_step}); text encoder and VAE frozen")
    elif args.warm_from and not (args.resume and state_path.exists()):
        warm_step = warm_start(args.warm_from, unet, te)
        log(f"warm start from {args.warm_from}: its EMA weights at UNet step {warm_step}, a fresh optimiser")
    elif not (args.resume and state_path.exists()):
        # save right away (untrained UNet) so the trained VAE + preview decoder are never lost
        save_pipeline(out, vae, te, tokenizer, unet, preview, dict(vars(args), unet_step=0), fp16=not args.fp32)
        log(f"saved step-0 pipeline (trained VAE, untrained UNet) -> {out}")
    if args.steps == 0:
        return unet, te
    ema_unet, ema_te = copy.deepcopy(unet).eval(), copy.deepcopy(te).eval()
    for p in list(ema_unet.parameters()) + list(ema_te.parameters()):
        p.requires_grad_(False)
    params = list(unet.parameters()) + ([] if args.finetune_unet else list(te.parameters()))
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, args.warmup, args.steps, warm_step))
    noise_sched = make_train_scheduler()
    acp = noise_sched.alphas_cumprod
    start = warm_step
    for _ in range(warm_step):
        sched.step()
    if args.resume and state_path.exists():
        st = torch.load(state_path, weights_only=False)
        unet.load_state_dict(st["unet"])
        te.load_state_dict(st["te"])
        ema_unet.load_state_dict(st["ema_unet"])
        ema_te.load_state_dict(st["ema_te"])
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        torch.set_rng_state(st["torch_rng"])
        rng.bit_generator.state = st["np_rng"]
        start = st["step"]
        log(f"resumed from step {start}")

    def ema_update(step):
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for src, dst in ((unet, ema_unet),) if args.finetune_unet else ((unet, ema_unet), (te, ema_te)):
                for ps, pd in zip(src.parameters(), dst.parameters(), strict=True):
                    pd.mul_(decay).add_(ps.detach(), alpha=1 - decay)

    unet.train()
    te.train(not args.finetune_unet)
    t0 = time.time()
    loss_avg = None
    kind_weights = parse_kind_weights(args.kind_weights)
    draw_ps = [b.pool.sample_weights(kind_weights) for b in buckets]
    bucket_p = np.array([b.weight for b in buckets]) / sum(b.weight for b in buckets)
    per_bucket: dict[str, list[float]] = {b.name: [] for b in buckets}
    for step in range(start, args.steps):
        # one bucket per batch (one frame per batch, as SDXL's aspect-ratio buckets); a single
        # bucket draws nothing here, so the 64x64 recipe's random stream is as it always was
        bi = 0 if len(buckets) == 1 else int(rng.choice(len(buckets), p=bucket_p))
        pool, lat_mean, draw_p = buckets[bi].pool, buckets[bi].lat_mean, draw_ps[bi]
        if draw_p is None:
            idx = rng.integers(len(pool.imgs), size=args.batch)
        else:
            idx = rng.choice(len(pool.imgs), size=args.batch, p=draw_p)
        caps = pool.captions(idx, rng)
        ids = tokenizer(caps, padding="max_length", max_length=MAX_TOKENS, truncation=True,
                        return_tensors="pt").input_ids
        z0 = lat_mean[idx] * sf
        noise = torch.randn_like(z0)
        t = torch.randint(0, 1000, (args.batch,))
        a = acp[t].view(-1, 1, 1, 1)
        zt = a.sqrt() * z0 + (1 - a).sqrt() * noise
        target = a.sqrt() * noise - (1 - a).sqrt() * z0            # v-prediction
        if args.finetune_unet:
            with torch.no_grad():
                enc = te(ids)[0]
        else:
            enc = te(ids)[0]
        pred = unet(zt, t, encoder_hidden_states=enc).sample
        if args.min_snr > 0:
            # min-SNR-gamma weighting (Hang et al. 2023) in its v-prediction form: min(snr, g) / (snr + 1)
            snr = a.view(-1) / (1 - a.view(-1))
            w = snr.clamp(max=args.min_snr) / (snr + 1)
            loss = (w * (pred - target).pow(2).mean(dim=(1, 2, 3))).mean() / w.mean().detach()
        else:
            loss = F.mse_loss(pred, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        ema_update(step)
        loss_avg = loss.item() if loss_avg is None else 0.98 * loss_avg + 0.02 * loss.item()
        per_bucket[buckets[bi].name].append(loss.item())
        done = step + 1
        if step % 25 == 0 or done == args.steps:
            el = time.time() - t0
            by_bucket = ""
            if len(buckets) > 1:
                by_bucket = " " + " ".join(f"{k}:{np.mean(v[-20:]):.4f}" for k, v in per_bucket.items() if v)
            log(f"unet step {done}/{args.steps} [{buckets[bi].name}] loss {loss.item():.4f} avg {loss_avg:.4f} "
                f"lr {sched.get_last_lr()[0]:.2e} {el / (done - start):.3f}s/step{by_bucket}")
        out_of_time = (args.max_minutes > 0 and time.time() - t_start > 60 * args.max_minutes) or STOP["requested"]
        if done % args.ckpt_every == 0 or done == args.steps or out_of_time:
            meta = dict(vars(args), unet_step=done, total_wall_s=round(time.time() - t_start, 1),
                        unet_s_per_step=round((time.time() - t0) / (done - start), 3),
                        default_inference_steps=DEFAULT_STEPS, default_guidance_scale=DEFAULT_GUIDANCE,
                        train_dataset_seed=TRAIN_SEED)
            save_pipeline(out, vae, ema_te, tokenizer, ema_unet, preview, meta, fp16=not args.fp32)
            tmp_state = state_path.with_name(state_path.name + ".tmp")
            torch.save(dict(unet=unet.state_dict(), te=te.state_dict(), ema_unet=ema_unet.state_dict(),
                            ema_te=ema_te.state_dict(), opt=opt.state_dict(), sched=sched.state_dict(),
                            torch_rng=torch.get_rng_state(), np_rng=rng.bit_generator.state, step=done),
                       tmp_state)
            tmp_state.replace(state_path)   # a kill during the write leaves the previous state whole
            log(f"checkpoint saved at step {done} -> {out}")
        if out_of_time:
            log(f"stopping early at step {done}: " + ("signal" if STOP["requested"] else f"--max-minutes {args.max_minutes} reached"))
            break
    return ema_unet, ema_te


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--pool", type=int, default=20000, help="training samples drawn from the generator")
    p.add_argument("--vae-steps", type=int, default=400)
    p.add_argument("--vae-batch", type=int, default=32)
    p.add_argument("--vae-lr", type=float, default=2e-3)
    p.add_argument("--kl-weight", type=float, default=1e-4)
    p.add_argument("--vae-noise", type=float, default=0.1, help="noise added to the VAE latent while training it")
    p.add_argument("--vae-edge-weight", type=float, default=0.0,
                   help="weight of the L1 pixel + image-gradient loss terms (0: MSE only, as v1)")
    p.add_argument("--vae-channels", type=int, nargs=3, default=[16, 32, 64])
    p.add_argument("--vae-layers", type=int, default=1)
    p.add_argument("--vae-init", default=None, help="fine-tune the VAE of an existing pipeline dir (else from scratch)")
    p.add_argument("--vae-ckpt-every", type=int, default=100)
    p.add_argument("--vae-crop", type=int, default=0, help="train the VAE on windows of this side around shapes (0: whole images)")
    p.add_argument("--vae-from", default=None, help="reuse the VAE of an existing pipeline dir (no VAE training)")
    p.add_argument("--steps", type=int, default=2800, help="UNet steps")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=8e-4)
    p.add_argument("--ema", type=float, default=0.999)
    p.add_argument("--warmup", type=int, default=200, help="UNet learning-rate warm-up steps")
    p.add_argument("--min-snr", type=float, default=0.0, help="min-SNR-gamma loss weighting (0: off, as v1)")
    p.add_argument("--unet-channels", type=int, nargs=3, default=[32, 64, 128])
    p.add_argument("--unet-layers", type=int, default=1)
    p.add_argument("--kind-weights", default=None,
                   help="oversample training samples by shape kind, e.g. star=2,triangle=1.5 (a sample weighs "
                        "its largest kind's weight; others 1). Default: uniform")
    p.add_argument("--attn-top", action="store_true", help="cross-attention at the 16x16 level too")
    p.add_argument("--te-hidden", type=int, default=128)
    p.add_argument("--te-layers", type=int, default=3)
    p.add_argument("--ckpt-every", type=int, default=250)
    p.add_argument("--max-minutes", type=float, default=0, help="save and stop after this wall time (0: no limit)")
    p.add_argument("--state", default="/tmp/shapes_train_state.pt")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--warm-from", default=None,
                   help="continue from a saved pipeline dir (its VAE, EMA UNet and text encoder, and the UNet "
                        "step in its training_info.json) when --state is gone; the optimiser starts afresh")
    p.add_argument("--fp32", action="store_true", help="save fp32 weights (default fp16 on disk)")
    p.add_argument("--buckets", default="64x64=1",
                   help="aspect-ratio buckets WIDTHxHEIGHT=WEIGHT,...: each batch is one bucket, drawn in "
                        "proportion to the weights (default: 64x64 alone, as shapes-v1 and v2 were trained)")
    p.add_argument("--bucket-pool", type=int, default=0,
                   help="training samples per bucket other than 64x64 (0: --pool)")
    p.add_argument("--finetune-unet", action="store_true",
                   help="fine-tune the UNet of --warm-from alone (text encoder and VAE frozen), with its own "
                        "--steps and learning-rate schedule counted from 0")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    old_handlers = {sig: signal.signal(sig, _request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _run(args)
    finally:
        for sig, h in old_handlers.items():
            signal.signal(sig, h)


def _run(args):
    t_start = time.time()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(Path(tempfile.mkdtemp(prefix="shapes_tok_")))
    pool = Pool(args.pool)

    if args.warm_from and not (args.resume and Path(args.state).exists()):
        args.vae_from = args.vae_from or args.warm_from
    if args.vae_from:
        from diffusers import AutoencoderKL
        vae = AutoencoderKL.from_pretrained(args.vae_from, subfolder="vae").float().eval()
        log(f"reusing VAE from {args.vae_from} (scaling_factor {vae.config.scaling_factor:.4f})")
        lat_mean, lat_std = encode_pool(vae, pool)
    else:
        vae = train_vae(pool, args.vae_steps, args.vae_batch, args.vae_lr, args.seed, args.kl_weight,
                        vae_noise=args.vae_noise, edge_weight=args.vae_edge_weight, init_from=args.vae_init,
                        channels=args.vae_channels, layers_per_block=args.vae_layers,
                        state=vae_state_path(args.state), resume=args.resume, ckpt_every=args.vae_ckpt_every,
                        crop=args.vae_crop)
        lat_mean, lat_std = encode_pool(vae, pool)
        z = lat_mean
        sf = float(1.0 / z.std())
        vae.register_to_config(scaling_factor=sf)
        log(f"VAE done in {time.time() - t_start:.0f}s; latent std {z.std():.4f} mean {z.mean():.4f} "
            f"-> scaling_factor {sf:.4f}")
    sf = vae.config.scaling_factor
    with torch.no_grad():
        rec = vae.decode(lat_mean[:256]).sample
        rec_mse = F.mse_loss(rec, to_tensor(pool.imgs[:256])).item()
    log(f"VAE reconstruction mse (in [-1,1]) on 256 pool images: {rec_mse:.5f}")
    preview = fit_preview_decoder(lat_mean * sf, pool.imgs)
    preview["vae_recon_mse"] = rec_mse
    log(f"preview decoder fit rmse {preview['fit_rmse']:.4f}")
    buckets = []
    for w, h, weight in parse_buckets(args.buckets):
        if (w, h) == (64, 64):
            buckets.append(Bucket(w, h, weight, pool, lat_mean))
            continue
        bpool = Pool(args.bucket_pool or args.pool, width=w, height=h)
        t = time.time()
        bucket_lat, _ = encode_pool(vae, bpool)
        log(f"encoded the {w}x{h} pool in {time.time() - t:.0f}s: latents {tuple(bucket_lat.shape[1:])}")
        buckets.append(Bucket(w, h, weight, bpool, bucket_lat))
    train_unet(args, vae, tokenizer, buckets, preview, out, t_start)
    log(f"all done in {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    main()
