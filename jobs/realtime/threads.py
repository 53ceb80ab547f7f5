"""Where the websocket path's sync work runs: on a thread of its own per step, never on the one
thread a process shares.

asgiref runs a thread-sensitive sync call (Channels' `database_sync_to_async`, its session and
user lookups) on the ThreadSensitiveContext's thread when one is active, else on ONE thread per
process. Django opens a context per HTTP request (the SSE and OpenAI views get theirs); Channels
opens none for a websocket, so every socket's handshake lookup, job check and state read queued
on that one thread, and one slow read (a lock, a slow disk) held every socket of the process.

`own_thread()` is that context for one step: a handshake's authentication, or one handler of a
consumer (connect, disconnect). Per step rather than per connection: an open socket holds no
thread while it only forwards events. The step's thread opens its own database connection (the
connection is per thread), so the step closes it before the thread goes; persistent connections
(CONN_MAX_AGE) would otherwise stay open until the garbage collector found them.

The hub's periodic re-reads, which belong to no step, run on a small pool of their own
(jobs/realtime/state.py, `reread_events`). Nothing of the event streams is left on the shared thread.

Where a sync caller drives the event loop (a test's `async_to_sync`), asgiref runs every
thread-sensitive call on that caller's thread whatever the context says, as before: its
database transaction stays visible, and no thread is made here, so there is nothing to close.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from asgiref.sync import SyncToAsync, ThreadSensitiveContext
from django.db import connections


@asynccontextmanager
async def own_thread() -> AsyncIterator[None]:
    async with ThreadSensitiveContext() as context:
        try:
            yield
        finally:
            # Only a thread this step made (not an enclosing context's, not a sync caller's).
            executor = SyncToAsync.context_to_thread_executor.get(context)
            if executor is not None:
                await asyncio.get_running_loop().run_in_executor(executor, connections.close_all)
