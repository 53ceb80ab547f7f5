"""The served models: which versions a job may name, where each loads from, and its serving
profile (default steps and guidance, the steps it is meant for).

The deployment's own version (IMAGEGEN_MODEL_VERSION at IMAGEGEN_MODEL_PATH) is the default;
IMAGEGEN_EXTRA_MODELS adds others that a job selects with its `model` field (by default the
shipped distilled student, models/shapes-v1-lcm, beside the shipped teacher). Each version runs
on its own lane (scheduling/lanes.py: the default on gpu.<name>, any other on
gpu.<name>@<version>), so it has its own batches, cache keys, estimates and metrics. A
canary version (IMAGEGEN_CANARY_VERSION) is not selectable: it takes a share of the default's
traffic instead.

A model folder may carry `serving.json` with its profile:

    {"default_steps": 4, "guidance_scale": 1.0, "max_steps": 8, "label": "fast (distilled)",
     "quality_steps": {"low": 2, "medium": 4, "high": 8}, "batch_caps": {"64x64": 8}, "fill_wait": 0.1,
     "negative_prompt": false}

Absent keys fall back to the deployment's defaults (IMAGEGEN_DEFAULT_STEPS, IMAGEGEN_BATCH_CAPS,
IMAGEGEN_FILL_WAIT, IMAGEGEN_DEGRADE_STEPS and so on). `degrade_steps`: what an `allow_degrade`
job on this model is lowered to under load (the fewest steps at which it still draws what it is
asked; measured with bench/model_eval.py). `steer: false`: the policy's steering is not applied to
this model (shapes-v1: it drew no more ordinary prompts' images with it, bench/image_gate_eval.py).
`min_steps`: the fewest steps at which it still draws what it is asked (fewer is a 400 naming
`steps`; the tiers', the default and the degraded steps never go below it), and `student`: a served
few-step version the 400 suggests instead (models/shapes-v2: 12 and shapes-v2-lcm; below 12 its
blobs were read as stars and hearts by the image gate, issue 46).
`batch_caps` and `fill_wait` are what `manage.py measure_batch_caps
--model-version V` suggests for that model (scheduling/scheduler.py applies them per version).
`video`: the model draws clips, not images (`{"frames": 16, "fps": 8, "base": "../shapes-v2"}`: a
motion module in the AnimateDiff way beside the image model it animates, gpu_tasks/video_model.py);
a job on it has that many frames, its cost is frames x steps, and publish delivers an MP4, a poster and
HLS (docs/video.md). `sizes`: the only sizes of the menu it draws (`["64x64"]`; absent: the whole menu).
`kinds_right`: the measured share of held-out captions whose shape kind the model draws right, per
steps (`{"12": 0.99, "8": 0.83}`; `kinds_right_by` names the command that measured it,
bench/model_eval.py by the geometric judge). Admission under load compares the student's figure at
its steps with the teacher's at its degraded steps (jobs/admission/degrade.py); a model without
figures is never sent a teacher's job.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    version: str
    path: Path
    default_steps: int
    max_steps: int
    guidance_scale: float
    label: str
    default: bool  # the deployment's own version
    quality_steps: dict  # OpenAI quality tier -> steps on this model (jobs/api/openai/compat.py)
    quality_levers: dict  # OpenAI quality tier -> lever variant on this model (gpu_tasks/levers.py)
    batch_caps: dict  # "WxH" -> images per pass (manage.py measure_batch_caps suggests them)
    fill_wait: float | None  # seconds a partial pass waits for more; None: IMAGEGEN_FILL_WAIT
    negative_prompt: bool  # False: the model ignores one (guidance distilled in), so a job with one is a 400
    degrade_steps: int = 0  # steps an allow_degrade job gets under load; 0: IMAGEGEN_DEGRADE_STEPS
    steer: bool = True  # False: the policy's steering is not applied to it (safety/image_policy.py)
    min_steps: int = 1  # fewer steps are refused (a 400 naming `steps`)
    student: str = ""  # a served few-step version to ask for instead of fewer steps than min_steps
    kinds_right: tuple = ()  # ((steps, share of kinds drawn right), ...) measured, fewest steps first
    frames: int = 1  # a video model's frames per clip (1: an image model)
    fps: int = 0  # a video model's frames per second
    base: str = ""  # a video model: the folder of the image model its motion module animates
    sizes: tuple = ()  # ((width, height), ...) the menu sizes it draws; (): every one

    @property
    def is_video(self) -> bool:
        return self.frames > 1

    def kinds_right_at(self, steps: int) -> float | None:
        """The measured kinds-right share at `steps`: the figure of the most steps measured at or
        below it (fewer steps never draw better here), None when none is."""
        return next((share for measured, share in reversed(self.kinds_right) if measured <= steps), None)

    def as_json(self) -> dict:
        return {
            "id": self.version,
            "label": self.label,
            "default": self.default,
            "default_steps": self.default_steps,
            "min_steps": self.min_steps,
            "max_steps": self.max_steps,
            "guidance_scale": self.guidance_scale,
            **({"kind": "video", "frames": self.frames, "fps": self.fps,
                "sizes": [f"{w}x{h}" for w, h in self.sizes]} if self.is_video else {"kind": "image"}),
        }

    def below_floor(self) -> str:
        """Why a job on this model may not ask for fewer than min_steps, and what to ask instead."""
        said = f"{self.version} draws what it is asked from {self.min_steps} steps on: ask for at least {self.min_steps}"
        student = served().get(self.student) if self.student else None
        if student is not None:
            said += f', or for its few-step student ("model": "{student.version}", {student.default_steps} steps)'
        return said


def _profile(path: Path) -> dict:
    try:
        data = json.loads((Path(path) / "serving.json").read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s/serving.json: %s", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def _served_model(version: str, path: Path, default: bool) -> ServedModel:
    # The default version's steps and guidance are the deployment's settings; its batch caps and
    # fill wait may come from its serving.json like any other version's.
    measured = _profile(path)
    # degrade_steps is measured like the caps: the fewest steps at which the model still draws
    # what it is asked (models/shapes-v2: 12; at 8 its kinds drop to 83% by geometry, docs/model.md).
    prof = {k: measured[k] for k in ("batch_caps", "fill_wait", "degrade_steps", "steer", "min_steps", "student",
                                     "kinds_right") if k in measured} if default else measured
    max_steps = min(settings.IMAGEGEN_MAX_STEPS, int(prof.get("max_steps", settings.IMAGEGEN_MAX_STEPS)))
    min_steps = max(settings.IMAGEGEN_MIN_STEPS, min(max_steps, int(prof.get("min_steps", settings.IMAGEGEN_MIN_STEPS))))
    steps = int(prof.get("default_steps", settings.IMAGEGEN_DEFAULT_STEPS))
    return ServedModel(
        version=version,
        path=Path(path),
        default_steps=max(min_steps, min(max_steps, steps)),
        max_steps=max_steps,
        guidance_scale=float(prof.get("guidance_scale", settings.IMAGEGEN_DEFAULT_GUIDANCE)),
        label=str(prof.get("label", version)),
        default=default,
        quality_steps={str(k): int(v) for k, v in dict(prof.get("quality_steps", {})).items()},
        quality_levers={str(k): str(v) for k, v in dict(prof.get("quality_levers", {})).items()},
        batch_caps={str(k): max(1, int(v)) for k, v in dict(prof.get("batch_caps", {})).items()},
        fill_wait=float(prof["fill_wait"]) if prof.get("fill_wait") is not None else None,
        negative_prompt=bool(prof.get("negative_prompt", True)),
        degrade_steps=max(min_steps, min(max_steps, int(prof["degrade_steps"]))) if prof.get("degrade_steps") else 0,
        steer=bool(prof.get("steer", True)),
        min_steps=min_steps,
        student=str(prof.get("student", "")),
        kinds_right=tuple(sorted((int(k), float(v)) for k, v in dict(prof.get("kinds_right", {})).items())),
        **_video(prof, Path(path)),
    )


def _video(prof: dict, path: Path) -> dict:
    """A video model's frames, fps, base image model and sizes from its serving.json."""
    video = prof.get("video") if isinstance(prof.get("video"), dict) else None
    out: dict = {}
    if video:
        out = {"frames": max(2, int(video.get("frames", 16))), "fps": max(1, int(video.get("fps", 8))),
               "base": str((path / str(video.get("base", ""))).resolve()) if video.get("base") else ""}
    sizes = [str(s).lower().split("x") for s in prof.get("sizes", [])]
    out["sizes"] = tuple((int(w), int(h)) for w, h in sizes)
    return out


