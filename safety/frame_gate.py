"""The output gate for a video: its frames judged by the image gate, the worst frame deciding.

`judge_frames(frames)` sends the frames the policy names (every `image.frame_stride`-th one, and
the first and the last; a stride of 1, the shipped policy's, is every frame) to
`safety.image_gate.judge` in one batched call, and answers one `ClipJudgement`: the worst
decision of any judged frame (block > review > allow; among equals the higher score, then the
earlier frame). One frame blocked blocks the clip; one held holds it. It fails closed like the
image gate: `ImageGateError` (nothing delivered) for anything the gate cannot judge, and an empty
clip is an error, never an allow. The same call judges a clip's preview frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image

from safety import image_gate
from safety.image_gate import ImageGateError, ImageJudgement

_RANK = {"allow": 0, "review": 1, "block": 2}


@dataclass(frozen=True)
class ClipJudgement:
    judgement: ImageJudgement  # the deciding frame's (its reason names the frame)
    frame: int  # the deciding frame's index
    judged: tuple[int, ...]  # the frames the gate looked at
    per_frame: tuple[ImageJudgement, ...]  # one per judged frame, in the order of `judged`

    @property
    def decision(self) -> str:
        return self.judgement.decision


def sampled(count: int, stride: int) -> tuple[int, ...]:
    """The frames judged of a clip of `count`: every stride-th one, the first and the last."""
    if count < 1:
        raise ValueError("a clip has at least one frame")
    if stride < 1:
        raise ValueError("the frame stride is at least 1")
    return tuple(sorted({*range(0, count, stride), count - 1}))


def judge_frames(frames: Sequence[Image.Image], stride: int | None = None) -> ClipJudgement:
    """The clip's judgement (see the module's docstring); `stride` overrides the policy's."""
    if not frames:
        raise ImageGateError("a clip without frames cannot be judged")
    k = image_gate.image_policy().frame_stride if stride is None else stride
    judged = sampled(len(frames), k)
    answers = image_gate.judge([frames[i] for i in judged])
    if len(answers) != len(judged):
        raise ImageGateError(f"the image gate answered {len(answers)} judgements for {len(judged)} frames")
    worst = max(range(len(judged)), key=lambda j: (_RANK[answers[j].decision], answers[j].score or 0.0, -j))
    chosen = answers[worst]
    if chosen.decision != "allow":
        from dataclasses import replace

        chosen = replace(chosen, reason=f"frame {judged[worst]} of {len(frames)}: {chosen.reason}")
    return ClipJudgement(chosen, judged[worst], judged, tuple(answers))
