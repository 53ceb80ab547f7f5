"""jobs/realtime/threads.py own_thread(), in process: a step's sync work runs on a thread of the
step's own, whose database connection is closed and whose thread is gone when the step ends; under
a sync caller (a test's async_to_sync) the work stays on the caller's thread and its connection
(with the caller's transaction) is left alone. The server-level behaviour (one held call stalls
no other socket) is tests/test_realtime_threads.py."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connections

from jobs.realtime.threads import own_thread

pytestmark = pytest.mark.django_db


def _connected():
    """On the thread it runs on: that thread's connection, opened, and the thread."""
    connection = connections["default"]
    connection.ensure_connection()
    return connection, threading.current_thread()


def test_a_step_runs_on_a_thread_of_its_own_and_closes_its_connection_when_it_ends():
    async def two_steps():
        seen = []
        for _ in range(2):
            async with own_thread():
                seen.append(await sync_to_async(_connected)())
                seen.append(await sync_to_async(_connected)())  # the same thread within a step
        return seen

    seen = asyncio.run(two_steps())  # no sync caller drives this loop, as in a server
    (first, t1), (again, t1b), (second, t2), _ = seen
    assert t1 is t1b and first is again
    assert t1 is not t2 and threading.current_thread() not in (t1, t2)
    assert first.connection is None and second.connection is None  # closed by their steps
    assert not t1.is_alive() and not t2.is_alive()


def test_under_a_sync_caller_the_step_uses_the_callers_thread_and_leaves_its_connection_open():
    async def step():
        async with own_thread():
            return await sync_to_async(_connected)()

    connection, thread = async_to_sync(step)()
    assert thread is threading.current_thread()
    assert connection is connections["default"] and connection.connection is not None
