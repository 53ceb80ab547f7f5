"""Image classifiers for benchmarks that measure the pipeline, not the gate."""

from __future__ import annotations

import json
from pathlib import Path


class AllowAll:
    """Scores every label the policy names at 0: every image is allowed, through the real gate,
    so the benchmark exercises the delivery path (the shipped shapes classifier judges the
    simulated accelerator's noise pictures as stars)."""

    version = "bench-allow-all"

    def __init__(self) -> None:
        from django.conf import settings

        policy = json.loads(Path(settings.IMAGEGEN_SAFETY_POLICY).read_text())
        self.labels = list(policy.get("image", {}).get("labels", {}))

    @classmethod
    def from_spec(cls, arg: str) -> AllowAll:
        return cls()

    def scores(self, images):
        return [{label: 0.0 for label in self.labels} for _ in images]
