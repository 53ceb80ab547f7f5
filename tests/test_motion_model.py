"""The motion module of issue 47 (training/motion_data.py, training/train_motion.py, bench/motion_eval.py,
models/shapes-v2-motion): the procedural clips satisfy the geometric motion judge, held-out
triples stay out of training, the extended text encoder encodes image captions as shapes-v2's does,
and the shipped adapter runs in diffusers' AnimateDiffPipeline. No training; a few seconds."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import motion_eval  # noqa: E402  (bench/motion_eval.py)

from training import motion_data  # noqa: E402

MOTION_DIR = ROOT / "models" / "shapes-v2-motion"


def _clip_of(motion: str, kind: str = "square", index: int = 0) -> motion_data.ClipGT:
    rng = np.random.default_rng([99, index])
    return motion_data.make_clip("red", kind, motion, "blue", rng)


@pytest.mark.parametrize("motion", motion_data.MOTION_NAMES)
def test_each_motion_of_the_grammar_is_judged_right_on_its_ground_truth_clip(motion):
    gt = _clip_of(motion, kind="triangle")
    frames = motion_data.render_clip(gt)
    assert frames.shape == (16, 64, 64, 3) and frames.dtype == np.uint8
    row = motion_eval.judge_clip(frames, motion_eval.want_of(gt))
    assert row["motion_ok"], row
    assert row["kind_ok_frames"] == row["colour_ok_frames"] == row["background_ok_frames"] == 16, row


def test_a_clip_of_one_frame_repeated_is_still_and_shuffled_frames_are_incoherent():
    frames = motion_data.render_clip(_clip_of("right"))
    assert motion_eval.judge_motion(np.repeat(frames[:1], 16, axis=0))["motion"] == "still"
    shuffled = frames[np.random.default_rng(0).permutation(16)]
    assert motion_eval.judge_motion(shuffled)["motion"] == "incoherent"


def test_held_out_triples_never_occur_in_training_clips_and_captions_name_the_motion():
    seen = set()
    for i in range(300):
        _, caption, gt = motion_data.clip(motion_data.TRAIN_SEED, i)
        assert (gt.colour, gt.kind, gt.motion) not in motion_data.HELD_OUT
        assert motion_data.MOTIONS[gt.motion] in caption
        seen.add(gt.motion)
    assert seen == set(motion_data.MOTION_NAMES)
    items = motion_eval.eval_items(16)
    assert all((g.colour, g.kind, g.motion) in motion_data.HELD_OUT for g in items)


@pytest.fixture(scope="module")
def pipe():
    from training.train_motion import load_pipeline

    if not (MOTION_DIR / "config.json").exists():
        pytest.fail(f"{MOTION_DIR} is not shipped")
    return load_pipeline(MOTION_DIR, ROOT / "models" / "shapes-v2")


def test_the_extended_text_encoder_encodes_image_captions_as_shapes_v2_does(pipe):
    from transformers import CLIPTextModel, CLIPTokenizer

    base = ROOT / "models" / "shapes-v2"
    te = CLIPTextModel.from_pretrained(base, subfolder="text_encoder")
    tok = CLIPTokenizer.from_pretrained(base, subfolder="tokenizer")
    caps = ["a red circle on a blue background", "a small green star and a large white heart on a black background"]
    with torch.no_grad():
        want = te(tok(caps, padding="max_length", max_length=24, return_tensors="pt").input_ids)[0]
        got = pipe.text_encoder(pipe.tokenizer(caps, padding="max_length", max_length=24, return_tensors="pt").input_ids)[0]
    torch.testing.assert_close(got, want)
    unk = pipe.tokenizer.convert_tokens_to_ids("<|unk|>")
    for word in motion_data.vocabulary():
        ids = pipe.tokenizer(word, add_special_tokens=False).input_ids
        assert len(ids) == 1 and ids[0] != unk, word


def test_the_shipped_adapter_makes_16_frames_of_64x64_in_animatediff_pipeline(pipe):
    torch.set_num_threads(1)
    out = pipe(prompt="a yellow square bouncing on a black background", num_frames=16, height=64, width=64,
               num_inference_steps=2, guidance_scale=6.0, generator=torch.Generator().manual_seed(0), output_type="np")
    frames = np.asarray(out.frames[0])
    assert frames.shape == (16, 64, 64, 3)
    assert np.isfinite(frames).all()


def test_the_shipped_motion_model_stays_under_its_size_bound():
    size = sum(f.stat().st_size for f in MOTION_DIR.rglob("*") if f.is_file())
    assert 0 < size <= 16 * 1024 * 1024, size   # README: models/shapes-v2-motion <= 16 MB


def test_the_caption_conditioner_starts_as_a_no_op_learns_through_its_hooks_and_round_trips(pipe, tmp_path):
    """gpu_tasks/motion_text.py: fresh (zero projections) it leaves the UNet's output exactly as
    it was; with weights it changes it per caption; saved and attached, it gives the same output."""
    from diffusers import MotionAdapter, UNet2DConditionModel, UNetMotionModel

    from gpu_tasks import motion_text

    def bare_unet():  # the adapter over shapes-v2, without the conditioner the folder may ship
        return UNetMotionModel.from_unet2d(UNet2DConditionModel.from_pretrained(ROOT / "models" / "shapes-v2", subfolder="unet"),
                                           MotionAdapter.from_pretrained(MOTION_DIR)).float().eval()

    torch.set_num_threads(1)
    unet = bare_unet()
    torch.manual_seed(0)
    sample = torch.randn(2, 4, 8, 16, 16)
    states = torch.randn(2, 24, pipe.text_encoder.config.hidden_size).repeat_interleave(8, dim=0)
    with torch.no_grad():
        bare = unet(sample, 500, encoder_hidden_states=states).sample
        cond = motion_text.for_unet(unet, pipe.text_encoder.config.hidden_size)
        handles = motion_text.hook(unet, cond)
        torch.testing.assert_close(unet(sample, 500, encoder_hidden_states=states).sample, bare)
        for proj in cond.out:
            proj.weight.normal_(0, 0.05)
        moved = unet(sample, 500, encoder_hidden_states=states).sample
        assert (moved - bare).abs().max() > 1e-3
        for h in handles:
            h.remove()
        motion_text.save(cond, tmp_path)
        again = bare_unet()
        assert motion_text.attach(again, tmp_path) is not None
        torch.testing.assert_close(again(sample, 500, encoder_hidden_states=states).sample, moved, atol=2e-3, rtol=1e-2)
    assert motion_text.attach(again, tmp_path / "none") is None
