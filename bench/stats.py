"""Small statistics the benchmarks share."""

from __future__ import annotations


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) of values by linear interpolation; None for no values."""
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(len(values) - 1, int(k) + 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)
