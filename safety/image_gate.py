"""The output-image gate: every generated image is classified before anyone can see it.

IMAGEGEN_IMAGE_CLASSIFIER lists one or more classifier specs separated by commas (see
safety/image_loaders.py), e.g. ``shapes:models/shapes-classifier-v2,nudenet``; every image is
judged by each of them and the worst decision wins (block > review > allow), so a second
opinion can only make the gate stricter. ``none`` alone is the explicit opt-out: images are
delivered and every verdict says "unchecked".

It fails closed. ImageGateError (and so: nothing delivered) for an unset or broken setting, a load
error, a policy whose image labels a classifier cannot produce (checked when it loads:
check_classifier()), an exception or a timeout, and any malformed answer: not one dict per
image, a policy label missing from an image's scores, or a score that is not a finite number
in [0, 1] (NaN compares false with every threshold, so it would otherwise read as "allow").
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from dataclasses import dataclass
from numbers import Real

from django.conf import settings
from PIL import Image

from imagegen import metrics
from safety.image_loaders import ImageClassifier, SpecError, load
from safety.image_policy import ImagePolicy, ImagePolicyError, LabelRule, load_image_policy

log = logging.getLogger(__name__)

_RANK = {"allow": 0, "review": 1, "block": 2}


class ImageGateError(RuntimeError):
    """The gate could not judge the images; nothing may be delivered."""


@dataclass(frozen=True)
class ImageJudgement:
    decision: str  # allow | review | block
    category: str
    score: float | None
    reason: str  # for moderators and logs: classifier, label, score, threshold
    version: str  # classifier version(s) + policy version
    user_reason: str = ""  # for the person who asked: a sentence from the policy; "" when allowed


_lock = threading.Lock()
# The classifiers run in a helper thread so that a hung model times out instead of holding the
# batch forever; a hung call leaves that thread busy and later calls queue behind it (and time
# out too, failing closed) until the worker is restarted.
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="image-gate")
_loaded: dict[str, ImageClassifier | None] = {}


def _specs() -> list[str]:
    raw = settings.IMAGEGEN_IMAGE_CLASSIFIER.strip()
    if not raw:
        raise ImageGateError("no image classifier is configured (set IMAGEGEN_IMAGE_CLASSIFIER)")
    specs = [s.strip() for s in raw.split(",")]
    if any(not s for s in specs):
        raise ImageGateError(f"IMAGEGEN_IMAGE_CLASSIFIER has an empty entry: {raw!r}")
    if "none" in specs and len(specs) > 1:
        raise ImageGateError(f"IMAGEGEN_IMAGE_CLASSIFIER: 'none' cannot be combined with classifiers: {raw!r}")
    return specs


def image_policy() -> ImagePolicy:
    """The configured policy's image part (read afresh: under a millisecond), or ImageGateError."""
    try:
        return load_image_policy(settings.IMAGEGEN_SAFETY_POLICY)
    except ImagePolicyError as exc:
        raise ImageGateError(f"the safety policy's image section is unusable: {exc}") from exc


def _rules_for(classifier: ImageClassifier, policy: ImagePolicy) -> dict[str, LabelRule]:
    """The classifier's policy section, or ImageGateError if it names labels the classifier lacks."""
    section, rules = policy.section_for(tuple(classifier.policy_keys))
    where = f"image.{section}" if section == "labels" else f"image.classifiers['{section}']"
    if not rules:
        raise ImageGateError(f"the policy ({policy.version}, {where}) judges no label of the image classifier "
                             f"{classifier.version}: it would allow every image")
    missing = sorted(set(rules) - set(classifier.labels))
    if missing:
        raise ImageGateError(
            f"the image classifier {classifier.version} cannot produce the label(s) {missing} that the policy "
            f"({policy.version}, {where}) judges; "
            f"it produces {list(classifier.labels)}. Fix the policy or the classifier: a label the classifier "
            f"never returns would never block anything")
    return rules


def _load_one(spec: str) -> ImageClassifier | None:
    if spec == "none":
        return None
    with _lock:
        if spec not in _loaded:
            try:
                _loaded[spec] = load(spec, device=settings.IMAGEGEN_DEVICE, threads=settings.IMAGEGEN_TORCH_THREADS)
            except SpecError as exc:
                raise ImageGateError(str(exc)) from exc
            except Exception as exc:
                raise ImageGateError(f"the image classifier {spec!r} could not be loaded: {exc}") from exc
        return _loaded[spec]


def get_classifiers() -> list[ImageClassifier]:
    """The configured classifiers, loaded once per process; [] means the operator chose none."""
    loaded = [_load_one(spec) for spec in _specs()]
    return [c for c in loaded if c is not None]


