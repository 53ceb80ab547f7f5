"""Aspect-ratio buckets for the shapes model (issue 46 item 3): training/shapes_data.py draws its
scenes at the menu's other sizes (a shape's size relative to the shorter side, one shape anywhere
in the frame), 64x64 samples stay what they were, and training/train.py fine-tunes a UNet on
several buckets, one bucket a batch, with the text encoder frozen. A few seconds on CPU; no database."""

from __future__ import annotations

import numpy as np
import pytest

from training import shapes_data


def test_64x64_samples_are_the_ones_they_always_were():
    img, caption, gt = shapes_data.sample(1234, 5)
    img2, caption2, gt2 = shapes_data.sample(1234, 5, width=64, height=64)
    assert np.array_equal(np.asarray(img), np.asarray(img2)) and caption == caption2 and gt == gt2
    assert np.array_equal(np.asarray(img), np.asarray(shapes_data.render(gt)))


@pytest.mark.parametrize("width,height", [(96, 64), (64, 96), (96, 96)])
def test_other_frames_draw_one_whole_shape_sized_by_the_shorter_side(width, height):
    ds = shapes_data.ShapesDataset(seed=7, n_shapes=1, width=width, height=height)
    imgs, caps, gts = ds.arrays(range(40))
    assert imgs.shape == (40, height, width, 3)
    scale = min(width, height) / 64
    xs = []
    for gt in gts:
        (sh,) = gt.shapes
        lo, hi = shapes_data._RADIUS[1][sh.size]
        assert lo * scale <= sh.radius <= hi * scale
        assert sh.radius <= sh.cx <= width - sh.radius and sh.radius <= sh.cy <= height - sh.radius
        xs.append(sh.cx / width)
    assert max(xs) - min(xs) > 0.3, "one shape is placed anywhere in the frame, not only near its centre"
    # the background colour fills the border: the shape stays inside the frame
    border = np.concatenate([imgs[:, 0], imgs[:, -1], imgs[:, :, 0], imgs[:, :, -1]], axis=1)
    bg = np.array([shapes_data.COLOURS[gt.background] for gt in gts])[:, None, :]
    assert (np.abs(border.astype(int) - bg).max(-1) < 8).mean() > 0.97


def test_a_bucketed_fine_tune_trains_the_unet_alone_one_bucket_a_batch(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    from diffusers import AutoPipelineForText2Image

    from training import train

    toy = ["--pool", "16", "--vae-batch", "4", "--vae-channels", "8", "16", "16", "--batch", "4",
           "--unet-channels", "16", "16", "32", "--te-hidden", "32", "--te-layers", "1", "--fp32", "--warmup", "2"]
    base = tmp_path / "base"
    train.STOP["requested"] = False
    train.main(["--out", str(base), "--state", str(tmp_path / "s0.pt"), *toy, "--vae-steps", "1", "--steps", "1"])
    assert train.parse_buckets("64x64=2,96x64") == [(64, 64, 2.0), (96, 64, 1.0)]
    with pytest.raises(SystemExit):
        train.parse_buckets("72x64=1")
    seen: list[tuple[int, ...]] = []
    make_unet = train.make_unet

    def recording_unet(*a, **k):  # the latent shape of every training batch
        unet = make_unet(*a, **k)
        unet.register_forward_pre_hook(lambda m, args: seen.append(tuple(args[0].shape)))
        return unet

    train.make_unet = recording_unet
    try:
            train.main(["--out", str(tmp_path / "ft"), "--state", str(tmp_path / "s1.pt"), *toy, "--warm-from", str(base),
                    "--vae-from", str(base), "--finetune-unet", "--buckets", "64x64=1,96x64=1,64x96=1,96x96=1",
                    "--bucket-pool", "8", "--steps", "8", "--ckpt-every", "8"])
    finally:
        train.make_unet = make_unet
    assert len(seen) == 8 and all(s[0] == 4 for s in seen)  # 8 batches of 4, each one frame
    assert len({s[2:] for s in seen}) >= 2 and {s[2:] for s in seen} <= {(16, 16), (16, 24), (24, 16), (24, 24)}
    ft = AutoPipelineForText2Image.from_pretrained(str(tmp_path / "ft"), local_files_only=True)
    b = AutoPipelineForText2Image.from_pretrained(str(base), local_files_only=True)
    for p, q in zip(ft.text_encoder.parameters(), b.text_encoder.parameters(), strict=True):
        assert torch.equal(p, q), "the text encoder is frozen"
    assert any(not torch.equal(p, q) for p, q in zip(ft.unet.parameters(), b.unet.parameters(), strict=True))
    ft.set_progress_bar_config(disable=True)
    out = ft("a red circle on a blue background", width=96, height=64, num_inference_steps=2, output_type="np",
             generator=torch.Generator().manual_seed(0)).images
    assert out.shape == (1, 64, 96, 3)
