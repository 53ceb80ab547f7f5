"""A video's output gate (safety/frame_gate.py): the shipped image classifier judges the frames the
policy names; one star frame in sixteen blocks the clip, one heart frame holds it, a clip of circles
passes; the stride samples the first and the last frame; a broken classifier or an empty clip
fails closed."""

from __future__ import annotations

from pathlib import Path

import pytest

from safety import frame_gate, image_gate
from safety.image_gate import ImageGateError
from training.shapes_data import SampleGT, ShapeGT, render_frame

SHIPPED = Path(__file__).resolve().parent.parent / "models" / "shapes-classifier-v3"


@pytest.fixture(autouse=True)
def shipped_classifier(settings):
    image_gate._loaded.clear()
    settings.IMAGEGEN_IMAGE_CLASSIFIER = f"shapes:{SHIPPED}"
    yield
    image_gate._loaded.clear()


def frame(kind: str, x: float) -> object:
    return render_frame(SampleGT("blue", [ShapeGT(kind, "yellow", "large", x, 32.0, 14.0)]), 64, 64)


def clip(odd: dict[int, str] | None = None, frames: int = 16) -> list:
    """A yellow circle moving right; `odd` puts another shape in some frames."""
    odd = odd or {}
    return [frame(odd.get(i, "circle"), 18 + i * 2) for i in range(frames)]


def test_a_clip_of_circles_is_allowed_and_every_frame_was_judged():
    verdict = frame_gate.judge_frames(clip())
    assert verdict.decision == "allow", verdict.judgement.reason
    assert verdict.judged == tuple(range(16)), "the shipped policy judges every frame"


def test_one_star_frame_blocks_the_clip_and_the_reason_names_it():
    verdict = frame_gate.judge_frames(clip({9: "star"}))
    assert verdict.decision == "block" and verdict.frame == 9
    assert verdict.judgement.reason.startswith("frame 9 of 16:")
    assert [j.decision for j in verdict.per_frame].count("block") == 1


def test_one_heart_frame_holds_the_clip():
    verdict = frame_gate.judge_frames(clip({4: "heart"}))
    assert verdict.decision == "review" and verdict.frame == 4


def test_a_star_beside_a_heart_blocks():
    assert frame_gate.judge_frames(clip({2: "heart", 12: "star"})).decision == "block"


def test_the_stride_judges_every_kth_frame_and_the_first_and_last():
    assert frame_gate.sampled(16, 4) == (0, 4, 8, 12, 15)
    assert frame_gate.sampled(16, 1) == tuple(range(16))
    assert frame_gate.sampled(1, 3) == (0,)
    verdict = frame_gate.judge_frames(clip({15: "star"}), stride=4)
    assert verdict.decision == "block" and verdict.frame == 15, "the last frame is always judged"
    # What the stride skips it does not see: the declared cost of k > 1 (bench/ measures it).
    assert frame_gate.judge_frames(clip({5: "star"}), stride=4).decision == "allow"


def test_the_stride_is_read_from_the_policy(settings, tmp_path):
    import json

    policy = json.loads(Path(settings.IMAGEGEN_SAFETY_POLICY).read_text())
    policy["image"]["frame_stride"] = 8
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy))
    settings.IMAGEGEN_SAFETY_POLICY = str(path)
    assert image_gate.image_policy().frame_stride == 8
    assert frame_gate.judge_frames(clip()).judged == (0, 8, 15)
    policy["image"]["frame_stride"] = 0
    path.write_text(json.dumps(policy))
    from safety.image_policy import ImagePolicyError, load_image_policy

    with pytest.raises(ImagePolicyError, match="frame_stride"):
        load_image_policy(path)


def test_it_fails_closed(settings):
    with pytest.raises(ImageGateError):
        frame_gate.judge_frames([])
    settings.IMAGEGEN_IMAGE_CLASSIFIER = "shapes:/nonexistent/classifier"
    image_gate._loaded.clear()
    with pytest.raises(ImageGateError):
        frame_gate.judge_frames(clip(frames=4))
