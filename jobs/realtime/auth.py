"""Websocket authentication: the session cookie (web page) or `Authorization: Token ...`."""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack

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
