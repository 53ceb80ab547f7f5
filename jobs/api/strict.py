"""Strict request bodies (issue 45 item 6): a field an endpoint does not take is a 400 naming
it, and a value of the wrong JSON type is refused, never coerced. DRF's own fields read "20" as
20, 42 as the text "42", true as the number 1.0 and "yes" as true; these read only the JSON type
the field documents (a whole number such as 20.0 is an integer, as JSON Schema says).

Every request serializer derives from StrictSerializer and declares its fields with the Strict*
fields below. The errors carry the codes UNKNOWN_FIELD and INVALID_TYPE, which the
OpenAI-compatible route turns into OpenAI's `unknown_parameter` and `invalid_type`
(jobs/api/openai/views.py); the OpenAPI schema says `additionalProperties: false` for them
(jobs/api/schema.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail, ValidationError

UNKNOWN_FIELD = "unknown_field"
INVALID_TYPE = "invalid_type"
# An answer names at most this many unknown fields, each by at most NAME_CHARS characters of its
# name: a body of many long names gets a short answer.
MAX_NAMED = 20
NAME_CHARS = 100


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, as a message says it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return "a value of another type"


class _Typed:
    """A field that reads one JSON type. `expected` names it in messages ("a string")."""

    expected: ClassVar[str]
    noun: ClassVar[str]

    def type_error(self, data: Any) -> ValidationError:
        got = json_kind(data)
        return ValidationError(ErrorDetail(f"A valid {self.noun} is required, not {got}.", code=INVALID_TYPE))


class StrictCharField(_Typed, serializers.CharField):
    expected, noun = "a string", "string"

    def run_validation(self, data: Any = serializers.empty) -> Any:
        # Before CharField's own blank check, which turns its input into text first.
        if data is not serializers.empty and data is not None and not isinstance(data, str):
            raise self.type_error(data)
        return super().run_validation(data)


class StrictChoiceField(_Typed, serializers.ChoiceField):
    expected, noun = "a string", "string"

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            raise self.type_error(data)
        return super().to_internal_value(data)


class StrictIntegerField(_Typed, serializers.IntegerField):
    expected, noun = "an integer", "integer"

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise self.type_error(data)
        if isinstance(data, float) and not data.is_integer():
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(_Typed, serializers.FloatField):
    expected, noun = "a number", "number"

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise self.type_error(data)
        return super().to_internal_value(data)


class StrictBooleanField(_Typed, serializers.BooleanField):
    expected, noun = "a boolean", "boolean (true or false)"

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            raise self.type_error(data)
        return data


class StrictSerializer(serializers.Serializer):
    """A request body: each field it does not take is an error of its own, named by its key,
    reported with the other field errors (first, so the OpenAI route's `param` is one of them)."""

    # Unknown field -> what to send instead (a field of another API, say).
    unknown_field_hints: ClassVar[dict[str, str]] = {}

    def to_internal_value(self, data: Any) -> Any:
        unknown = self.unknown_fields(data)
        try:
            value = super().to_internal_value(data)
        except ValidationError as exc:
            if not unknown:
                raise
            detail = exc.detail if isinstance(exc.detail, Mapping) else {"non_field_errors": exc.detail}
            merged: dict[str, Any] = dict(unknown)
            for key, errors in detail.items():
                merged[key] = [*merged.get(key, []), *errors] if isinstance(errors, list) else errors
            raise ValidationError(merged) from None
        if unknown:
            raise ValidationError(unknown)
        return value

    def accepted_fields(self) -> list[str]:
        return [name for name, field in self.fields.items() if not field.read_only]

    def unknown_fields(self, data: Any) -> dict[str, list[ErrorDetail]]:
        if not isinstance(data, Mapping):
            return {}  # DRF's "Expected a dictionary" answers it
        known = self.accepted_fields()
        unknown = [key for key in data if key not in known]
        out: dict[str, list[ErrorDetail]] = {}
        for key in unknown[:MAX_NAMED]:
            hint = self.unknown_field_hints.get(key) or f"this request takes {', '.join(known)}"
            out[_printable(key)] = [ErrorDetail(f"Unknown field: {hint}.", code=UNKNOWN_FIELD)]
        if len(unknown) > MAX_NAMED:
            more = f"and {len(unknown) - MAX_NAMED} more unknown fields"
            out["non_field_errors"] = [ErrorDetail(more, code=UNKNOWN_FIELD)]
        return out


def _printable(name: Any) -> str:
    """A field name as an answer can carry it: valid Unicode (a lone surrogate escaped), bounded."""
    text = str(name).encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= NAME_CHARS else text[:NAME_CHARS] + "..."
