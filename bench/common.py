"""What the benchmarks share: a quantile, waiting for a web server to answer, and a fresh
PostgreSQL database for one run."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager


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


@contextmanager
def fresh_database(url: str | None) -> Iterator[str | None]:
    """For a PostgreSQL DATABASE_URL: a new, empty database on that server for this run (so rows,
    statistics and leftover work of earlier runs do not enter the figures), dropped afterwards;
    yields its URL. Anything else (None: the stack's own SQLite file) is yielded as it is."""
    if not url or not url.startswith(("postgres://", "postgresql://")):
        yield url
        return
    import psycopg

    base, _, _ = url.rpartition("/")
    name = f"imagegen_bench_{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
