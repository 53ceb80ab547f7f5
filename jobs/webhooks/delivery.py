"""Signed completion webhooks (the Standard Webhooks scheme, https://www.standardwebhooks.com).

A job with a `webhook_url` gets a POST on each terminal status (done, blocked, failed,
cancelled). The body is the job's JSON (as GET /api/v1/jobs/<id> answers it), with headers

    webhook-id: msg_<hex>            the same for every attempt of one delivery
    webhook-timestamp: <unix seconds> of the attempt
    webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">

keyed with the owner's secret (`whsec_<base64 of 32 random bytes>`; the key is the decoded
bytes), returned by GET /api/v1/account and rotated by POST /api/v1/account/webhook-secret.

No delivery is lost: jobs/actions writes the WebhookDelivery row (the outbox) in the same
transaction as the terminal status change (record_terminal, a receiver of actions.notify); after commit
a task on the io queue delivers it. An attempt first takes a lease on the row (next_attempt_at
moves past the attempt's timeout plus IMAGEGEN_WEBHOOK_LEASE_SLACK), so a worker killed
mid-attempt, or a dispatch lost with the broker, leaves a row that the reaper sends again
once the lease ends. A failed attempt (no 2xx answer in IMAGEGEN_WEBHOOK_TIMEOUT, a
redirect, a refused address) is retried with exponential backoff (IMAGEGEN_WEBHOOK_BACKOFF
seconds, doubling, at most an hour apart) until IMAGEGEN_WEBHOOK_RETRY_HOURS after the status
change; then the row is marked given up. Every attempt is logged on the row (the admin shows it).
Delivery is at least once: receivers deduplicate by webhook-id.

Targets: https, or http to a loopback address when IMAGEGEN_EMBEDDED. Private, loopback,
link-local and other non-public addresses are refused unless IMAGEGEN_EMBEDDED, both when the
URL is given and at each attempt (the name is resolved once per attempt and the connection made
to the checked address, so a DNS answer that changes in between cannot redirect it). Redirects
are never followed.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import logging
import secrets
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from imagegen import stage_table
from jobs.representation import JobSerializer

log = logging.getLogger(__name__)

SECRET_PREFIX = "whsec_"
MAX_BACKOFF = 3600.0
class WebhookURLError(ValueError):
    pass


# --- secrets and signatures ---

def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_for(user) -> str:
    """The user's signing secret, made on first use."""
    from jobs.models import WebhookSecret

    row, _ = WebhookSecret.objects.get_or_create(user=user, defaults={"secret": new_secret()})
    return row.secret


def rotate_secret(user) -> str:
    from jobs.models import WebhookSecret

    secret = new_secret()
    WebhookSecret.objects.update_or_create(user=user, defaults={"secret": secret, "created_at": timezone.now()})
    return secret


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """The `webhook-signature` header, by the scheme's reference implementation."""
    return Webhook(secret).sign(msg_id, datetime.fromtimestamp(timestamp, tz=UTC), body)


def verify(secret: str, headers: dict, body: str) -> bool:
    """What a receiver does (the tests use it): the reference implementation's check (any v1
    signature matches, the timestamp within five minutes of now)."""
    try:
        Webhook(secret).verify(body, headers, json_parse=False)
    except WebhookVerificationError:
        return False
    return True


# --- targets ---

