"""Issue 28, item 11: webhook targets outside the embedded setup refuse addresses that carry
an IPv4 address a gateway forwards to (NAT64, 6to4, Teredo, IPv4-mapped), and a host that does
not resolve in time is a 400 after a bounded wait, not a request thread held; the deploy files
run outside the embedded setup."""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent


def submit_with_hook(api, url: str):
    return api.post("/api/v1/jobs", {"prompt": "a red circle", "webhook_url": url}, format="json")


@pytest.mark.parametrize("address", [
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "64:ff9b::808:808",  # NAT64 of 8.8.8.8: still a gateway's address
    "64:ff9b:1::a00:1",  # local-use NAT64
    "2002:a00:1::1",  # 6to4 of 10.0.0.1
    "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo (client 10.0.0.1)
    "::ffff:10.0.0.1",  # IPv4-mapped
    "::ffff:127.0.0.1",
    "::10.0.0.1",  # IPv4-compatible (issue 44, item 9)
    "::8.8.8.8",
    "::ffff:0:10.0.0.1",  # SIIT (RFC 2765)
    "fec0::1",  # site-local (deprecated, RFC 3879)
])
def test_a_webhook_to_an_address_that_carries_an_ipv4_one_is_400(alice_api, settings, address):
    settings.EMBEDDED = False
    response = submit_with_hook(alice_api, f"https://[{address}]/hook")
    assert response.status_code == 400, response.content
    assert "webhook_url" in response.json()


def test_a_public_ipv6_webhook_target_is_accepted_for_validation(settings):
    from jobs.webhooks.delivery import validate_url

    settings.EMBEDDED = False
    assert validate_url("https://[2606:4700:4700::1111]/hook")


def test_a_host_that_does_not_resolve_in_time_is_400_after_the_bound(alice_api, settings, monkeypatch):
    settings.EMBEDDED = False
    settings.IMAGEGEN_WEBHOOK_RESOLVE_TIMEOUT = 0.5
    released = threading.Event()
    real = socket.getaddrinfo

    def hanging(host, *args, **kwargs):  # a resolver that never answers (no DNS server runs here)
        if host == "slow.example":
            released.wait(30)
            raise socket.gaierror("gave up")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    started = time.monotonic()
    try:
        response = submit_with_hook(alice_api, "https://slow.example/hook")
    finally:
        released.set()
    assert time.monotonic() - started < 20  # the resolver hangs 30 s; the submit did not wait for it
    assert response.status_code == 400
    assert "did not resolve within" in str(response.json()["webhook_url"])


def test_the_deploy_files_run_outside_the_embedded_setup():
    procfile = (ROOT / "deploy" / "Procfile").read_text()
    for line in procfile.splitlines():
        if line and not line.startswith("#"):
            assert "IMAGEGEN_EMBEDDED=false" in line, line
    manifests = (ROOT / "deploy" / "kubernetes.yaml").read_text()
    containers = len(re.findall(r"^\s+- name: \S+\n\s+image:", manifests, re.M))
    assert containers and manifests.count('{name: IMAGEGEN_EMBEDDED, value: "false"}') == containers


def test_one_users_hung_lookups_do_not_fail_another_users_webhook(alice_api, bob_api, settings, monkeypatch):
    """Issue 44, item 9: four submits whose webhook hosts never resolve took every thread of the
    lookups' pool (a hung lookup cannot be stopped), and another user's valid URL then failed "did
    not resolve within". Lookups are bounded per user (IMAGEGEN_WEBHOOK_LOOKUPS_PER_USER) on a
    pool apart from the deliveries', so the other user's lookup still runs."""
    settings.EMBEDDED = False
    settings.IMAGEGEN_WEBHOOK_RESOLVE_TIMEOUT = 0.5
    released = threading.Event()
    real = socket.getaddrinfo

    def resolver(host, port, *args, **kwargs):  # no DNS server runs here: the test's own answers
        if host.endswith(".slow.example"):
            released.wait(60)
            raise socket.gaierror("gave up")
        if host == "hooks.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    try:
        answers = [submit_with_hook(alice_api, f"https://h{i}.slow.example/hook") for i in range(4)]
        assert [a.status_code for a in answers] == [400] * 4
        assert "have not answered yet" in str(answers[-1].json()["webhook_url"])  # her bound, not the pool's
        other = submit_with_hook(bob_api, "https://hooks.example/hook")
        assert other.status_code == 202, other.content
    finally:
        released.set()
