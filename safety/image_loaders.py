"""Loading one image classifier from its spec (one entry of IMAGEGEN_IMAGE_CLASSIFIER).

  shapes:<dir>        the small CNN shipped with the repo (models/shapes-classifier-v2)
  hf:<dir>            a transformers image-classification checkpoint + its processor
  sd-safety:<dir>     diffusers' StableDiffusionSafetyChecker with a CLIP image processor
  nudenet[:<onnx>]    NudeNet's detector (optional `nudenet` wheel + onnxruntime), safety/nudenet_classifier.py
  python:<mod>:<cls>[:<arg>]  any class with from_spec(arg), `labels` and scores(images)
  none                explicit opt-out (handled by the gate, not here)

Every classifier says which labels it can produce (``labels``) and which policy sections apply
to it (``policy_keys``, most specific first), so the gate can refuse a policy the classifier
cannot answer before any image is judged.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from PIL import Image


class ImageClassifier(Protocol):
    # Read-only members (properties), so a classifier may declare them as plain attributes.
    @property
    def version(self) -> str: ...

    @property
    def labels(self) -> Sequence[str]: ...

    @property
    def policy_keys(self) -> Sequence[str]: ...

    def scores(self, images: list[Image.Image]) -> list[dict[str, float]]: ...


class SpecError(ValueError):
    """The spec itself is wrong (unknown kind, a python class that declares no labels)."""


class HFImageClassifier:
    def __init__(self, path: str):
        from transformers import AutoImageProcessor, AutoModelForImageClassification

        self.processor = AutoImageProcessor.from_pretrained(path, local_files_only=True)
        self.model = AutoModelForImageClassification.from_pretrained(path, local_files_only=True).eval()
        name = Path(path).name
        self.version = f"hf:{name}"
        self.policy_keys = (self.version, "hf")
        id2label = self.model.config.id2label
        self.labels = tuple(id2label[i] for i in sorted(id2label))

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


class SDSafetyChecker:
    """diffusers' StableDiffusionSafetyChecker: one label, "nsfw", scored 1.0 when flagged.

    Its own boolean is the only output it gives; it is read as a score, never as "safe" when
    it is missing.
    """

    labels = ("nsfw",)

    def __init__(self, path: str):
        from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
        from transformers import CLIPImageProcessor

        root = Path(path)
        checker_dir = root / "safety_checker" if (root / "safety_checker").exists() else root
        processor_dir = root / "feature_extractor" if (root / "feature_extractor").exists() else root
        self.checker = StableDiffusionSafetyChecker.from_pretrained(str(checker_dir), local_files_only=True).eval()
        self.processor = CLIPImageProcessor.from_pretrained(str(processor_dir), local_files_only=True)
        self.version = f"sd-safety:{root.name}"
        self.policy_keys = (self.version, "sd-safety")

    def scores(self, images):
        import numpy as np
        import torch

        clip_input = self.processor(images=[im.convert("RGB") for im in images], return_tensors="pt").pixel_values
        arrays = np.stack([np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0 for im in images])
        with torch.inference_mode():
            _, flagged = self.checker(images=arrays, clip_input=clip_input)
        if flagged is None or len(flagged) != len(images):
            return None  # the gate turns this into "no usable result"
        return [{"nsfw": 1.0 if bool(f) else 0.0} for f in flagged]


def load(spec: str, device: str = "cpu", threads: int = 1) -> ImageClassifier:
    kind, _, arg = spec.partition(":")
    if kind == "shapes":
        from safety.shapes_classifier import ShapesClassifier

        return ShapesClassifier.from_pretrained(arg, device=device)
    if kind == "hf":
        return HFImageClassifier(arg)
    if kind == "sd-safety":
        return SDSafetyChecker(arg)
    if kind == "nudenet":
        from safety.nudenet_classifier import NudeNetClassifier

        return NudeNetClassifier.from_spec(arg, threads=threads)
    if kind == "python":
        module_name, _, rest = arg.partition(":")
        class_name, _, class_arg = rest.partition(":")
        cls = getattr(importlib.import_module(module_name), class_name)
        classifier = cls.from_spec(class_arg)
        labels = getattr(classifier, "labels", None)
        if not labels or isinstance(labels, str) or not all(isinstance(x, str) for x in labels):
            raise SpecError(f"{module_name}.{class_name} must declare `labels` (the label names it can produce), "
                            f"so that the policy can be checked against it; got {labels!r}")
        if not getattr(classifier, "policy_keys", None):
            classifier.policy_keys = (str(classifier.version),)
        return classifier
    raise SpecError(f"unknown image classifier {spec!r} (expected shapes:, hf:, sd-safety:, nudenet, python: or none)")
