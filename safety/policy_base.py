"""What every reader of the policy file shares: its error, the language codes it may name, and
the typed models (pydantic) that validate it. A malformed file is a PolicyError whose message
names the file, the field and the reason ("policy.json: category 'nudity': 'terms'[1] must be a
non-empty string")."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError


class PolicyError(ValueError):
    """The policy file is missing or malformed. Callers must treat it as "not allowed"."""


# Languages the policy may give translations for (ISO 639-1); others are a PolicyError, so a
# typo cannot silently create an unused list.
LANGUAGES = {
    "ar", "bg", "cs", "da", "de", "el", "en", "es", "fa", "fi", "fr", "he", "hi", "hu", "id", "it",
    "ja", "ko", "nl", "no", "pl", "pt", "ro", "ru", "sv", "th", "tr", "uk", "vi", "zh",
}
MAX_THRESHOLD = 1.01  # 1.01 = never (scores are probabilities in [0, 1])
BLOCK, REVIEW = "block", "review"


def _fail(message: str, **context: Any) -> PydanticCustomError:
    return PydanticCustomError("policy", message, context)


def _text(value: str) -> str:
    if not value.strip():
        raise _fail("must be a non-empty string")
    return value


def _threshold(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0.0 <= value <= MAX_THRESHOLD:
        raise _fail(f"must be a number in [0, {MAX_THRESHOLD}], got {value!r}")
    return float(value)


def _language(code: str) -> str:
    if code not in LANGUAGES:
        raise _fail(f"unknown language code {code!r} (ISO 639-1, one of {sorted(LANGUAGES)})")
    return code


def _decision(value: Any) -> str:
    if value not in (BLOCK, REVIEW):
        raise _fail(f"must be 'block' or 'review', got {value!r}")
    return value


def _window(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
        raise _fail(f"must be an integer 1-5, got {value!r}")
    return value


Text = Annotated[str, Field(strict=True), AfterValidator(_text)]
Threshold = Annotated[float, BeforeValidator(_threshold)]
LanguageCode = Annotated[str, Field(strict=True), AfterValidator(_language)]
Decision = Annotated[str, BeforeValidator(_decision)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Defaults(BaseModel):
    model_config = ConfigDict(frozen=True)

    semantic_review: Threshold | None = None
    semantic_block: Threshold | None = None
    rule_decision: Decision | None = None


class BenignContext(_Strict):
    terms: list[Text]
    words: list[Text]
    window: Annotated[int, BeforeValidator(_window)] = 2
    note: str = ""


class CategorySpec(_Strict):
    """One category of the prompt policy; thresholds and decision fall back to ``defaults``
    (passed as the validation context)."""

    name: Annotated[str, Field(strict=True)]
    description: Annotated[str, Field(strict=True)]
    rule_decision: Decision | None = None
    semantic_review: Threshold | None = None
    semantic_block: Threshold | None = None
    terms: list[Text]
    patterns: list[Text] = []
    examples: list[Text] = []
    exceptions: list[Text] = []
    negative_prompt_terms: list[Text] = []
    euphemisms: list[Text] = []
    translations: dict[LanguageCode, list[Text]] = {}
    benign_contexts: list[BenignContext] = []

    @field_validator("name")
    @classmethod
    def _snake_case(cls, name: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise _fail(f"name {name!r} must be lower_snake_case")
        return name

    @model_validator(mode="after")
    def _complete(self, info: ValidationInfo) -> CategorySpec:
        defaults: Defaults = (info.context or {}).get("defaults") or Defaults()
        fields: dict[str, Any] = {}
        for key in ("rule_decision", "semantic_review", "semantic_block"):
            if getattr(self, key) is None:
                if getattr(defaults, key) is None:
                    if key == "rule_decision":
                        raise _fail("'rule_decision' must be 'block' or 'review', got None")
                    raise _fail(f"missing required key '{key}' (and no default)")
                fields[key] = getattr(defaults, key)
        done = self.model_copy(update=fields)
        if done.semantic_review > done.semantic_block:  # type: ignore[operator]
            raise _fail(f"semantic_review ({done.semantic_review}) must be <= semantic_block ({done.semantic_block})")
        for j, pattern in enumerate(self.patterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise _fail(f"patterns[{j}] is not a valid regex: {exc}") from exc
        if not (self.terms or self.patterns or self.examples or self.euphemisms or self.translations):
            raise _fail("needs at least one of terms, patterns, examples")
        return done


def _declared(value: Any) -> Any:
    if not isinstance(value, list) or not value or not all(isinstance(x, str) for x in value):
        raise _fail("must be a non-empty list of ISO 639-1 codes")
    return value


def _undeclared(value: Any) -> str:
    if value not in UNDECLARED_ACTIONS:
        raise _fail(f"must be one of {', '.join(UNDECLARED_ACTIONS)}, got {value!r}")
    return value


UNDECLARED_ACTIONS = ("review", "block", "allow")


class LanguagesSpec(_Strict):
    declared: Annotated[list[LanguageCode], BeforeValidator(_declared)]
    undeclared: Annotated[str, BeforeValidator(_undeclared)] = "review"
    note: str = ""


class LabelRuleSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    category: Annotated[str, Field(strict=True)]
    review: Threshold
    block: Threshold

    @model_validator(mode="after")
    def _ordered(self) -> LabelRuleSpec:
        if self.review > self.block:
            raise _fail(f"review ({self.review}) must be <= block ({self.block})")
        return self


class ClassifierSection(BaseModel):
    labels: dict[str, LabelRuleSpec]


class CategoryTexts(BaseModel):
    user_reason: Annotated[dict[Literal["block", "review"], Text], Field(min_length=1)]


class ImageSpec(BaseModel):
    labels: dict[str, LabelRuleSpec] = {}
    classifiers: dict[str, ClassifierSection] = {}
    categories: dict[str, CategoryTexts] = {}
    # category -> a phrase the generator is steered away from (a negative prompt) unless the
    # prompt check found that category in the prompt (safety/image_policy.py, "steer")
    steer: dict[str, Text] = {}
    # A video's frames judged by the image gate: every frame_stride-th one, and the first and the
    # last (safety/frame_gate.py); 1 judges every frame.
    frame_stride: Annotated[int, Field(strict=True, ge=1)] = 1

    def unknown_categories(self, known: set[str]) -> str | None:
        """The first place that names a category the policy does not have, and the reason."""
        sections = [("image.labels", self.labels)] + [
            (f"image.classifiers['{key}'].labels", s.labels) for key, s in self.classifiers.items()]
        for where, labels in sections:
            for label, rule in labels.items():
                if rule.category not in known:
                    return f"{where}['{label}']: unknown category {rule.category!r}"
        for name in self.categories:
            if name not in known:
                return f"image.categories['{name}']: unknown category"
        for name in self.steer:
            if name not in known:
                return f"image.steer['{name}']: unknown category"
        return None


def _version(value: str) -> str:
    if not value.strip():
        raise _fail("must not be empty")
    return value


class PolicySpec(BaseModel):
    """The whole policy file (keys it does not know, such as "description", are notes)."""

    version: Annotated[str, Field(strict=True), AfterValidator(_version)]
    defaults: Defaults = Defaults()
    categories: list[CategorySpec]
    languages: LanguagesSpec | None = None
    image: ImageSpec = ImageSpec()

    @field_validator("categories")
    @classmethod
    def _some(cls, categories: list[CategorySpec]) -> list[CategorySpec]:
        if not categories:
            raise _fail("must not be empty")
        return categories

    @model_validator(mode="after")
    def _consistent(self) -> PolicySpec:
        seen: set[str] = set()
        for i, c in enumerate(self.categories):
            if c.name in seen:
                raise _fail(f"categories[{i}]: duplicate category name {c.name!r}")
            seen.add(c.name)
        unknown = self.image.unknown_categories(seen)
        if unknown:
            raise _fail(unknown)
        if self.languages is not None:
            with_words = {"en"} | {lang for c in self.categories for lang, terms in c.translations.items() if terms}
            for code in self.languages.declared:
                if code not in with_words:
                    raise _fail(f"languages: declared: {code!r} has no words in any category (add translations first)")
        return self


class ImageCategory(BaseModel):
    name: str
    description: str = ""


class ImagePolicySpec(BaseModel):
    """What the image gate reads of the file: the version, the category names and descriptions,
    and the image section."""

    version: Annotated[str, Field(strict=True), AfterValidator(_version)]
    categories: list[ImageCategory] = []
    image: ImageSpec = ImageSpec()

    @model_validator(mode="after")
    def _known(self) -> ImagePolicySpec:
        unknown = self.image.unknown_categories({c.name for c in self.categories})
        if unknown:
            raise _fail(unknown)
        return self


_EXPECTED = {"string_type": "str", "list_type": "list", "dict_type": "an object", "int_type": "an integer",
             "model_type": "an object", "model_attributes_type": "an object", "bool_type": "a boolean"}


def explain(exc: ValidationError, data: Any, source: str) -> str:
    """The first error as "<file>: <where>: <field> <reason>", in the words the policy uses
    (a category by its name, a list item by its index)."""
    err = exc.errors(include_url=False)[0]
    loc = list(err["loc"])
    if err["type"] == "extra_forbidden":  # every unknown key of that object at once
        parent = loc[:-1]
        keys = [e["loc"][-1] for e in exc.errors(include_url=False)
                if e["type"] == "extra_forbidden" and list(e["loc"][:-1]) == parent]
        return f"{_where(parent, data, source)}: unknown key(s) {', '.join(repr(k) for k in sorted(map(str, keys)))}"
    if loc and loc[-1] == "[key]":  # a dict key (a language code)
        return f"{_where(loc[:-2], data, source)}: {err['msg']}"
    if err["type"] == "missing":
        return f"{_where(loc[:-1], data, source)}: missing required key '{loc[-1]}'"
    msg = err["msg"] if err["type"] == "policy" else _type_message(err)
    if not loc:
        return f"{source}: {msg}"
    if isinstance(loc[-1], int) and len(loc) > 1:  # an item of a list
        field = f"'{loc[-2]}'[{loc[-1]}]"
        where = _where(loc[:-2], data, source)
    elif isinstance(loc[-1], str) and _is_field(loc, data):
        field = f"'{loc[-1]}'"
        where = _where(loc[:-1], data, source)
    else:  # the error is about the object itself
        return f"{_where(loc, data, source)}: {msg}"
    return f"{where}: {msg}" if msg.startswith(("'", "name ")) else f"{where}: {field} {msg}"


def _type_message(err: Any) -> str:
    expected = _EXPECTED.get(err["type"])
    if expected:
        return f"must be {expected}, got {type(err['input']).__name__}"
    return f"{err['msg'][:1].lower()}{err['msg'][1:]}"


def _is_field(loc: list, data: Any) -> bool:
    """Whether the last step of `loc` is a field of a model, not a key of a free-form mapping
    (a label, a classifier, a category's texts, a language)."""
    parent = loc[-2] if len(loc) > 1 else None
    return not (isinstance(parent, str) and parent in ("labels", "classifiers", "categories", "translations", "user_reason"))


def _where(loc: list, data: Any, source: str) -> str:
    parts: list[str] = []
    node = data
    i = 0
    while i < len(loc):
        step = loc[i]
        nxt = loc[i + 1] if i + 1 < len(loc) else None
        if step == "categories" and isinstance(nxt, int) and not parts:
            cat = node["categories"][nxt] if isinstance(node, dict) and isinstance(node.get("categories"), list) \
                and nxt < len(node["categories"]) else None
            name = cat.get("name") if isinstance(cat, dict) else None
            if isinstance(name, str) and re.fullmatch(r"[a-z][a-z0-9_]*", name):
                parts = [f"category '{name}'"]
            else:
                parts = [f"categories[{nxt}]"]
            node = cat
            i += 2
            continue
        if isinstance(nxt, int):
            parts.append(f"{step}[{nxt}]")
            node = _child(_child(node, step), nxt)
            i += 2
            continue
        if parts and parts[-1].startswith("image") or (not parts and step == "image"):
            if not parts:
                parts.append("image")
            elif step in ("labels", "classifiers", "categories"):
                parts[-1] += f".{step}"
            else:
                parts[-1] += f"['{step}']"
        else:
            parts.append(str(step))
        node = _child(node, step)
        i += 1
    return ": ".join([source, *parts])


def _child(node: Any, key: Any) -> Any:
    try:
        return node[key]
    except (KeyError, IndexError, TypeError):
        return None


def validate(model: type[BaseModel], data: Any, source: str, error: type[ValueError] = PolicyError,
             context: dict | None = None) -> Any:
    if not isinstance(data, dict):
        raise error(f"{source}: the policy must be a JSON object")
    try:
        if model is PolicySpec and context is None:
            try:
                defaults = Defaults.model_validate(data.get("defaults", {}))
            except ValidationError as exc:
                raise error(explain(exc, data.get("defaults"), f"{source}: defaults")) from None
            context = {"defaults": defaults}
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise error(explain(exc, data, source)) from None
