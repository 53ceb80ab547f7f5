"""API request rates: a DRF throttle counted in the shared Redis (jobs/access/ratelimit.py), so
every web process sees the same count and concurrent requests cannot overshoot it.

Scoped per signed-in user (all their tokens and sessions together): submits (any request that
changes something: POST, PUT, PATCH, DELETE), reads (GET, HEAD) and streams (a view whose
`rate_scope` is "stream") each have a rate of their own (IMAGEGEN_THROTTLE_SUBMIT, _READ,
_STREAM), so a client polling its jobs never uses up its submits, nor the reverse. A
conditional read (If-None-Match) answered 304 costs a tenth of a request; it is charged the
tenth up front and the rest only when the answer is not a 304. On top, one rate per client
address for everything (IMAGEGEN_THROTTLE_IP; DRF's get_ident: the peer address, which the
deploy files leave to uvicorn, believing X-Forwarded-For only from IMAGEGEN_TRUSTED_PROXIES; or
X-Forwarded-For with REST_FRAMEWORK NUM_PROXIES = IMAGEGEN_NUM_PROXIES). The user's scope and
the address are checked in one Redis round trip. Rates are read from the settings on each
request.

Every throttled answer carries `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`
(seconds) and `RateLimit-Policy` (`N;w=SECONDS`) of the tighter of the two limits
(RateLimitMiddleware). Past a rate: 429 with Retry-After and the body the other limits
answer, `{detail, limit, eta_seconds, retry_after}`, limit `submits_per_user`,
`reads_per_user`, `streams_per_user` or `requests_per_ip`. When Redis is down the throttle
lets requests through (logged; a full Redis pool of this process is not an outage: that is
a server_busy 429): reads that need only the database keep working during a Redis
outage.

RateLimited (a DRF Throttled) is the one exception every 429 of the API is raised as.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from redis.exceptions import RedisError
from rest_framework import exceptions
from rest_framework.throttling import BaseThrottle

from imagegen.redis_client import PoolBusy
from jobs.access import ratelimit

log = logging.getLogger(__name__)

UNIT = 10  # a request costs UNIT, a conditional read answered 304 costs 1
NOT_MODIFIED_COST = 1

SCOPES = {
    "submit": ("IMAGEGEN_THROTTLE_SUBMIT", "submits_per_user", "submits"),
    "read": ("IMAGEGEN_THROTTLE_READ", "reads_per_user", "reads"),
    "stream": ("IMAGEGEN_THROTTLE_STREAM", "streams_per_user", "streams opened"),
}
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class RateLimited(exceptions.Throttled):
    """The API's one 429: a Throttled carrying the contract's body ({detail, limit,
    eta_seconds, retry_after}, plus `extra` fields) and Retry-After."""

    def __init__(self, wait: float, limit: str, message: str, eta_seconds: float | None = None,
                 **extra: Any):
        retry = max(1, math.ceil(wait))
        super().__init__(wait=retry)
        # A plain dict (not ErrorDetail strings): DRF's handler answers it as is, ints included.
        body: Any = {"detail": message, "limit": limit, "eta_seconds": eta_seconds, "retry_after": retry, **extra}
        self.detail = body


@dataclass
class _State:
    """What the throttle counted for this request, for the headers and the settling."""
    limits: list[ratelimit.Limit] = field(default_factory=list)
    verdicts: list[ratelimit.Verdict] = field(default_factory=list)
    conditional: bool = False


def _scope(request, view) -> str:
    scope = getattr(view, "rate_scope", None)
    if scope in SCOPES:
        return scope
    return "read" if request.method in SAFE_METHODS else "submit"


class RequestRateThrottle(BaseThrottle):
    """The user's scope and the client address, in one round trip."""

    def allow_request(self, request, view) -> bool:
        scope = _scope(request, view)
        setting, user_limit_name, what = SCOPES[scope]
        conditional = request.method == "GET" and bool(request.headers.get("If-None-Match"))
        cost = NOT_MODIFIED_COST if conditional else UNIT
        limits: list[ratelimit.Limit] = []
        names: list[tuple[str, str, int]] = []
        user = getattr(request, "user", None)
        user_rate = ratelimit.parse_rate(getattr(settings, setting))
        if user_rate is not None and user is not None and user.is_authenticated:
            limits.append(ratelimit.Limit(f"{scope}:{user.pk}", user_rate[0] * UNIT, user_rate[1], cost))
            names.append((user_limit_name, f"{what} from your account", user_rate[0]))
        ip_rate = ratelimit.parse_rate(settings.IMAGEGEN_THROTTLE_IP)
        if ip_rate is not None:
            limits.append(ratelimit.Limit(f"ip:{self.get_ident(request)}", ip_rate[0] * UNIT, ip_rate[1], cost))
            names.append(("requests_per_ip", "requests from your address", ip_rate[0]))
        if not limits:
            return True
        try:
            verdicts = ratelimit.take_all(limits)
        except PoolBusy:
            raise  # this process is busy, not Redis down: server_busy (jobs/api/errors.py)
        except RedisError:
            log.warning("request rate not checked (Redis unavailable)", exc_info=True)
            return True
        request._request.rate_state = _State(limits, verdicts, conditional)
        for (name, text, count), item, verdict in zip(names, limits, verdicts, strict=True):
            if not verdict.allowed:
                raise RateLimited(
                    verdict.retry_after, name,
                    f"More than {count} {text} in {item.window:g}s. Try again in {verdict.retry_after}s.",
                )
        return True

    def wait(self):  # RateLimited carries it
        return None


