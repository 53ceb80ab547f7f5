"""The output-image gate: every generated image is classified before anyone can see it.

One interface (images in, per-image label scores out) with implementations chosen by the
IMAGEGEN_IMAGE_CLASSIFIER setting:

  shapes:<dir>        the small CNN shipped with the repo (models/shapes-classifier-v1)
  hf:<dir>            a transformers image-classification checkpoint + its processor
  sd-safety:<dir>     diffusers' StableDiffusionSafetyChecker with a CLIP image processor
  python:<mod>:<cls>  any class with from_spec(arg) and scores(images), for operators' own models
  none                explicit opt-out: images are delivered and every verdict says "unchecked"

It fails closed: an unset or broken setting, a load error, an exception, a result of None or of
the wrong length raises ImageGateError, and the caller delivers nothing.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from django.conf import settings
from PIL import Image

from imagegen import metrics

log = logging.getLogger(__name__)


class ImageGateError(RuntimeError):
    """The gate could not judge the images; nothing may be delivered."""


class ImageClassifier(Protocol):
    version: str

    def scores(self, images: list[Image.Image]) -> list[dict[str, float]]: ...


@dataclass(frozen=True)
class ImageJudgement:
    decision: str  # allow | review | block
    category: str
    score: float | None
    reason: str
    version: str


class _HFImageClassifier:
    def __init__(self, path: str):
        from transformers import AutoImageProcessor, AutoModelForImageClassification

        self.processor = AutoImageProcessor.from_pretrained(path, local_files_only=True)
        self.model = AutoModelForImageClassification.from_pretrained(path, local_files_only=True).eval()
        self.version = f"hf:{Path(path).name}"

    def scores(self, images):
        import torch

        inputs = self.processor(images=[im.convert("RGB") for im in images], return_tensors="pt")
        with torch.inference_mode():
            logits = self.model(**inputs).logits
        if self.model.config.problem_type == "multi_label_classification":
            probs = torch.sigmoid(logits)
        else:
            probs = torch.softmax(logits, dim=-1)
        labels = self.model.config.id2label
        return [{labels[i]: float(p[i]) for i in range(p.shape[0])} for p in probs]


class _SDSafetyChecker:
    """diffusers' StableDiffusionSafetyChecker: one label, "nsfw", scored 1.0 when flagged.

    Its own boolean is the only output it gives; it is read as a score, never as "safe" when
    it is missing.
    """

    def __init__(self, path: str):
        from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
        from transformers import CLIPImageProcessor

        root = Path(path)
        checker_dir = root / "safety_checker" if (root / "safety_checker").exists() else root
        processor_dir = root / "feature_extractor" if (root / "feature_extractor").exists() else root
        self.checker = StableDiffusionSafetyChecker.from_pretrained(str(checker_dir), local_files_only=True).eval()
        self.processor = CLIPImageProcessor.from_pretrained(str(processor_dir), local_files_only=True)
        self.version = f"sd-safety:{root.name}"

    def scores(self, images):
        import numpy as np
        import torch

        clip_input = self.processor(images=[im.convert("RGB") for im in images], return_tensors="pt").pixel_values
        arrays = np.stack([np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0 for im in images])
        with torch.inference_mode():
            _, flagged = self.checker(images=arrays, clip_input=clip_input)
        if flagged is None or len(flagged) != len(images):
            raise ImageGateError("the safety checker returned no decision")
        return [{"nsfw": 1.0 if bool(f) else 0.0} for f in flagged]


def _load(spec: str) -> ImageClassifier | None:
    kind, _, arg = spec.partition(":")
    if kind == "none":
        return None
    if kind == "shapes":
        from safety.shapes_classifier import ShapesClassifier

        return ShapesClassifier.from_pretrained(arg, device=settings.IMAGEGEN_DEVICE)
    if kind == "hf":
        return _HFImageClassifier(arg)
    if kind == "sd-safety":
        return _SDSafetyChecker(arg)
    if kind == "python":
        module_name, _, rest = arg.partition(":")
        class_name, _, class_arg = rest.partition(":")
        cls = getattr(importlib.import_module(module_name), class_name)
        return cls.from_spec(class_arg)
    raise ImageGateError(f"unknown image classifier {spec!r}")


_lock = threading.Lock()
# The classifier runs in a helper thread so that a hung model times out instead of holding the
# batch forever; a hung call leaves that thread busy and later calls queue behind it (and time
# out too, failing closed) until the worker is restarted.
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="image-gate")
_loaded: dict[str, ImageClassifier | None] = {}


def get_classifier() -> ImageClassifier | None:
    spec = settings.IMAGEGEN_IMAGE_CLASSIFIER.strip()
    if not spec:
        raise ImageGateError("no image classifier is configured (set IMAGEGEN_IMAGE_CLASSIFIER)")
    with _lock:
        if spec not in _loaded:
            try:
                _loaded[spec] = _load(spec)
            except ImageGateError:
                raise
            except Exception as exc:
                raise ImageGateError(f"the image classifier {spec!r} could not be loaded: {exc}") from exc
        return _loaded[spec]


def _image_thresholds() -> dict:
    try:
        policy = json.loads(Path(settings.IMAGEGEN_SAFETY_POLICY).read_text())
        return policy.get("image", {}).get("labels", {}), policy.get("version", "")
    except Exception as exc:
        raise ImageGateError(f"the safety policy could not be read: {exc}") from exc


def judge(images: list[Image.Image]) -> list[ImageJudgement]:
    """One judgement per image, or ImageGateError. Never returns "allow" on doubt."""
    classifier = get_classifier()
    if classifier is None:
        return [
            ImageJudgement("allow", "unchecked", None, "unchecked: the image classifier is disabled by the operator", "none")
            for _ in images
        ]
    started = time.monotonic()
    try:
        scores = _POOL.submit(classifier.scores, images).result(timeout=settings.IMAGEGEN_CLASSIFIER_TIMEOUT)
    except ImageGateError:
        raise
    except concurrent.futures.TimeoutError as exc:
        raise ImageGateError(
            f"the image classifier did not answer within {settings.IMAGEGEN_CLASSIFIER_TIMEOUT:g}s"
        ) from exc
    except Exception as exc:
        raise ImageGateError(f"the image classifier failed: {type(exc).__name__}: {exc}") from exc
    metrics.observe("imagegen_classifier_seconds", time.monotonic() - started)
    if scores is None or len(scores) != len(images) or any(not isinstance(s, dict) for s in scores):
        raise ImageGateError("the image classifier returned no usable result")
    labels, policy_version = _image_thresholds()
    version = f"{classifier.version}+{policy_version}"
    out = []
    for per_image in scores:
        decision, category, score, reason = "allow", "", max(per_image.values(), default=0.0), ""
        for label, rule in labels.items():
            value = per_image.get(label)
            if value is None:
                continue
            if value >= rule.get("block", 2.0):
                if decision != "block" or value > score:
                    decision, category, score = "block", rule.get("category", label), value
                    reason = f"The image was classified as {rule.get('category', label)} (score {value:.2f})."
            elif value >= rule.get("review", 2.0) and decision == "allow":
                decision, category, score = "review", rule.get("category", label), value
                reason = f"The image is held for review: it may show {rule.get('category', label)} (score {value:.2f})."
        out.append(ImageJudgement(decision, category, float(score), reason, version))
    return out