def _is_loopback_literal(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# IPv6 prefixes that carry an IPv4 address a gateway or relay forwards to: a public-looking v6
# address in them can reach a private v4 one (64:ff9b::10.0.0.1), so they are refused outright;
# the message names the IPv4 they embed where it can be read.
_TRANSLATED = [
    ipaddress.ip_network("64:ff9b::/96"),  # NAT64, well-known prefix (RFC 6052)
    ipaddress.ip_network("64:ff9b:1::/48"),  # NAT64, local use (RFC 8215)
    ipaddress.ip_network("2002::/16"),  # 6to4 (RFC 3056)
    ipaddress.ip_network("2001::/32"),  # Teredo (RFC 4380)
    ipaddress.ip_network("::/96"),  # IPv4-compatible (deprecated, RFC 4291): ::10.0.0.1
    ipaddress.ip_network("::ffff:0:0:0/96"),  # SIIT (RFC 2765): ::ffff:0:10.0.0.1
]
# Site-local (fec0::/10, deprecated by RFC 3879): private, though Python counts it global.
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if any(ip in net for net in (_TRANSLATED[0], _TRANSLATED[4], _TRANSLATED[5])):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _refusal(address: str) -> str | None:
    """Why this resolved address may not be a target (outside the embedded setup), or None."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if any(ip in net for net in _TRANSLATED):
            carried = f" (it carries the IPv4 address {inner})" if inner is not None else ""
            return f"{address} is a NAT64, 6to4, Teredo, IPv4-compatible or SIIT address{carried}"
        if inner is not None and not _public(str(inner)):
            return f"{address} maps the private or reserved IPv4 address {inner}"
    if not _public(address):
        return f"{address}, a private or reserved address"
    return None


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_global and not ip.is_multicast and not (isinstance(ip, ipaddress.IPv6Address) and ip in _SITE_LOCAL)


class _Lookups:
    """Host lookups on a pool of their own. A lookup that hangs cannot be stopped: its thread stays
    taken until the resolver gives up, so the caller waits at most IMAGEGEN_WEBHOOK_RESOLVE_TIMEOUT
    seconds and a user may hold at most IMAGEGEN_WEBHOOK_LOOKUPS_PER_USER lookups not yet answered
    (hung ones included): one user's unresolvable hosts cannot take the threads another user's
    valid URL needs. Submits and deliveries use two of these, so neither starves the other."""

    def __init__(self, threads: int, name: str):
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self.lock = threading.Lock()
        self.pending: dict[object, int] = {}

    def _done(self, who) -> None:
        with self.lock:
            self.pending[who] -= 1
            if not self.pending[who]:
                del self.pending[who]

    def resolve(self, host: str, port: int, who=None) -> list[str]:
        timeout = settings.IMAGEGEN_WEBHOOK_RESOLVE_TIMEOUT
        if who is not None:
            with self.lock:
                if self.pending.get(who, 0) >= settings.IMAGEGEN_WEBHOOK_LOOKUPS_PER_USER:
                    raise WebhookURLError("earlier lookups of your webhook hosts have not answered yet; "
                                          "try again in a few seconds")
                self.pending[who] = self.pending.get(who, 0) + 1
        future = self.pool.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        if who is not None:
            future.add_done_callback(lambda _f: self._done(who))
        try:
            infos = future.result(timeout=timeout)
        except FutureTimeout:
            future.cancel()
            raise WebhookURLError(f"the host {host!r} did not resolve within {timeout:g} s") from None
        except OSError as exc:
            raise WebhookURLError(f"the host {host!r} does not resolve ({exc})") from None
        return sorted({str(info[4][0]) for info in infos})


_submit_lookups = _Lookups(16, "webhook-dns")  # a submit's check of its webhook URL, bounded per user
_delivery_lookups = _Lookups(8, "webhook-dns-send")  # each delivery's look again, at send time


def _resolve(host: str, port: int, who=None, lookups: _Lookups | None = None) -> list[str]:
    """The host's addresses (the caller, a request thread or a delivery, waits a bounded time)."""
    return (lookups or _delivery_lookups).resolve(host, port, who)


def _check_addresses(host: str, addresses: list[str], scheme: str) -> None:
    embedded = settings.EMBEDDED
    for address in addresses:
        ip = ipaddress.ip_address(address)
        if scheme == "http" and not ip.is_loopback:
            raise WebhookURLError("http is allowed only to a loopback address (and only when embedded); use https")
        refusal = None if embedded else _refusal(address)
        if refusal:
            raise WebhookURLError(f"{host!r} resolves to {refusal}")


def _parts(url: str) -> tuple[str, str, int, str]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise WebhookURLError("is not a valid URL") from None
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise WebhookURLError("must be an https URL")
    if scheme == "http" and not settings.EMBEDDED:
        raise WebhookURLError("must be an https URL (http is allowed only to loopback when embedded)")
    if not parts.hostname:
        raise WebhookURLError("has no host")
    if scheme == "http" and parts.hostname != "localhost" and not _is_loopback_literal(parts.hostname):
        raise WebhookURLError("must be an https URL (http is allowed only to a loopback address when embedded)")
    if parts.username or parts.password:
        raise WebhookURLError("must not carry a user name or password")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return scheme, parts.hostname, port or (443 if scheme == "https" else 80), path


def validate_url(url: str, who=None) -> str:
    """The URL if it may be a webhook target, else WebhookURLError saying why. `who`: the user
    submitting it (their lookups not yet answered are bounded)."""
    if len(url) > 2000:
        raise WebhookURLError("is longer than 2000 characters")
    scheme, host, port, _ = _parts(url)
    _check_addresses(host, _resolve(host, port, who, _submit_lookups), scheme)
    return url


# --- the outbox ---

def record_terminal(sender=None, job_ids=(), **kwargs) -> None:
    """Receiver of jobs.actions.notify.status_changed, inside the transaction that moved these
    jobs: an outbox row for each job now in a terminal status with a webhook URL, and its
    delivery after commit."""
    from jobs.models import TERMINAL_STATUSES, GenerationJob, WebhookDelivery

    jobs = list(GenerationJob.objects.filter(id__in=list(job_ids), status__in=list(TERMINAL_STATUSES))
                .exclude(webhook_url="").select_related("batch").prefetch_related("images"))
    made = []
    for job in jobs:
        # A terminal status is announced once each time the job reaches it: the same status
        # written again (a duplicate run of the same move) is not a new one; the same status
        # reached again is, and only a moderator's decision takes a job out of a terminal status
        # (blocked, an appeal overturned, blocked again by the image check), so it is a new
        # arrival when a human verdict was given after the last announcement.
        last = WebhookDelivery.objects.filter(job=job).order_by("-announcement").values_list(
            "status", "announcement", "created_at").first()
        if last is not None and last[0] == job.status and not job.verdicts.filter(
                stage="human", created_at__gt=last[2]).exists():
            continue
        body = json.dumps(JobSerializer(job).data, separators=(",", ":"), default=str)
        # The dispatch after commit holds the row for one lease; should it be lost, the reaper
        # sends the row once that lease ends.
        made.append(WebhookDelivery.objects.create(
            job=job, status=job.status, announcement=0 if last is None else last[1] + 1, url=job.webhook_url,
            body=body, next_attempt_at=timezone.now() + timedelta(seconds=lease_seconds())).id)
    if made:
        transaction.on_commit(lambda: send_deliveries(made, first=True), robust=True)


def lease_seconds() -> float:
    return settings.IMAGEGEN_WEBHOOK_TIMEOUT + settings.IMAGEGEN_WEBHOOK_LEASE_SLACK


def send_deliveries(delivery_ids, first: bool = False) -> None:
    """Dispatch attempts; a lost dispatch is the reaper's (resend_due)."""
    for delivery_id in delivery_ids:
        stage_table.send("webhook", str(delivery_id), kwargs={"first": True} if first else None)


def resend_due(limit: int = 500) -> int:
    """The reaper: undelivered rows whose next attempt is due (a lost dispatch, a worker killed
    mid-attempt once its lease ends, a retry whose countdown was lost)."""
    from jobs.models import WebhookDelivery

    due = list(WebhookDelivery.objects.filter(delivered_at=None, gave_up_at=None, next_attempt_at__lte=timezone.now())
               .order_by("next_attempt_at").values_list("id", flat=True)[:limit])
    send_deliveries(due)
    return len(due)


def backoff(attempts: int) -> float:
    return min(MAX_BACKOFF, settings.IMAGEGEN_WEBHOOK_BACKOFF * 2 ** max(0, attempts - 1))


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to a checked address, with the certificate checked for the URL's host name."""

    def __init__(self, address: str, host: str, port: int, timeout: float):
        self._tls = ssl.create_default_context()
        super().__init__(address, port, timeout=timeout, context=self._tls)
        self._server_name = host

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self._server_name)


