"""What the benchmarks share: a quantile, and waiting for a web server to answer."""

from __future__ import annotations

import time


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) of values by linear interpolation (numpy's); None for no values."""
    if len(values) == 0:
        return None
    import numpy as np

    return float(np.quantile(np.asarray(values, dtype=float), q))


def wait_web(base_url: str, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(base_url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the web server did not come up")
