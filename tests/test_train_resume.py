"""training/train.py at a toy size: both stages resume from their state, and an interrupted run
leaves a loadable pipeline (issue 34: shapes-v2 is trained in stages that may be stopped).

A few seconds on CPU; no database.
"""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from training import train  # noqa: E402

TOY = ["--pool", "48", "--vae-batch", "4", "--vae-channels", "8", "16", "16", "--vae-ckpt-every", "2",
       "--vae-edge-weight", "1.0", "--vae-crop", "32", "--batch", "4", "--unet-channels", "16", "16", "32", "--te-hidden", "32",
       "--te-layers", "1", "--ckpt-every", "2", "--warmup", "2", "--min-snr", "5", "--fp32"]


def _run(tmp_path, *extra):
    train.STOP["requested"] = False
    train.main(["--out", str(tmp_path / "model"), "--state", str(tmp_path / "state.pt"), *TOY, *extra])


def test_a_stopped_vae_stage_resumes_where_it_stopped(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = train.F.mse_loss

    def stop_after_three(*a, **k):   # a signal arriving during the VAE's third step
        calls["n"] += 1
        if calls["n"] == 3:
            train.STOP["requested"] = True
        return real(*a, **k)

    monkeypatch.setattr(train.F, "mse_loss", stop_after_three)
    with pytest.raises(SystemExit):
        _run(tmp_path, "--vae-steps", "6", "--steps", "0", "--resume")
    assert torch.load(train.vae_state_path(tmp_path / "state.pt"), weights_only=False)["step"] == 3
    monkeypatch.setattr(train.F, "mse_loss", real)
    _run(tmp_path, "--vae-steps", "6", "--steps", "0", "--resume")
    assert torch.load(train.vae_state_path(tmp_path / "state.pt"), weights_only=False)["step"] == 6
    assert (tmp_path / "model" / "model_index.json").exists()


def test_an_interrupted_unet_run_continues_from_its_state_and_stays_loadable(tmp_path):
    from diffusers import AutoPipelineForText2Image

    _run(tmp_path, "--vae-steps", "2", "--steps", "6", "--max-minutes", "1e-9", "--resume")
    first = torch.load(tmp_path / "state.pt", weights_only=False)["step"]
    assert first == 1   # --max-minutes stops (and checkpoints) after the first step
    info = json.loads((tmp_path / "model" / "training_info.json").read_text())
    assert info["unet_step"] == 1
    _run(tmp_path, "--vae-steps", "2", "--steps", "6", "--resume")
    assert torch.load(tmp_path / "state.pt", weights_only=False)["step"] == 6
    info = json.loads((tmp_path / "model" / "training_info.json").read_text())
    assert info["unet_step"] == 6 and info["min_snr"] == 5
    pipe = AutoPipelineForText2Image.from_pretrained(str(tmp_path / "model"), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    im = pipe("a red star on a blue background", num_inference_steps=2, height=64, width=64,
              generator=torch.Generator().manual_seed(0)).images[0]
    assert im.size == (64, 64)


def test_a_run_whose_state_is_gone_continues_from_its_saved_pipeline(tmp_path):
    """The full state (weights, EMA, optimiser moments) is too big to commit; the pipeline a
    checkpoint leaves in --out is not. --warm-from continues from it at its UNet step."""
    from diffusers import UNet2DConditionModel

    _run(tmp_path, "--vae-steps", "2", "--steps", "4")
    (tmp_path / "state.pt").unlink()
    saved = UNet2DConditionModel.from_pretrained(tmp_path / "model", subfolder="unet").state_dict()
    unet = train.make_unet([16, 16, 32], cross_dim=32, layers_per_block=1, attn_top=False)
    te = train.make_text_encoder(train.build_tokenizer(tmp_path / "tok"), hidden=32, layers=1)
    assert train.warm_start(tmp_path / "model", unet, te) == 4
    assert all(torch.equal(unet.state_dict()[k], v) for k, v in saved.items())

    train.STOP["requested"] = False
    train.main(["--out", str(tmp_path / "model2"), "--state", str(tmp_path / "state2.pt"), *TOY,
                "--steps", "6", "--warm-from", str(tmp_path / "model")])
    info = json.loads((tmp_path / "model2" / "training_info.json").read_text())
    assert info["unet_step"] == 6 and torch.load(tmp_path / "state2.pt", weights_only=False)["step"] == 6


def test_the_learning_rate_ramps_up_again_after_a_warm_start():
    cold = [train.lr_factor(s, 200, 3000) for s in range(1400, 1460)]
    warm = [train.lr_factor(s, 200, 3000, warm_step=1400) for s in range(1400, 1460)]
    assert warm[0] < cold[0] / 10 and warm[-1] == cold[-1]


def test_kind_weights_oversample_the_named_kinds(tmp_path):
    """--kind-weights star=3: a pool sample with a star is drawn three times as often as one without."""
    pool = train.Pool(400)
    assert pool.sample_weights({}) is None
    p = pool.sample_weights(train.parse_kind_weights("star=3"))
    has_star = [any(s.kind == "star" for s in gt.shapes) for gt in pool.gts]
    star_p = {round(float(q) / float(p.min()), 6) for q, h in zip(p, has_star, strict=True) if h}
    other_p = {round(float(q) / float(p.min()), 6) for q, h in zip(p, has_star, strict=True) if not h}
    assert star_p == {3.0} and other_p == {1.0} and abs(p.sum() - 1) < 1e-9
    for bad in ("moon=2", "star", "star=0"):
        with pytest.raises(SystemExit):
            train.parse_kind_weights(bad)
    _run(tmp_path, "--vae-steps", "2", "--steps", "2", "--kind-weights", "star=2,triangle=1.5")
    assert json.loads((tmp_path / "model" / "training_info.json").read_text())["kind_weights"] == "star=2,triangle=1.5"
