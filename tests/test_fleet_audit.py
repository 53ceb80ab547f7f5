"""The fleet burst's own bookkeeping (scripts/fleet_burst.py), checked without a fleet: what it
reports is what tests/test_fleet.py asserts on, so a miscount there fails a fleet run by chance."""

from __future__ import annotations

import pytest

from scripts.fleet import open_doors
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


def _shut() -> dict:
    seen = {
        "pg": {"no password": "refused: fe_sendauth: no password supplied",
               "wrong password": 'refused: FATAL:  password authentication failed for user "imagegen"',
               "superuser without password": 'refused: FATAL:  no pg_hba.conf entry for host "10.231.0.11"',
               "the password": "accepted"},
        "seaweedfs_ports": {"9333": "shut: Connection refused", "8888": "shut: Connection refused"},
        "s3_anonymous": {"list quarantine": 403, "get quarantine object": 403, "list buckets": 403, "get public object": 200},
        "s3_with_keys": "read", "metrics": 401,
    }
    return {"from": {"web1": dict(seen), "gpu2": dict(seen)}, "scraper_direct": 200, "forged_through_lb": 401,
            "services_listening": ["0.0.0.0:6379", "10.231.0.2:5432", "10.231.0.2:8333", "127.0.0.1:9333", "[::1]:5432"],
            "exposed_ports_expected": [5432, 6379, 8333]}


def test_the_doors_read_shut_only_when_each_is_shut_and_each_control_answered():
    """tests/test_fleet.py asserts open_doors() == []: each door found open, and each control that
    could not tell (a probe that reached nothing reads as shut), must be named."""
    assert open_doors(_shut()) == []
    cases = {
        "PostgreSQL with no password": lambda d: d["from"]["gpu2"].__setitem__("pg", {**d["from"]["gpu2"]["pg"], "no password": "accepted"}),
        "refused the application's password": lambda d: d["from"]["web1"].__setitem__("pg", {**d["from"]["web1"]["pg"], "the password": "refused: timeout"}),
        "SeaweedFS port 8888 is open": lambda d: d["from"]["web1"].__setitem__("seaweedfs_ports", {"8888": "open"}),
        "anonymous S3 get quarantine object: 200": lambda d: d["from"]["gpu2"].__setitem__("s3_anonymous", {**d["from"]["gpu2"]["s3_anonymous"], "get quarantine object": 200}),
        "public bucket (control)": lambda d: d["from"]["gpu2"].__setitem__("s3_anonymous", {**d["from"]["gpu2"]["s3_anonymous"], "get public object": "failed"}),
        "believed a forged X-Forwarded-For": lambda d: d["from"]["web1"].__setitem__("metrics", 200),
        "scraper's own address": lambda d: d.__setitem__("scraper_direct", 401),
        "through the load balancer": lambda d: d.__setitem__("forged_through_lb", 200),
        "listens on 10.231.0.2:8888": lambda d: d["services_listening"].append("10.231.0.2:8888"),
        "a web host and a GPU host expected": lambda d: d["from"].pop("gpu2"),
    }
    for expected, spoil in cases.items():
        doors = _shut()
        doors["from"] = {k: dict(v) for k, v in doors["from"].items()}
        spoil(doors)
        found = open_doors(doors)
        assert any(expected in line for line in found), (expected, found)
