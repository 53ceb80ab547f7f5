"""API tokens stored hashed.

A token is `ig_<prefix>_<secret>`: 8 hex characters of prefix, kept in clear to find the row,
and 32 random bytes (base64url). The database keeps only the SHA-256 of the whole token: a
leaked database or backup gives no working token. A plain (unsalted, fast) hash is enough for
a random 256-bit secret; slow password hashes exist for guessable secrets, and would cost every
API request a hash. Tokens issued before hashing (40 hex characters, rest_framework.authtoken)
were hashed in place by migration jobs 0004 and keep working: their prefix is their first 8
characters.

The token is shown once, when issued (`manage.py issue_token`); it cannot be shown again.

Scopes: `full` (everything the user may do) and `jobs` (the jobs and the OpenAI routes, nothing
of the account's keys). A token issued by a token has at most its scope and expires no later
(`limits_of`); the routes that manage tokens or read the webhook secret need `FullScope`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.permissions import BasePermission

from imagegen.precompiled import Precompiled
from jobs.models import ApiToken

# Every authenticated API request runs it: compiled once (imagegen/precompiled.py).
_BY_PREFIX = Precompiled(lambda prefix: ApiToken.objects.select_related("user").filter(prefix=prefix),
                         prefix=ApiToken._meta.get_field("prefix"))

PREFIX_LEN = 8
LAST_USED_RESOLUTION = timedelta(minutes=10)  # last_used_at is written at most this often


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def prefix_of(token: str) -> str:
    if token.startswith("ig_") and token.count("_") >= 2:
        return token.split("_", 2)[1][:16]
    return token[:PREFIX_LEN]


SCOPES = ("full", "jobs")


def issue(user, name: str = "", expires_at=None, scope: str = "full") -> str:
    """A new token for the user; the caller shows it once (only its hash is stored)."""
    return issue_row(user, name, expires_at, scope)[0]


def issue_row(user, name: str = "", expires_at=None, scope: str = "full") -> tuple[str, ApiToken]:
    if scope not in SCOPES:
        raise ValueError(f"a token's scope is one of {SCOPES}, not {scope!r}")
    prefix = secrets.token_hex(PREFIX_LEN // 2)
    token = f"ig_{prefix}_{secrets.token_urlsafe(32)}"
    row = ApiToken.objects.create(user=user, prefix=prefix, digest=digest(token), name=name[:100], expires_at=expires_at,
                                  scope=scope)
    return token, row


def scope_of(request) -> str:
    """The request's scope: a token's own; `full` for a session (a person signed in)."""
    row = getattr(request, "auth", None)
    return row.scope if isinstance(row, ApiToken) else "full"


def issuer_expiry(request):
    """The latest a token issued by this request may expire: its token's expiry (None: no
    bound, for a session or a token that never expires)."""
    row = getattr(request, "auth", None)
    return row.expires_at if isinstance(row, ApiToken) else None


class FullScope(BasePermission):
    """The account's keys (tokens, the webhook secret) need a full-scope token or a session."""

    message = ("this token's scope is 'jobs': managing tokens and the webhook secret needs a full-scope token "
               "or a signed-in session")

    def has_permission(self, request, view) -> bool:
        return scope_of(request) == "full"


def revoke(user, token_id: int) -> bool:
    """Delete one of the user's tokens; False when it is not theirs (or gone)."""
    return ApiToken.objects.filter(user=user, id=token_id).delete()[0] > 0


def revoke_all(user) -> int:
    return ApiToken.objects.filter(user=user).delete()[0]


def find(token: str) -> ApiToken | None:
    """The token's row (with its user), or None; constant-time comparison of the hashes."""
    if not token or len(token) > 200:
        return None
    wanted = digest(token)
    for row in _BY_PREFIX(prefix=prefix_of(token)):
        if hmac.compare_digest(row.digest, wanted):
            now = timezone.now()
            if row.expires_at is not None and row.expires_at <= now:
                return None
            if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
                ApiToken.objects.filter(id=row.id).update(last_used_at=now)
            return row
    return None


def user_for_token(token: str):
    """The active user the token belongs to, or None."""
    row = find(token)
    if row is None or not row.user.is_active:
        return None
    return row.user


class HashedTokenAuthentication(TokenAuthentication):
    """`Authorization: Token <token>` against the hashed tokens (DRF's TokenAuthentication
    parsing, this lookup)."""

    def authenticate_credentials(self, key):
        row = find(key)
        if row is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        if not row.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        return (row.user, row)


class BearerTokenAuthentication(HashedTokenAuthentication):
    """The same tokens as `Authorization: Bearer <token>` (what OpenAI clients send)."""

    keyword = "Bearer"
