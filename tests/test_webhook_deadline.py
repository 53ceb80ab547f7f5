"""A webhook attempt has a total deadline (connect, send, the answer's head and body), not a
per-socket timeout: a receiver that trickles its answer a byte at a time cannot hold a worker."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from django.test import override_settings

from jobs.webhooks import delivery


@pytest.fixture
def trickler():
    """A loopback receiver that reads the request, then answers one byte every 0.5 s (each
    byte well inside any per-socket timeout), for at most 60 s."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                    deadline = time.monotonic() + 60
                    for byte in answer:
                        if stop.is_set() or time.monotonic() > deadline:
                            break
                        conn.sendall(bytes([byte]))
                        time.sleep(0.5)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/hook"
    stop.set()
    thread.join(timeout=5)
    server.close()


@pytest.mark.integration  # starts a process or opens a socket of its own
def test_a_trickling_receiver_is_cut_off_at_the_attempts_total_deadline(trickler):
    with override_settings(EMBEDDED=True, IMAGEGEN_WEBHOOK_TIMEOUT=1.5):
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="within 1.5s"):
            delivery._post(trickler, {"content-type": "application/json"}, b"{}", 1.5)
        took = time.monotonic() - started
    # The whole answer would take ~25 s at one byte per 0.5 s; the attempt ends at its deadline.
    assert took < 15, took


@pytest.mark.integration  # starts a process or opens a socket of its own
def test_a_prompt_receiver_is_answered_within_the_deadline():
    """The deadline does not cut a receiver that answers in time."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    with override_settings(EMBEDDED=True):
        assert delivery._post(f"http://127.0.0.1:{server.getsockname()[1]}/", {}, b"{}", 5) == 204
    server.close()
