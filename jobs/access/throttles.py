"""API request rates: DRF throttles counted in the shared Redis (jobs/access/ratelimit.py), so every
web process sees the same count and concurrent requests cannot overshoot it.

UserRateThrottle counts per signed-in user (all their tokens and sessions together),
IPRateThrottle per client address (DRF's get_ident: the peer address, or X-Forwarded-For with
REST_FRAMEWORK NUM_PROXIES = IMAGEGEN_NUM_PROXIES). Rates are read from the settings on each
request. Past a rate: 429 with Retry-After and the body the other limits answer,
`{detail, limit, eta_seconds, retry_after}`. When Redis is down the throttles let requests
through (logged): reads that need only the database keep working during a Redis outage.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError
from rest_framework import exceptions
from rest_framework.throttling import BaseThrottle

from jobs.access import ratelimit

log = logging.getLogger(__name__)


class RateLimited(exceptions.Throttled):
    """A Throttled that carries the limit's name and the contract's 429 body itself."""

    def __init__(self, wait: float, limit: str, message: str):
        retry = max(1, math.ceil(wait))
        super().__init__(wait=retry)
        # A plain dict (not ErrorDetail strings): DRF's handler answers it as is, ints included.
        body: Any = {"detail": message, "limit": limit, "eta_seconds": None, "retry_after": retry}
        self.detail = body


class _RedisRateThrottle(BaseThrottle):
    setting = ""
    limit_name = ""
    what = ""

    def subject(self, request) -> str | None:
        raise NotImplementedError

    def allow_request(self, request, view) -> bool:
        rate = ratelimit.parse_rate(getattr(settings, self.setting))
        subject = self.subject(request)
        if rate is None or subject is None:
            return True
        count, window = rate
        try:
            verdict = ratelimit.take(subject, count, window)
        except RedisError:
            log.warning("request rate not checked (Redis unavailable)", exc_info=True)
            return True
        if verdict.allowed:
            return True
        raise RateLimited(
            verdict.retry_after, self.limit_name,
            f"More than {count} requests in {window:g}s {self.what}. Try again in {verdict.retry_after}s.",
        )

    def wait(self):  # RateLimited carries it
        return None


class UserRateThrottle(_RedisRateThrottle):
    setting = "IMAGEGEN_THROTTLE_USER"
    limit_name = "requests_per_user"
    what = "from your account"

    def subject(self, request) -> str | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        return f"user:{user.pk}"


class IPRateThrottle(_RedisRateThrottle):
    setting = "IMAGEGEN_THROTTLE_IP"
    limit_name = "requests_per_ip"
    what = "from your address"

    def subject(self, request) -> str | None:
        return f"ip:{self.get_ident(request)}"
