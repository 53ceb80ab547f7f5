"""Sign-in throttling, so that nobody can lock an account's owner out.

- One address guessing one account: after IMAGEGEN_SIGNIN_MAX_FAILURES failures within
  IMAGEGEN_SIGNIN_WINDOW_SECONDS the pair (account, client address) is locked until the window
  slides; the owner signing in from anywhere else is not.
- One address guessing many accounts: the same limit per client address.
- Many addresses guessing one account: no lock for the account alone, but past the limit each
  further failure doubles a delay (1, 2, 4 ... s, at most IMAGEGEN_SIGNIN_MAX_DELAY) that every
  attempt on the account must wait after the last failure: a few guesses a minute at most. An
  address the account signed in from before (within IMAGEGEN_SIGNIN_KNOWN_DAYS) passes that
  delay, so guesses from elsewhere cannot keep the owner out; its own pair and address limits
  still hold.

Refused attempts are not checked and not counted (429 and Retry-After on the page's
/accounts/login/; the admin's form shows the message). A success does not clear the counts: an
attacker who knows one password must not reset the budget of the address they guess others'
from. The client address is DRF's (the peer uvicorn settled on: X-Forwarded-For believed only from
IMAGEGEN_TRUSTED_PROXIES; or through IMAGEGEN_NUM_PROXIES proxies). When
Redis is down, sign-in is not throttled (logged) rather than refused for everyone.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from redis.exceptions import RedisError
from rest_framework.throttling import BaseThrottle

from imagegen.redis_client import PREFIX, get_redis
from jobs.access import ratelimit

log = logging.getLogger(__name__)


def _account(username: str) -> str:
    return hashlib.sha256(username.strip().lower().encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _locks(username: str, request) -> list[str]:
    """The subjects that lock hard: the (account, address) pair and the address."""
    ip = BaseThrottle().get_ident(request) if request is not None else "-"
    return [f"signin:pair:{_account(username)}:{ip}", f"signin:ip:{ip}"]


def _account_key(username: str) -> str:
    return f"{PREFIX}signin:account:{_account(username)}"


def _known_key(username: str, request) -> str:
    ip = BaseThrottle().get_ident(request) if request is not None else "-"
    return f"{PREFIX}signin:known:{_account(username)}:{ip}"


def record_success(username: str, request) -> None:
    """The account signed in from this address: later, it passes the account-wide delay."""
    try:
        get_redis().set(_known_key(username, request), "1", ex=max(1, int(settings.IMAGEGEN_SIGNIN_KNOWN_DAYS * 86400)))
    except RedisError:
        log.warning("sign-in success not recorded (Redis)", exc_info=True)


def account_delay(failures: int) -> float:
    """Seconds an account's next attempt waits after its last failure, given its failures in
    the window (from any address)."""
    over = failures - settings.IMAGEGEN_SIGNIN_MAX_FAILURES
    if over <= 0:
        return 0.0
    return float(min(settings.IMAGEGEN_SIGNIN_MAX_DELAY, 2 ** min(over - 1, 30)))


def locked_for(username: str, request) -> int:
    """Seconds until this attempt may be checked (0: now)."""
    limit, window = settings.IMAGEGEN_SIGNIN_MAX_FAILURES, settings.IMAGEGEN_SIGNIN_WINDOW_SECONDS
    if limit <= 0:
        return 0
    try:
        waits = [ratelimit.take(subject, limit, window, consume=False) for subject in _locks(username, request)]
        state = {} if get_redis().exists(_known_key(username, request)) else get_redis().hgetall(_account_key(username))
    except RedisError:
        log.warning("sign-in throttling unavailable (Redis)", exc_info=True)
        return 0
    wait = max((v.retry_after for v in waits if not v.allowed), default=0)
    failures = int(state.get("n") or 0)
    last = float(state.get("last") or 0)
    delayed = last + account_delay(failures) - time.time()
    return max(wait, math.ceil(delayed) if delayed > 0 else 0)


def record_failure(username: str, request) -> None:
    limit, window = settings.IMAGEGEN_SIGNIN_MAX_FAILURES, settings.IMAGEGEN_SIGNIN_WINDOW_SECONDS
    if limit <= 0:
        return
    try:
        for subject in _locks(username, request):
            # Counted even past the limit (a large limit: the count itself is what is wanted).
            ratelimit.take(subject, 10**9, window)
        key = _account_key(username)
        pipe = get_redis().pipeline()
        pipe.hincrby(key, "n", 1)
        pipe.hset(key, "last", repr(time.time()))
        pipe.expire(key, max(1, int(window)))
        pipe.execute()
    except RedisError:
        log.warning("sign-in failure not counted (Redis)", exc_info=True)


def lockout_message(seconds: int) -> str:
    if seconds < 90:
        wait = f"{seconds} second{'s' if seconds != 1 else ''}"
    else:
        minutes = round(seconds / 60)
        wait = f"about {minutes} minutes"
    return f"Too many failed sign-ins for this account or from this address. Try again in {wait}."


class ThrottledSignin:
    """Mixin for Django's authentication forms: refuse while locked, count each failure."""

    locked_seconds = 0

    def clean(self):
        username = self.data.get("username", "") if hasattr(self, "data") else ""
        request = getattr(self, "request", None)
        self.locked_seconds = locked_for(str(username), request)
        if self.locked_seconds:
            raise ValidationError(lockout_message(self.locked_seconds), code="locked")
        try:
            cleaned = super().clean()
        except ValidationError as exc:
            if any(getattr(e, "code", None) == "invalid_login" for e in exc.error_list):
                record_failure(str(username), request)
            raise
        record_success(str(username), request)
        return cleaned


class SigninForm(ThrottledSignin, AuthenticationForm):
    pass


class AdminSigninForm(ThrottledSignin, AdminAuthenticationForm):
    pass


class LoginView(auth_views.LoginView):
    """The page's sign-in: 429 with Retry-After and the lockout message while locked."""

    authentication_form = SigninForm

    def form_invalid(self, form):
        seconds = getattr(form, "locked_seconds", 0)
        if not seconds:
            return super().form_invalid(form)
        response = self.render_to_response(self.get_context_data(form=form, locked=lockout_message(seconds)), status=429)
        response["Retry-After"] = str(seconds)
        return response