def stream_refusal(user_pk) -> RateLimited | None:
    """The `stream` scope for the event streams, which are not DRF views (SSE is an async view,
    websockets a consumer): count one stream opened by the user; past the rate, the refusal to
    answer with (`streams_per_user`). Lets the stream through when Redis is down, as the throttle
    does; the cap on streams open at once (jobs/realtime/streams.py) still holds."""
    setting, name, what = SCOPES["stream"]
    rate = ratelimit.parse_rate(getattr(settings, setting))
    if rate is None:
        return None
    try:
        verdict = ratelimit.take_all([ratelimit.Limit(f"stream:{user_pk}", rate[0] * UNIT, rate[1], UNIT)])[0]
    except RedisError:
        log.warning("stream rate not checked (Redis unavailable)", exc_info=True)
        return None
    if verdict.allowed:
        return None
    return RateLimited(verdict.retry_after, name, f"More than {rate[0]} {what} from your account in {rate[1]:g}s. "
                                                  f"Try again in {verdict.retry_after}s.")


def _headers(state: _State) -> dict[str, str]:
    """The tighter limit's RateLimit-* fields (draft-ietf-httpapi-ratelimit-headers)."""
    pairs = list(zip(state.limits, state.verdicts, strict=True))
    item, verdict = min(pairs, key=lambda pair: pair[1].remaining / pair[0].limit if pair[1].allowed else -1)
    remaining = int(verdict.remaining // UNIT) if verdict.allowed else 0
    return {
        "RateLimit-Limit": str(item.limit // UNIT),
        "RateLimit-Remaining": str(max(0, remaining)),
        "RateLimit-Reset": str(verdict.retry_after if not verdict.allowed else verdict.reset),
        "RateLimit-Policy": f"{item.limit // UNIT};w={item.window:g}",
    }


def _finish(request, response):
    state: _State | None = getattr(request, "rate_state", None)
    if state is None:
        return response
    if state.conditional and response.status_code != 304 and all(v.allowed for v in state.verdicts):
        try:  # the rest of a full request: the answer was not the cheap 304
            for item in state.limits:
                ratelimit.add(item.subject, item.window, UNIT - NOT_MODIFIED_COST)
        except RedisError:
            log.warning("conditional read not settled (Redis unavailable)", exc_info=True)
    for name, value in _headers(state).items():
        response[name] = value
    return response


class RateLimitMiddleware:
    """RateLimit-* headers on every throttled answer, and the settling of conditional reads."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(self.get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self.__acall__(request)
        return _finish(request, self.get_response(request))

    async def __acall__(self, request):
        return _finish(request, await self.get_response(request))
