"""Readers of one environment value each, for the settings object (imagegen/config/).

Each takes the variable's name and its value (set and not empty: an unset or empty variable
takes the setting's default) and fails loudly, naming the variable: a malformed value stops the
process at start-up instead of being read as a default the operator did not choose.
"""

from __future__ import annotations

import ipaddress
import os
import re
from functools import lru_cache


class ImproperlyConfiguredEnv(ValueError):
    pass


def read_str(name: str, value: str) -> str:
    return value


def read_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfiguredEnv(f"{name}={value!r} is not a boolean (use true/false)")


def read_int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"{name}={value!r} is not an integer") from exc


def read_float(name: str, value: str) -> float:
    try:
        return float(value)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"{name}={value!r} is not a number") from exc


def read_list(name: str, value: str) -> list[str]:
    """A comma-separated list; blank items are dropped."""
    return [item.strip() for item in value.split(",") if item.strip()]


def read_sizes(name: str, value: str) -> list[tuple[int, int]]:
    """A size menu such as "64x64,96x64"."""
    sizes = []
    for item in value.split(","):
        try:
            w, h = item.strip().lower().split("x")
            sizes.append((int(w), int(h)))
        except ValueError as exc:
            raise ImproperlyConfiguredEnv(f"{name}: {item!r} is not WIDTHxHEIGHT") from exc
    return sizes


def read_caps(name: str, value: str) -> dict[str, int]:
    """Per-size batch caps such as "64x64:8,96x96:4"."""
    caps: dict[str, int] = {}
    for item in read_list(name, value):
        try:
            size, cap = item.split(":")
            w, h = size.lower().split("x")
            caps[f"{int(w)}x{int(h)}"] = int(cap)
        except ValueError as exc:
            raise ImproperlyConfiguredEnv(f"{name}: {item!r} is not WIDTHxHEIGHT:CAP") from exc
    return caps


def read_models(name: str, value: str) -> dict[str, str]:
    """Model versions and their folders such as "shapes-v1-lcm=models/shapes-v1-lcm"; "none": none."""
    if value.strip().lower() == "none":
        return {}
    models: dict[str, str] = {}
    for item in read_list(name, value):
        version, sep, path = item.partition("=")
        if not sep or not version.strip() or not path.strip() or "@" in version or "|" in version:
            raise ImproperlyConfiguredEnv(f"{name}: {item!r} is not VERSION=PATH (no '@' or '|' in VERSION)")
        models[version.strip()] = path.strip()
    return models


def read_weights(name: str, value: str) -> dict[str, float]:
    """Per-user fair-share weights such as "alice=4,bulk-bot=0.5" (usernames; default 1; at least 0.1)."""
    weights: dict[str, float] = {}
    for item in read_list(name, value):
        user, sep, number = item.rpartition("=")
        try:
            weight = float(number)
        except ValueError:
            weight = -1.0
        if not sep or not user.strip() or not weight >= 0.1 or weight > 1000:
            raise ImproperlyConfiguredEnv(f"{name}: {item!r} is not USERNAME=WEIGHT with a weight from 0.1 to 1000")
        weights[user.strip()] = weight
    return weights


def read_networks(name: str, value: str) -> list[str]:
    """Addresses or CIDRs, comma-separated, each checked."""
    networks = read_list(name, value)
    for net in networks:
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError as exc:
            raise ImproperlyConfiguredEnv(f"{name}: {net!r} is not an address or CIDR") from exc
    return networks


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


def read_rate(name: str, value: str) -> str:
    """A request rate such as "120/min" (or "off"), checked at start-up."""
    try:
        parse_rate(value)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"{name}: {exc}") from exc
    return value


def env_weights(name: str) -> dict[str, float]:
    """IMAGEGEN_USER_WEIGHTS-style weights straight from the environment (none when unset)."""
    value = os.environ.get(name)
    return read_weights(name, value) if value else {}
