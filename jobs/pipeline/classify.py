"""The classify stage (the classify queue): the image gate on a batch's quarantined images, one
verdict per image, then the batch moves on to publish.

A video's row is its clip's frames side by side (gpu_tasks/video_model.py): the gate judges its
frames (safety/frame_gate.py: every `image.frame_stride`-th one, the first and the last) and the
worst frame decides the clip's one verdict; a strip that is not the job's frames wide is a gate
error (not delivered).

Its workers read the images from quarantine (the bytes never pass through the broker). In
production they are pinned to a GPU (IMAGEGEN_DEVICE) or run on a cheap fleet; in the embedded
default a worker of its own serves the classify queue, so a slow gate delays no prompt check.
"""

from __future__ import annotations

import logging

from PIL import Image

from jobs import actions
from jobs.media.storage import quarantine_storage
from jobs.media.video import frames_of
from jobs.models import Batch, BatchStage
from jobs.pipeline import stages
from safety import frame_gate, image_gate

log = logging.getLogger(__name__)

def _load(key: str) -> Image.Image:
    with quarantine_storage().open(key, "rb") as f:
        image = Image.open(f)
        image.load()
    return image.convert("RGB")


def _judge(images: list[Image.Image]) -> tuple[list | None, str]:
    """The gate's judgements, or None and why: tried once. Its errors are a broken setting, a
    malformed answer or a timeout (whose run cannot be stopped: a second try at once would run
    beside it), so the batch fails closed now; storage errors reading the images are the
    stage's to retry (its row's retry options)."""
    if not images:
        return [], ""
    try:
        return image_gate.judge(images), ""
    except image_gate.ImageGateError as exc:
        log.warning("the image gate failed: %s", exc)
        return None, str(exc)


def _judge_rows(rows, pictures: list[Image.Image]) -> tuple[list | None, str]:
    """One judgement per row: the stills in one batched call of the gate, each clip by its frames."""
    clips = {i: row.job.frames for i, row in enumerate(rows) if row.job.frames > 1}
    stills, gate_error = _judge([p for i, p in enumerate(pictures) if i not in clips])
    if stills is None:
        return None, gate_error
    out, still = [], iter(stills)
    for i, picture in enumerate(pictures):
        if i not in clips:
            out.append(next(still))
            continue
        try:
            frames = [Image.fromarray(frame) for frame in frames_of(picture, clips[i])]
            out.append(frame_gate.judge_frames(frames).judgement)
        except (image_gate.ImageGateError, ValueError) as exc:
            log.warning("the image gate failed on a clip: %s", exc)
            return None, str(exc)
    return out, ""


def classify(batch_id: str) -> bool:
    """Judge the batch; True when it moved on to publish (False: judged already, held by another
    run, or this run lost its lease: a duplicate or stale run records nothing)."""
    return bool(stages.run("classify", batch_id, lambda run: _classify(batch_id, run)))


def _classify(batch_id: str, run: str) -> bool:
    from safety.gate_identity import gate_identity
    from safety.models import SafetyVerdict

    batch = Batch.objects.filter(id=batch_id, stage=BatchStage.CLASSIFY).first()
    if batch is None:
        return False
    rows = actions.live_images(batch)
    pictures = [_load(row.storage_key) for row in rows]  # storage errors propagate: the task retries
    judgements, gate_error = _judge_rows(rows, pictures) if pictures else ([], "")
    verdicts = [] if judgements is None else [
        SafetyVerdict(
            job_id=row.job_id, image=row, image_index=row.index, stage="image", decision=j.decision,
            # The reason is what the person who asked is told (the policy's sentence); the
            # classifier's detail (label, score, threshold) is kept for moderators.
            category=j.category, score=j.score, reason=j.user_reason or j.reason, notes=j.reason,
            policy_version=j.version, classifier=gate_identity(),
        )
        for row, j in zip(rows, judgements, strict=True)
    ]
    return actions.record_verdicts(batch_id, run, verdicts, gate_error)
