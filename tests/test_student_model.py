"""The distilled student (models/shapes-v1-lcm, issue 22) and its training script.

No database. The student checks load the shipped directory offline; the evaluation figures are a
small live sample of what ``bench/model_eval.py --compare`` reports in full
(bench/results/model_eval_student.json), asserted at looser bounds than the goal. The training
check runs training/distill.py end to end at a toy size against the shipped teacher and checks
that an interrupted run resumes to exactly the state of an uninterrupted one.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
STUDENT = ROOT / "models" / "shapes-v1-lcm"
TEACHER = ROOT / "models" / "shapes-v1"
N_CAPTIONS = 24
IGNORED = ("time_cond_proj_dim", "_diffusers_version", "_name_or_path")

needs_student = pytest.mark.skipif(not (STUDENT / "model_index.json").exists(),
                                reason=f"distilled student missing: {STUDENT} (python -m training.distill)")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _load(path: Path):
    from diffusers import AutoPipelineForText2Image

    p = AutoPipelineForText2Image.from_pretrained(str(path), local_files_only=True)
    p.set_progress_bar_config(disable=True)
    return p


@pytest.fixture(scope="module")
def student():
    return _load(STUDENT)


def _image(pipe, prompt: str, seed: int, steps: int = 4) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    return np.asarray(pipe(prompt, num_inference_steps=steps, guidance_scale=6.0, height=64, width=64,
                           generator=g).images[0])


@needs_student
def test_layout_scheduler_and_info():
    from diffusers import AutoencoderKL

    index = json.loads((STUDENT / "model_index.json").read_text())
    assert index["scheduler"] == ["diffusers", "LCMScheduler"]
    sched = json.loads((STUDENT / "scheduler" / "scheduler_config.json").read_text())
    assert sched["prediction_type"] == "v_prediction" and sched["original_inference_steps"] == 20
    unet = json.loads((STUDENT / "unet" / "config.json").read_text())
    teacher_unet = json.loads((TEACHER / "unet" / "config.json").read_text())
    assert unet["time_cond_proj_dim"] == 256          # guidance is an input, not a second pass
    assert {k: v for k, v in unet.items() if k not in IGNORED} == \
        {k: v for k, v in teacher_unet.items() if k not in IGNORED}
    # the VAE is the teacher's, so the teacher's preview map is the student's
    assert (STUDENT / "preview_decoder.json").read_text() == (TEACHER / "preview_decoder.json").read_text()
    sv = AutoencoderKL.from_pretrained(STUDENT, subfolder="vae", local_files_only=True).state_dict()
    tv = AutoencoderKL.from_pretrained(TEACHER, subfolder="vae", local_files_only=True).state_dict()
    assert sv.keys() == tv.keys() and all(torch.equal(sv[k], tv[k]) for k in sv)
    info = json.loads((STUDENT / "training_info.json").read_text())
    assert info["student_step"] > 0 and info["train_wall_s"] > 0
    assert info["command"].startswith("python -m training.distill")
    assert info["default_inference_steps"] == 4
    size = sum(f.stat().st_size for f in STUDENT.rglob("*") if f.is_file())
    assert size < 16 * 2 ** 20, f"student is {size / 2 ** 20:.1f} MiB"


@needs_student
def test_loads_offline_deterministic_one_pass_per_step(student):
    calls: list[int] = []
    hook = student.unet.register_forward_hook(lambda m, args, out: calls.append(args[0].shape[0]))
    try:
        a = _image(student, "a large yellow star on a green background", seed=3)
    finally:
        hook.remove()
    assert calls == [1, 1, 1, 1], "4 steps at guidance 6 must be 4 single (unguided-batch) UNet passes"
    b = _image(student, "a large yellow star on a green background", seed=3)
    c = _image(student, "a large yellow star on a green background", seed=4)
    assert a.shape == (64, 64, 3)
    assert np.array_equal(a, b), "same seed must give the same pixels"
    assert not np.array_equal(a, c), "another seed must give another image"
    for w, h in ((96, 64), (96, 96)):                  # the menu's other sizes run
        im = student("a red circle on a blue background", num_inference_steps=2, guidance_scale=6.0,
                     height=h, width=w, generator=torch.Generator().manual_seed(0)).images[0]
        assert im.size == (w, h)


@needs_student
def test_evaluation_figures_at_looser_bounds(student):
    """Student at 4 and 1 steps on held-out captions. The full run (200 captions) is in
    bench/results/model_eval_student.json; these bounds sit well below it so that a broken student
    (an untrained student at 1 step, or a scheduler mismatch, gives noise or blobs) fails."""
    from bench.model_eval import eval_captions, figures, generate
    from safety.shapes_classifier import ShapesClassifier

    items = eval_captions(N_CAPTIONS)
    clfs = {"v1": ShapesClassifier.from_pretrained(ROOT / "models" / "shapes-classifier-v1")}
    for steps in (4, 1):                               # full run: 64.5% / 72.5% kinds, 99.5% / 100% colours
        images, _ = generate(student, items, steps, 6.0, N_CAPTIONS)
        f = figures(items, images, clfs)
        assert f["shape_colour_accuracy"] >= 0.85, (steps, f)
        assert f["background_colour_accuracy"] >= 0.85, (steps, f)
        assert f["shape_kind_accuracy_v1"] >= 0.45, (steps, f)


def test_distill_runs_and_resumes_exactly(tmp_path):
    """A toy run of the real script against the shipped teacher: 4 steps straight, or 2 steps,
    stop, and the same command again, reach the same student weights, and both export a loadable
    few-step pipeline."""
    from training import distill

    def run(name: str, steps: int) -> Path:
        d = tmp_path / name
        distill.main(["--teacher", str(TEACHER), "--run", str(d / "run"), "--out", str(d / "out"),
                      "--steps", str(steps), "--batch", "4", "--shard-size", "4", "--initial-shards", "1",
                      "--shard-every", "2", "--trajectories", "8", "--val-size", "2", "--judge-size", "4",
                      "--ckpt-minutes", "100"])
        return d

    straight = run("straight", 4)
    run("resumed", 2)
    resumed = run("resumed", 4)
    a = torch.load(straight / "run" / "state.pt", weights_only=False)
    b = torch.load(resumed / "run" / "state.pt", weights_only=False)
    assert a["step"] == b["step"] == 4
    assert sorted(p.name for p in (resumed / "run" / "traj").iterdir()) == ["train_000.pt", "train_001.pt", "val_000.pt"]
    for k in a["student"]:
        assert torch.equal(a["student"][k], b["student"][k]), k
    # the guidance embedding starts at zero (student == teacher) and is learnt
    assert a["student"]["time_embedding.cond_proj.weight"].abs().sum() > 0
    logs = [json.loads(line)["step"] for line in (resumed / "run" / "log.jsonl").read_text().splitlines()]
    assert logs == [0, 2, 4]
    pipe = _load(resumed / "out")
    assert type(pipe.scheduler).__name__ == "LCMScheduler"
    info = json.loads((resumed / "out" / "training_info.json").read_text())
    assert info["steps_run"] == 4 and info["trajectories"] == 8
    assert _image(pipe, "a red circle on a blue background", seed=0, steps=2).shape == (64, 64, 3)


def test_a_student_can_learn_the_steered_teacher_on_prompts_outside_the_grammar():
    """training/distill.py Mix: the teacher's prompts include out-of-grammar ones at the asked
    share (deterministic per shard), and it is steered away from every steered kind the caption
    does not name, as the service steers it (safety/policy.json image.steer)."""
    from training.classifier_data import TRAIN_OOV
    from training.distill import Mix, shard_captions

    mix = Mix(0.25, ("star", "heart"))
    assert mix.negative("a red circle on a blue background") == "a star and a heart"
    assert mix.negative("a small red star on a blue background") == "a heart"
    assert mix.negative("a red heart and a blue star on a white background") == ""
    caps = shard_captions(777, 0, 400, mix)
    assert caps == shard_captions(777, 0, 400, mix)
    oov = sum(c in TRAIN_OOV for c in caps)
    assert 60 <= oov <= 140, oov
    plain = shard_captions(777, 0, 400)
    assert not any(c in TRAIN_OOV for c in plain)
    assert [c for c, p in zip(caps, plain, strict=True) if c not in TRAIN_OOV] == \
        [p for c, p in zip(caps, plain, strict=True) if c not in TRAIN_OOV], "the in-grammar captions are unchanged"