def _cut(conn: http.client.HTTPConnection, cut: threading.Event) -> None:
    """The attempt's total deadline passed: wake whatever socket operation it waits in."""
    cut.set()
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _post(url: str, headers: dict, body: bytes, timeout: float) -> int:
    """POST once, to the address checked now; the HTTP status (redirects are not followed).
    `timeout` bounds the whole attempt (connect, send, the answer's head and body), not each
    socket operation: a receiver that trickles its answer is cut off at the deadline."""
    scheme, host, port, path = _parts(url)
    addresses = _resolve(host, port)
    _check_addresses(host, addresses, scheme)
    address = addresses[0]
    conn: http.client.HTTPConnection
    if scheme == "https":
        conn = _PinnedHTTPS(address, host, port, timeout)
    else:
        conn = http.client.HTTPConnection(address, port, timeout=timeout)
    cut = threading.Event()
    deadline = threading.Timer(timeout, _cut, args=(conn, cut))
    deadline.daemon = True
    deadline.start()
    try:
        conn.request("POST", path, body=body, headers={**headers, "Host": host if port in (80, 443) else f"{host}:{port}"})
        response = conn.getresponse()
        response.read(65536)
        if cut.is_set():
            raise TimeoutError(f"no complete answer within {timeout:g}s")
        return response.status
    except (OSError, http.client.HTTPException) as exc:
        if cut.is_set():
            raise TimeoutError(f"no complete answer within {timeout:g}s") from exc
        raise
    finally:
        deadline.cancel()
        conn.close()