def get_classifier() -> ImageClassifier | None:
    """The first configured classifier (None for `none`); kept for callers that know only one."""
    classifiers = get_classifiers()
    return classifiers[0] if classifiers else None


def check_classifier() -> list[str]:
    """Load every configured classifier and check the policy against it, as a worker does before
    it takes work and /readyz does on each probe. Returns the versions in force ("none" for the
    opt-out); raises ImageGateError naming the problem."""
    classifiers = get_classifiers()
    policy = image_policy()
    for classifier in classifiers:
        _rules_for(classifier, policy)
    return [c.version for c in classifiers] or ["none"]


def _valid_score(value: object) -> bool:
    if not isinstance(value, Real) or isinstance(value, bool):
        return False
    number = float(value)
    return math.isfinite(number) and 0.0 <= number <= 1.0


def _validated(classifier: ImageClassifier, answer: object, n: int, rules: dict[str, LabelRule]) -> list[dict]:
    name = classifier.version
    if not isinstance(answer, (list, tuple)) or len(answer) != n:
        got = f"{len(answer)} results" if isinstance(answer, (list, tuple)) else repr(type(answer).__name__)
        raise ImageGateError(f"the image classifier {name} returned no usable result: {got} for {n} images")
    for i, per_image in enumerate(answer):
        if not isinstance(per_image, dict):
            raise ImageGateError(f"the image classifier {name} returned no usable result for image {i}: "
                                 f"{type(per_image).__name__}, not label -> score")
        for label in rules:
            if label not in per_image:
                raise ImageGateError(f"the image classifier {name} gave no score for the policy label {label!r} "
                                     f"on image {i}")
            if not _valid_score(per_image[label]):
                raise ImageGateError(f"the image classifier {name} gave label {label!r} on image {i} the score "
                                     f"{per_image[label]!r}: not a finite number in [0, 1]")
    return list(answer)


def _decide(classifier: ImageClassifier, scores: dict, rules: dict[str, LabelRule], policy: ImagePolicy,
            version: str) -> ImageJudgement:
    decision, chosen, value = "allow", None, 0.0
    for label, rule in rules.items():
        v = float(scores[label])
        d = "block" if v >= rule.block else "review" if v >= rule.review else "allow"
        if (_RANK[d], v) > (_RANK[decision], value):
            decision, chosen, value = d, rule, v
    if chosen is None or decision == "allow":
        return ImageJudgement("allow", "", value, "", version)
    threshold = chosen.block if decision == "block" else chosen.review
    if decision == "block":
        reason = f"The image was classified as {chosen.category} "
    else:
        reason = f"The image is held for review: it may show {chosen.category} "
    reason += f"(score {value:.2f}: {classifier.version} label {chosen.label!r} >= {decision} threshold {threshold:g})."
    return ImageJudgement(decision, chosen.category, value, reason, version, policy.user_reason(chosen.category, decision))


def _run_all(classifiers: list[ImageClassifier], images: list[Image.Image]) -> list[object]:
    return [c.scores(images) for c in classifiers]


def judge(images: list[Image.Image]) -> list[ImageJudgement]:
    """One judgement per image, or ImageGateError. Never returns "allow" on doubt."""
    classifiers = get_classifiers()
    if not classifiers:
        return [
            ImageJudgement("allow", "unchecked", None, "unchecked: the image classifier is disabled by the operator", "none")
            for _ in images
        ]
    policy = image_policy()
    rules = [_rules_for(c, policy) for c in classifiers]
    started = time.monotonic()
    try:
        answers = _POOL.submit(_run_all, classifiers, images).result(timeout=settings.IMAGEGEN_CLASSIFIER_TIMEOUT)
    except ImageGateError:
        raise
    except concurrent.futures.TimeoutError as exc:
        raise ImageGateError(
            f"the image classifier did not answer within {settings.IMAGEGEN_CLASSIFIER_TIMEOUT:g}s"
        ) from exc
    except Exception as exc:
        raise ImageGateError(f"the image classifier failed: {type(exc).__name__}: {exc}") from exc
    metrics.observe("imagegen_classifier_seconds", time.monotonic() - started)
    checked = [_validated(c, a, len(images), r) for c, a, r in zip(classifiers, answers, rules, strict=True)]
    version = ",".join(c.version for c in classifiers) + f"+{policy.version}"
    out = []
    for i in range(len(images)):
        # Worst decision wins; among equals the higher score, then the classifier listed first.
        per_classifier = [_decide(c, answer[i], r, policy, version) for c, answer, r in zip(classifiers, checked, rules, strict=True)]
        out.append(max(per_classifier, key=lambda j: (_RANK[j.decision], j.score or 0.0)))
    return out
