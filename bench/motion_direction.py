"""Does the video model read the caption's motion? (docs/video_model.md, issue 47)

    .venv/bin/python bench/motion_direction.py [--model models/shapes-v2-motion] [--n 12]

For n training-grammar clips whose motion has an opposite (right/left, up/down, grow/shrink), the
v-prediction loss of the model's denoising at t = 600, 800 and 950 with the clip's own caption and
with the caption of the opposite motion, on the same noise. A model that draws the motion the
caption names has a clearly lower loss with its own caption; equal losses mean the motion word is
not read. Writes bench/results/motion_direction.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training import motion_data  # noqa: E402
from training.train import make_train_scheduler  # noqa: E402
from training.train_motion import encode_text, load_pipeline  # noqa: E402

OPPOSITE = {"right": "left", "left": "right", "up": "down", "down": "up", "grow": "shrink", "shrink": "grow"}
TIMESTEPS = (600, 800, 950)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/shapes-v2-motion")
    p.add_argument("--base", default="models/shapes-v2")
    p.add_argument("--n", type=int, default=12)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "motion_direction.json"))
    a = p.parse_args()
    torch.set_num_threads(1)
    pipe = load_pipeline(a.model, a.base)
    unet, vae, te, tok = pipe.unet, pipe.vae, pipe.text_encoder, pipe.tokenizer
    acp = make_train_scheduler().alphas_cumprod
    rng = np.random.default_rng(5)
    rows = []
    while len(rows) < a.n:
        gt = motion_data.random_clip(rng, held_out=False)
        if gt.motion not in OPPOSITE:
            continue
        with torch.no_grad():
            x = torch.from_numpy(motion_data.render_clip(gt)).permute(0, 3, 1, 2).float().div(127.5).sub(1)
            z0 = (vae.encode(x).latent_dist.mean * vae.config.scaling_factor)[None].permute(0, 2, 1, 3, 4)
            noise = torch.randn(z0.shape, generator=torch.Generator().manual_seed(len(rows) + 1))
            loss = {"own": [], "opposite": []}
            for t in TIMESTEPS:
                alpha = acp[t]
                zt = alpha.sqrt() * z0 + (1 - alpha).sqrt() * noise
                target = alpha.sqrt() * noise - (1 - alpha).sqrt() * z0
                for which, motion in (("own", gt.motion), ("opposite", OPPOSITE[gt.motion])):
                    states = encode_text(tok, te, [motion_data.caption(gt.colour, gt.kind, motion, gt.background)])
                    pred = unet(zt, torch.tensor([t]), encoder_hidden_states=states.repeat_interleave(z0.shape[2], 0)).sample
                    loss[which].append(float(((pred - target) ** 2).mean()))
        rows.append({"motion": gt.motion, "own": float(np.mean(loss["own"])), "opposite": float(np.mean(loss["opposite"]))})
        print(rows[-1], flush=True)
    own, opp = float(np.mean([r["own"] for r in rows])), float(np.mean([r["opposite"] for r in rows]))
    result = {"command": "python bench/motion_direction.py " + " ".join(sys.argv[1:]), "model": a.model,
              "timesteps": list(TIMESTEPS), "clips": rows, "loss_own_caption": own, "loss_opposite_caption": opp,
              "own_lower_in": sum(r["own"] < r["opposite"] for r in rows)}
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(f"loss with its own caption {own:.4f}, with the opposite motion's {opp:.4f}; own lower in "
          f"{result['own_lower_in']} of {len(rows)}")


if __name__ == "__main__":
    main()
