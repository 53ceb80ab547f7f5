"""Typed readers for settings that come from the environment.

They fail loudly: a malformed value stops the process at start-up instead of being read as a
default the operator did not choose.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache


class ImproperlyConfiguredEnv(ValueError):
    pass


def env_str(name: str, default: str | None = None) -> str:
    value = os.environ.get(name)
    if value is None or value == "":
        if default is None:
            raise ImproperlyConfiguredEnv(f"{name} must be set")
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfiguredEnv(f"{name}={value!r} is not a boolean (use true/false)")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"{name}={value!r} is not an integer") from exc


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"{name}={value!r} is not a number") from exc


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None or value == "":
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_sizes(name: str, default: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """A size menu such as "64x64,96x64"."""
    value = os.environ.get(name)
    if value is None or value == "":
        return list(default)
    sizes = []
    for item in value.split(","):
        try:
            w, h = item.strip().lower().split("x")
            sizes.append((int(w), int(h)))
        except ValueError as exc:
            raise ImproperlyConfiguredEnv(f"{name}: {item!r} is not WIDTHxHEIGHT") from exc
    return sizes


def env_caps(name: str) -> dict[str, int]:
    """Per-size batch caps such as "64x64:8,96x96:4"."""
    caps: dict[str, int] = {}
    for item in env_list(name, []):
        try:
            size, cap = item.split(":")
            w, h = size.lower().split("x")
            caps[f"{int(w)}x{int(h)}"] = int(cap)
        except ValueError as exc:
            raise ImproperlyConfiguredEnv(f"{name}: {item!r} is not WIDTHxHEIGHT:CAP") from exc
    return caps


def env_models(name: str, default: dict[str, str]) -> dict[str, str]:
    """Model versions and their folders such as "shapes-v1-lcm=models/shapes-v1-lcm"; "none": none."""
    value = os.environ.get(name)
    if value is None or value == "":
        return dict(default)
    if value.strip().lower() == "none":
        return {}
    models: dict[str, str] = {}
    for item in env_list(name, []):
        version, sep, path = item.partition("=")
        if not sep or not version.strip() or not path.strip() or "@" in version or "|" in version:
            raise ImproperlyConfiguredEnv(f"{name}: {item!r} is not VERSION=PATH (no '@' or '|' in VERSION)")
        models[version.strip()] = path.strip()
    return models


def env_weights(name: str) -> dict[str, float]:
    """Per-user fair-share weights such as "alice=4,bulk-bot=0.5" (usernames; default 1; at least 0.1)."""
    weights: dict[str, float] = {}
    for item in env_list(name, []):
        user, sep, value = item.rpartition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not sep or not user.strip() or not weight >= 0.1 or weight > 1000:
            raise ImproperlyConfiguredEnv(f"{name}: {item!r} is not USERNAME=WEIGHT with a weight from 0.1 to 1000")
        weights[user.strip()] = weight
    return weights


_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600, "d": 86400, "day": 86400}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([a-z]+?)s?\s*$")


@lru_cache(maxsize=64)
def parse_rate(rate: str) -> tuple[int, float] | None:
    """"120/min" -> (120, 60.0); "10/15min" -> (10, 900.0); "", "off" or "0" -> None (no limit)."""
    if rate.strip().lower() in ("", "off", "none", "0"):
        return None
    match = _RATE.match(rate.lower())
    if match is None or match.group(3) not in _UNITS:
        raise ValueError(f"{rate!r} is not a rate such as 120/min, 10/s, 1000/hour or 10/15min")
    return int(match.group(1)), float(int(match.group(2) or 1) * _UNITS[match.group(3)])


def env_rate(name: str, default: str) -> str:
    """A request rate such as "120/min" (or "off"), checked at start-up."""
    value = env_str(name, default)
    try:
        parse_rate(value)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"{name}: {exc}") from exc
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env_str(name, default)
    if value not in choices:
        raise ImproperlyConfiguredEnv(f"{name}={value!r} is not one of {', '.join(choices)}")
    return value
