"""An ASGI wrapper that tells a view its client has gone.

Django cancels an async view when the client disconnects, but only when every middleware is
async-capable: with a sync-only one in the chain (WhiteNoise), the view runs in a task that
Django cannot reach, and would wait on for a client that is gone. This wrapper watches the
ASGI receive channel for http.disconnect (Django's handler reads it while the view runs) and
sets an asyncio.Event that it puts in the scope as scope[CLIENT_GONE]; a view that waits
(jobs/api/openai/views.py) waits on that too.
"""

from __future__ import annotations

import asyncio

CLIENT_GONE = "imagegen.client_gone"


class ClientGone:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        gone = asyncio.Event()

        async def watched():
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
            return message

        return await self.app({**scope, CLIENT_GONE: gone}, watched, send)
