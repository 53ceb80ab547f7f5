"""Issue 28, item 9: behind the proxy the deploy files assume (one hop that appends the client
to X-Forwarded-For, reaching the web process from a non-loopback address), each client keeps its
own address: one client's failed sign-ins lock that client, not everyone behind the proxy, and
an X-Forwarded-For the client writes itself changes nothing. The web process runs under uvicorn
with the Procfile's flags and settings; the proxy is a small loopback forwarder written here."""

from __future__ import annotations

import re
import socket
import threading
import uuid

import httpx
import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from scripts.procs import stop_group
from tests.conftest import make_user
from tests.test_hardening_bodies import start_uvicorn
from tests.test_hardening_webhook_targets import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

PROXY_SOURCE = "127.0.0.9"  # like an ingress: not the 127.0.0.1 the Procfile trusts by default


def procfile_web() -> tuple[dict, tuple[str, ...]]:
    line = next(ln for ln in (ROOT / "deploy" / "Procfile").read_text().splitlines() if ln.startswith("web:"))
    env = {}
    found = re.search(r"IMAGEGEN_NUM_PROXIES=(?:\$\{IMAGEGEN_NUM_PROXIES:-(\d+)\}|(\d+))", line)
    if found:
        env["IMAGEGEN_NUM_PROXIES"] = found.group(1) or found.group(2)
    # The proxies uvicorn believes: the Procfile reads IMAGEGEN_TRUSTED_PROXIES (default 127.0.0.1);
    # this deployment sets it to its ingress's address, as an operator would.
    allow = re.search(r'--forwarded-allow-ips "\$\{IMAGEGEN_TRUSTED_PROXIES:-[^}]*\}"', line)
    assert allow, f"the Procfile's web line no longer reads IMAGEGEN_TRUSTED_PROXIES: {line}"
    return env, ("--forwarded-allow-ips", PROXY_SOURCE)


class ForwardingProxy:
    """Accepts on 127.0.0.1, appends the peer to X-Forwarded-For, forwards one request per
    connection to the upstream from PROXY_SOURCE and relays the answer."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn, peer[0]), daemon=True).start()

    def _one(self, conn: socket.socket, peer: str) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                part = conn.recv(65536)
                if not part:
                    return
                data += part
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = 0
            kept, xff = [lines[0]], ""
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.lower() == "x-forwarded-for":
                    xff = value.strip()
                elif name.lower() != "connection":
                    kept.append(line)
                if name.lower() == "content-length":
                    length = int(value)
            while len(body) < length:
                body += conn.recv(65536)
            kept.append(f"X-Forwarded-For: {xff + ', ' if xff else ''}{peer}")
            kept.append("Connection: close")
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), source_address=(PROXY_SOURCE, 0))
            with upstream:
                upstream.sendall(("\r\n".join(kept) + "\r\n\r\n").encode("latin-1") + body)
                while part := upstream.recv(65536):
                    conn.sendall(part)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def behind_proxy(worker_env):
    env, extra = procfile_web()
    server = start_uvicorn({**worker_env, **env}, name="uvicorn-proxied", extra=extra)
    proxy = ForwardingProxy(server.port)
    yield f"http://127.0.0.1:{proxy.port}"
    proxy.close()
    stop_group(server.proc, 10)


def client_from(address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=10)


def sign_in(url: str, client: httpx.Client, username: str, password: str, spoof: str | None = None) -> httpx.Response:
    page = client.get(f"{url}/accounts/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    headers = {"X-Forwarded-For": spoof} if spoof else {}
    return client.post(f"{url}/accounts/login/", data={"username": username, "password": password,
                                                       "csrfmiddlewaretoken": token}, headers=headers)


def test_one_clients_failures_behind_the_proxy_do_not_lock_the_others(behind_proxy, settings):
    erin = make_user("erin")
    # the server runs imagegen.settings, whose hashers do not include the tests' fast MD5
    erin.password = PBKDF2PasswordHasher().encode("erin-pw", PBKDF2PasswordHasher().salt())
    erin.save(update_fields=["password"])
    attacker, neighbour = client_from("127.0.0.2"), client_from("127.0.0.3")
    for i in range(settings.IMAGEGEN_SIGNIN_MAX_FAILURES):  # many accounts from one address
        response = sign_in(behind_proxy, attacker, f"nobody{i}-{uuid.uuid4().hex[:6]}", "x", spoof=f"192.0.2.{i}")
        assert response.status_code == 200, response.status_code
    refused = sign_in(behind_proxy, attacker, "erin", "erin-pw", spoof="192.0.2.200")
    assert refused.status_code == 429, "a client-written X-Forwarded-For must not get round the lock"
    response = sign_in(behind_proxy, neighbour, "erin", "erin-pw")
    assert response.status_code == 302, "another client behind the same proxy was locked out with the attacker"
