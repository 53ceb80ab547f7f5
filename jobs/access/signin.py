"""Sign-in throttling: at most IMAGEGEN_SIGNIN_MAX_FAILURES failed sign-ins per
IMAGEGEN_SIGNIN_WINDOW_SECONDS per account and per client IP (counted in the shared Redis,
jobs/access/ratelimit.py); past that the sign-in is refused without checking the password, with a
lockout message (429 and Retry-After on the page's /accounts/login/; the admin's form shows the
message). Guessing one account's password from many addresses, or many accounts' from one
address, both stop after a handful of tries.

A success does not clear the counts: an attacker who knows one password must not reset the
budget of the address they guess others' from. When Redis is down, sign-in is not throttled
(logged) rather than refused for everyone.
"""

from __future__ import annotations

import hashlib
import logging

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from redis.exceptions import RedisError
from rest_framework.throttling import BaseThrottle

from jobs.access import ratelimit

log = logging.getLogger(__name__)


def _subjects(username: str, request) -> list[str]:
    account = hashlib.sha256(username.strip().lower().encode("utf-8", "surrogatepass")).hexdigest()[:32]
    ip = BaseThrottle().get_ident(request) if request is not None else "-"
    return [f"signin:account:{account}", f"signin:ip:{ip}"]


def locked_for(username: str, request) -> int:
    """Seconds until this account or address may try again (0: not locked)."""
    limit, window = settings.IMAGEGEN_SIGNIN_MAX_FAILURES, settings.IMAGEGEN_SIGNIN_WINDOW_SECONDS
    if limit <= 0:
        return 0
    try:
        waits = [ratelimit.take(subject, limit, window, consume=False) for subject in _subjects(username, request)]
    except RedisError:
        log.warning("sign-in throttling unavailable (Redis)", exc_info=True)
        return 0
    return max((v.retry_after for v in waits if not v.allowed), default=0)


def record_failure(username: str, request) -> None:
    limit, window = settings.IMAGEGEN_SIGNIN_MAX_FAILURES, settings.IMAGEGEN_SIGNIN_WINDOW_SECONDS
    if limit <= 0:
        return
    try:
        for subject in _subjects(username, request):
            # Counted even past the limit (a large limit: the count itself is what is wanted).
            ratelimit.take(subject, 10**9, window)
    except RedisError:
        log.warning("sign-in failure not counted (Redis)", exc_info=True)


def lockout_message(seconds: int) -> str:
    minutes = max(1, round(seconds / 60))
    return (f"Too many failed sign-ins for this account or from this address. Try again in about "
            f"{minutes} minute{'s' if minutes != 1 else ''}.")


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
            return super().clean()
        except ValidationError as exc:
            if any(getattr(e, "code", None) == "invalid_login" for e in exc.error_list):
                record_failure(str(username), request)
            raise


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
