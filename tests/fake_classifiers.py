"""Test doubles for what cannot be made to fail on demand: an image classifier whose behaviour
the test scripts through Redis (the gate under test is real), and a CDN purge recorder."""

from __future__ import annotations

import json
import time

MODE_KEY = "test:classifier-mode"
CALLS_KEY = "test:classifier-calls"  # batches scored since the mode was set (for first:N:...)
PURGED_KEY = "test:cdn-purged"


def _redis():
    from imagegen.redis_client import get_redis

    return get_redis()


def set_mode(mode: str | None) -> None:
    _redis().delete(CALLS_KEY)
    if mode is None:
        _redis().delete(MODE_KEY)
    else:
        _redis().set(MODE_KEY, mode)


CLEAN = {"star": 0.0, "heart": 0.0}  # a score for every label the default policy section judges


class Scripted:
    """Modes: unset -> clean scores (allow); raise; hang (until the mode changes);
    slow:N (N seconds a batch, then clean); none (returns None); short (too few results); nan / missing / text (a malformed score);
    json:{label: score} for every image (labels not given score 0);
    first:N:{label: score}: those scores for the first N batches scored, clean ones after;
    index:K:{label: score}: those scores for the K-th image of every batch, clean ones for the rest."""

    version = "scripted-test-classifier"
    labels = ("star", "heart")

    @classmethod
    def from_spec(cls, arg: str) -> Scripted:
        return cls()

    def scores(self, images):
        mode = _redis().get(MODE_KEY)
        if mode is None:
            return [dict(CLEAN) for _ in images]
        if mode == "raise":
            raise RuntimeError("the classifier model crashed")
        if mode == "hang":
            while _redis().get(MODE_KEY) == "hang":
                time.sleep(0.1)
            return [dict(CLEAN) for _ in images]
        if mode.startswith("slow:"):  # a slow but healthy classifier: N seconds a batch
            time.sleep(float(mode.split(":", 1)[1]))
            return [dict(CLEAN) for _ in images]
        if mode == "none":
            return None
        if mode == "short":
            return [{}][: max(0, len(images) - 1)]
        if mode == "nan":
            return [{"star": float("nan"), "heart": 0.0} for _ in images]
        if mode == "missing":
            return [{"heart": 0.0} for _ in images]
        if mode == "text":
            return [{"star": "0.1", "heart": 0.0} for _ in images]
        if mode.startswith("first:"):
            _, count, given = mode.split(":", 2)
            if _redis().incr(CALLS_KEY) > int(count):
                return [dict(CLEAN) for _ in images]
            mode = "json:" + given
        if mode.startswith("index:"):  # index:K:{label: score}: those scores for the K-th image of each batch only
            _, index, given = mode.split(":", 2)
            return [{**CLEAN, **json.loads(given)} if i == int(index) else dict(CLEAN) for i in range(len(images))]
        if mode.startswith("json:"):
            scores = {**CLEAN, **json.loads(mode[5:])}
            return [dict(scores) for _ in images]
        raise AssertionError(f"unknown mode {mode}")


def record_purge(urls: list[str]) -> None:
    _redis().rpush(PURGED_KEY, *urls)


def purged() -> list[str]:
    return _redis().lrange(PURGED_KEY, 0, -1)
