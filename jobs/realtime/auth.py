"""Websocket authentication: `Authorization: Token ...` (a script) or the session cookie (the
web page), looked up on a thread of the handshake's own (jobs/realtime/threads.py)."""

from __future__ import annotations

from channels.auth import AuthMiddleware
from channels.security.websocket import AllowedHostsOriginValidator
from channels.sessions import CookieMiddleware, SessionMiddleware

from jobs.realtime.state import token_user
from jobs.realtime.threads import own_thread


class _TokenOrSession(AuthMiddleware):
    """scope["user"]: the token's user when the handshake sends one (AnonymousUser for a bad
    one), else the session's."""

    async def resolve_scope(self, scope):
        header = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
        async with own_thread():
            if header:
                scope["user"] = await token_user(header)
            else:
                await super().resolve_scope(scope)


def TokenOrSessionAuthMiddleware(inner):
    return CookieMiddleware(SessionMiddleware(_TokenOrSession(inner)))


class OriginOrTokenScript:
    """The Origin check for websockets, which stops another site's page from opening a socket
    with the visitor's session cookie. Browsers always send Origin on a websocket; a handshake
    without one and with an `Authorization` header is a script holding a token (nothing ambient
    to abuse), so it skips the check and is authenticated by that token alone. A browser's
    cross-origin socket, or one without Origin and without a token, is still refused."""

    def __init__(self, inner):
        self.inner = inner
        self.checked = AllowedHostsOriginValidator(inner)

    async def __call__(self, scope, receive, send):
        names = {name for name, _ in scope.get("headers", [])}
        if b"origin" not in names and b"authorization" in names:
            return await self.inner(scope, receive, send)
        return await self.checked(scope, receive, send)