@lru_cache(maxsize=8)
def _catalogue(key: tuple) -> dict[str, ServedModel]:
    default_version, default_path, extra = key
    models = {default_version: _served_model(default_version, Path(default_path), True)}
    for version, path in extra:
        if version != default_version:
            models[version] = _served_model(version, Path(path), False)
    return models


def key() -> tuple:
    """What the catalogue is derived from (the settings): a cache key for what is built on it."""
    return settings.IMAGEGEN_MODEL_VERSION, str(settings.IMAGEGEN_MODEL_PATH), tuple(sorted(settings.IMAGEGEN_EXTRA_MODELS.items()))


def served() -> dict[str, ServedModel]:
    """Every selectable version, the default first."""
    return _catalogue(key())


def default() -> ServedModel:
    return served()[settings.IMAGEGEN_MODEL_VERSION]


def get(version: str | None) -> ServedModel | None:
    """The served model named `version` (None or "": the default); None if not served."""
    if not version:
        return default()
    return served().get(version)


def path_for(version: str) -> Path:
    """Where a GPU worker loads `version` from: the catalogue's path, or the worker's own
    IMAGEGEN_MODEL_PATH for its own version (a canary worker is started with the canary's)."""
    found = served().get(version)
    if found is None:
        raise LookupError(f"model version {version!r} is not served here (IMAGEGEN_MODEL_VERSION, IMAGEGEN_EXTRA_MODELS)")
    return found.path


def version_of_lane(lane: str) -> str:
    """The model version a lane serves (the inverse of lanes.lane_of)."""
    name = settings.IMAGEGEN_MODEL_NAME
    if lane == name:
        return settings.IMAGEGEN_MODEL_VERSION
    if lane.startswith(name + "@"):
        return lane[len(name) + 1:]
    return lane
