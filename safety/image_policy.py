"""The output-image part of the safety policy file, read and validated.

    "image": {
      "labels": {"star": {"category": "demo_forbidden", "review": 0.35, "block": 0.6}},
      "classifiers": {
        "shapes-classifier-v2": {"labels": {"star": {...}, "heart": {...}}},
        "nudenet": {"labels": {"FEMALE_GENITALIA_EXPOSED": {"category": "sexual_explicit", ...}}}
      },
      "categories": {"demo_forbidden": {"user_reason": {"block": "...", "review": "..."}}}
    }

Each classifier is judged by its own section of ``classifiers``, found by the first of its
``policy_keys`` that the file names (its version, then its kind, e.g. "hf:my-model", "hf"); a
classifier that the file does not name gets the top-level ``labels`` (the section that
operators' and older classifiers have always used). Every label a section names must be one
the classifier can produce; safety/image_gate.py checks that when the classifier loads.

``categories`` gives, per category, the sentence a person is shown ("this image looks like a
star, which this demo's policy does not allow"); a category without one falls back to the
prompt side's ``description`` ("This image appears to show <description>.").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_THRESHOLD = 1.01  # 1.01 = never (scores are probabilities in [0, 1])
DECISIONS = ("review", "block")


class ImagePolicyError(ValueError):
    """The policy's image section is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class LabelRule:
    label: str
    category: str
    review: float
    block: float


@dataclass(frozen=True)
class ImagePolicy:
    version: str
    default: dict[str, LabelRule]
    classifiers: dict[str, dict[str, LabelRule]]
    user_reasons: dict[str, dict[str, str]] = field(default_factory=dict)  # category -> decision -> text

    def section_for(self, policy_keys: tuple[str, ...]) -> tuple[str, dict[str, LabelRule]]:
        """(name of the section used, its rules) for a classifier with these keys."""
        for key in policy_keys:
            if key in self.classifiers:
                return key, self.classifiers[key]
        return "labels", self.default

    def user_reason(self, category: str, decision: str) -> str:
        return self.user_reasons.get(category, {}).get(decision, "")


def _number(spec: dict, key: str, where: str) -> float:
    if key not in spec:
        raise ImagePolicyError(f"{where}: missing required key '{key}'")
    val = spec[key]
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val) \
            or not 0.0 <= val <= MAX_THRESHOLD:
        raise ImagePolicyError(f"{where}: '{key}' must be a number in [0, {MAX_THRESHOLD}], got {val!r}")
    return float(val)


def _rules(labels: Any, where: str, categories: set[str]) -> dict[str, LabelRule]:
    if not isinstance(labels, dict):
        raise ImagePolicyError(f"{where} must be an object of label -> rule")
    out = {}
    for label, spec in labels.items():
        at = f"{where}['{label}']"
        if not isinstance(spec, dict):
            raise ImagePolicyError(f"{at} must be an object")
        category = spec.get("category")
        if not isinstance(category, str) or category not in categories:
            raise ImagePolicyError(f"{at}: 'category' must name a category of the policy, got {category!r}")
        review, block = _number(spec, "review", at), _number(spec, "block", at)
        if review > block:
            raise ImagePolicyError(f"{at}: review ({review}) must be <= block ({block})")
        out[label] = LabelRule(label, category, review, block)
    return out


def parse_image_policy(data: Any, source: str = "<policy>") -> ImagePolicy:
    if not isinstance(data, dict):
        raise ImagePolicyError(f"{source}: the policy must be a JSON object")
    version = data.get("version")
    if not isinstance(version, str) or not version.strip():
        raise ImagePolicyError(f"{source}: 'version' must be a non-empty string")
    descriptions = {c.get("name"): c.get("description", "") for c in data.get("categories", []) if isinstance(c, dict)}
    image = data.get("image", {})
    if not isinstance(image, dict):
        raise ImagePolicyError(f"{source}: 'image' must be an object")
    known = {name for name in descriptions if isinstance(name, str)}
    default = _rules(image.get("labels", {}), f"{source}: image.labels", known)
    sections = image.get("classifiers", {})
    if not isinstance(sections, dict):
        raise ImagePolicyError(f"{source}: image.classifiers must be an object of classifier -> section")
    classifiers = {}
    for key, section in sections.items():
        at = f"{source}: image.classifiers['{key}']"
        if not isinstance(section, dict) or "labels" not in section:
            raise ImagePolicyError(f"{at} must be an object with a 'labels' object")
        classifiers[key] = _rules(section["labels"], f"{at}.labels", known)

    texts = image.get("categories", {})
    if not isinstance(texts, dict):
        raise ImagePolicyError(f"{source}: image.categories must be an object of category -> texts")
    user_reasons: dict[str, dict[str, str]] = {}
    for name, spec in texts.items():
        at = f"{source}: image.categories['{name}']"
        if name not in known:
            raise ImagePolicyError(f"{at}: unknown category")
        reasons = spec.get("user_reason") if isinstance(spec, dict) else None
        if not isinstance(reasons, dict) or not reasons or any(
                d not in DECISIONS or not isinstance(t, str) or not t.strip() for d, t in reasons.items()):
            raise ImagePolicyError(f"{at}: 'user_reason' must map 'block' and/or 'review' to a sentence")
        user_reasons[name] = dict(reasons)
    # Every category an image label can reach gets a sentence: its own, or one made from the
    # prompt side's description, so a person never sees only an internal label.
    for rules in [default, *classifiers.values()]:
        for rule in rules.values():
            for decision in DECISIONS:
                if decision not in user_reasons.get(rule.category, {}):
                    what = descriptions.get(rule.category) or rule.category.replace("_", " ")
                    text = (f"This image appears to show {what}, which this service's policy does not allow."
                            if decision == "block" else
                            f"This image may show {what}; it is held until a moderator has checked it.")
                    user_reasons.setdefault(rule.category, {})[decision] = text
    return ImagePolicy(version, default, classifiers, user_reasons)


def load_image_policy(path: str | Path) -> ImagePolicy:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ImagePolicyError(f"{path}: the safety policy could not be read: {exc}") from exc
    return parse_image_policy(data, str(path))
