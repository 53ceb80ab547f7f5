"""The fleet burst's own bookkeeping (scripts/fleet_burst.py), checked without a fleet: what it
reports is what tests/test_fleet.py asserts on, so a miscount there fails a fleet run by chance."""

from __future__ import annotations

import pytest

from scripts.fleet_burst import Run

pytestmark = pytest.mark.unit


def _watcher() -> dict:
    return {"kind": "sse", "terminal": [], "reconnects": 0, "previews": 0, "connects": 0, "outages": []}


def test_an_outage_lasts_through_failed_reconnects_until_the_next_event():
    """A stream dropped by a web host's kill may fail to reconnect while the load balancer still
    sends it to the dead host: that is one outage, ended by the first event on a new connection
    (before, each failed try opened another outage and the first never closed, so the kill's
    recovery read as "never came back" whenever the balancer was slower than one retry)."""
    w = _watcher()
    Run._dropped(None, w)  # the kill drops the stream
    Run._dropped(None, w)  # the reconnect lands on the dead host
    Run._dropped(None, w)
    assert len(w["outages"]) == 1 and w["outages"][0][1] is None and w["reconnects"] == 3
    Run._event(None, w, {"type": "status", "status": "running"})  # back through a live host
    assert len(w["outages"]) == 1 and w["outages"][0][1] is not None
    Run._dropped(None, w)  # a later drop is a new outage
    assert len(w["outages"]) == 2 and w["outages"][1][1] is None
