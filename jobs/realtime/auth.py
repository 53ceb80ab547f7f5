"""Websocket authentication: the session cookie (web page) or `Authorization: Token ...`."""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator

from jobs.realtime.state import token_user


class _TokenHeader:
    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers", []))
        header = headers.get(b"authorization", b"").decode("latin-1")
        if header:
            scope = {**scope, "user": await token_user(header)}
        return await self.inner(scope, receive, send)


def TokenOrSessionAuthMiddleware(inner):
    return AuthMiddlewareStack(_TokenHeader(inner))


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