def deliver(delivery_id: str, first: bool = False) -> str:
    """One attempt (the io task): lease the row (counting the attempt), POST, record the
    outcome, schedule a retry. `first`: the dispatch made on commit, which may take the row
    before its first lease ends; any other attempt only once the row is due."""
    from django.db.models import F, Q

    from jobs.models import WebhookDelivery

    now = timezone.now()
    timeout = settings.IMAGEGEN_WEBHOOK_TIMEOUT
    due = Q(next_attempt_at__lte=now) | Q(attempts=0) if first else Q(next_attempt_at__lte=now)
    leased = WebhookDelivery.objects.filter(due, id=delivery_id, delivered_at=None, gave_up_at=None).update(
        next_attempt_at=now + timedelta(seconds=lease_seconds()), attempts=F("attempts") + 1
    )
    if not leased:
        return "not due"
    row = WebhookDelivery.objects.select_related("job__owner").get(id=delivery_id)
    attempt = row.attempts
    timestamp = int(time.time())
    headers = {
        "content-type": "application/json",
        "user-agent": "imagegen-webhooks/1",
        "webhook-id": row.message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret_for(row.job.owner), row.message_id, timestamp, row.body),
    }
    started = time.monotonic()
    code, error = None, ""
    try:
        code = _post(row.url, headers, row.body.encode(), timeout)
        if not 200 <= code < 300:
            error = f"HTTP {code}" + (" (redirects are not followed)" if 300 <= code < 400 else "")
    except WebhookURLError as exc:
        error = f"refused target: {exc}"
    except (OSError, http.client.HTTPException) as exc:
        error = f"{type(exc).__name__}: {exc}"
    seconds = round(time.monotonic() - started, 3)
    entry = {"attempt": attempt, "at": timezone.now().isoformat(), "status": code, "error": error, "seconds": seconds}
    fields: dict = {"last_status_code": code, "last_error": error, "log": [*row.log, entry][-50:]}
    if not error:
        fields["delivered_at"] = timezone.now()
        outcome = "delivered"
    else:
        retry_at = timezone.now() + timedelta(seconds=backoff(attempt))
        if retry_at > row.created_at + timedelta(hours=settings.IMAGEGEN_WEBHOOK_RETRY_HOURS):
            fields["gave_up_at"] = timezone.now()
            outcome = "gave up"
        else:
            fields["next_attempt_at"] = retry_at
            outcome = "retry"
    WebhookDelivery.objects.filter(id=delivery_id, attempts=attempt).update(**fields)
    if outcome == "retry":
        log.info("webhook %s attempt %s failed (%s); retrying in %.1fs", row.message_id, attempt, error, backoff(attempt))
        stage_table.send("webhook", str(delivery_id), countdown=backoff(attempt))  # lost: the reaper's
    elif outcome == "gave up":
        log.warning("webhook %s to %s given up after %s attempts: %s", row.message_id, row.url, attempt, error)
    return outcome
