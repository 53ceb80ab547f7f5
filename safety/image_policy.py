"""The output-image part of the safety policy file, read and validated.

    "image": {
      "labels": {"star": {"category": "demo_forbidden", "review": 0.35, "block": 0.6}},
      "classifiers": {
        "shapes-classifier-v2": {"labels": {"star": {...}, "heart": {...}}},
        "nudenet": {"labels": {"FEMALE_GENITALIA_EXPOSED": {"category": "sexual_explicit", ...}}}
      },
      "categories": {"demo_forbidden": {"user_reason": {"block": "...", "review": "..."}}},
      "steer": {"demo_forbidden": "a star", "demo_borderline": "a heart"}
    }

Each classifier is judged by its own section of ``classifiers``, found by the first of its
``policy_keys`` that the file names (its version, then its kind, e.g. "hf:my-model", "hf"); a
classifier that the file does not name gets the top-level ``labels`` (the section that
operators' and older classifiers have always used). Every label a section names must be one
the classifier can produce; safety/image_gate.py checks that when the classifier loads.

``categories`` gives, per category, the sentence a person is shown ("this image looks like a
star, which this demo's policy does not allow"); a category without one falls back to the
prompt side's ``description`` ("This image appears to show <description>.").

``steer`` names, per category, a phrase the generator is steered away from: on a model that takes
a negative prompt, the phrases of every category the prompt check did not find in the prompt go
before the user's own negative prompt (``ImagePolicy.negative_prompt``). A generator asked for
nothing in particular (a prompt it cannot read) then draws what the gate refuses far less often,
so ordinary prompts are delivered; a prompt that names the category (a heart a moderator let
through) is not steered away from it; and every image is still judged by the gate. The phrases
are part of the policy, so of its version and of the result cache's key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .policy_base import ImagePolicySpec, LabelRuleSpec, validate

DECISIONS = ("review", "block")
STEER_JOIN = " and "  # the shapes models read their caption grammar ("a star and a heart"); a comma is outside it


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
    steer: dict[str, str] = field(default_factory=dict)  # category -> phrase steered away from
    frame_stride: int = 1  # a video's frames judged: every k-th, the first and the last (safety/frame_gate.py)

    def steering(self, asked: set[str] | frozenset[str] = frozenset()) -> str:
        """The steering phrases of the categories not in ``asked`` (those the prompt check found
        in the prompt), joined."""
        return STEER_JOIN.join(phrase for category, phrase in self.steer.items() if category not in asked)

    def negative_prompt(self, user_negative: str, asked: set[str] | frozenset[str] = frozenset()) -> str:
        """The negative prompt a generation is given: the steering, then the user's own."""
        return steered_negative(self.steering(asked), user_negative)

    def section_for(self, policy_keys: tuple[str, ...]) -> tuple[str, dict[str, LabelRule]]:
        """(name of the section used, its rules) for a classifier with these keys."""
        for key in policy_keys:
            if key in self.classifiers:
                return key, self.classifiers[key]
        return "labels", self.default

    def user_reason(self, category: str, decision: str) -> str:
        return self.user_reasons.get(category, {}).get(decision, "")


def steered_negative(steering: str, user_negative: str) -> str:
    """A steering (ImagePolicy.steering) put before the user's own negative prompt."""
    return STEER_JOIN.join(part for part in (steering, user_negative) if part.strip())


def _rules(labels: dict[str, LabelRuleSpec]) -> dict[str, LabelRule]:
    return {label: LabelRule(label, r.category, r.review, r.block) for label, r in labels.items()}


def parse_image_policy(data: Any, source: str = "<policy>") -> ImagePolicy:
    """The image part of a decoded policy, validated (safety/policy_base.ImagePolicySpec)."""
    spec = validate(ImagePolicySpec, data, source, error=ImagePolicyError)
    descriptions = {c.name: c.description for c in spec.categories}
    default = _rules(spec.image.labels)
    classifiers = {key: _rules(section.labels) for key, section in spec.image.classifiers.items()}
    user_reasons: dict[str, dict[str, str]] = {name: dict(t.user_reason) for name, t in spec.image.categories.items()}
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
    return ImagePolicy(spec.version, default, classifiers, user_reasons, dict(spec.image.steer),
                       spec.image.frame_stride)


def load_image_policy(path: str | Path) -> ImagePolicy:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ImagePolicyError(f"{path}: the safety policy could not be read: {exc}") from exc
    return parse_image_policy(data, str(path))
