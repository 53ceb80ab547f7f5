"""imagegen.asgi's application with sync calls of the event streams held at a gate, for
tests/test_realtime_threads.py (served by uvicorn in a process of its own). Each is held only
where its variable is set:

- the job check (jobs.realtime.state.owned_job, a database read in the consumer's connect) of
  the job IMAGEGEN_TEST_HELD_JOB;
- the token lookup (jobs.realtime.state.token_user, a database read in the handshake's
  authentication middleware) of a header carrying IMAGEGEN_TEST_HELD_TOKEN;
- the hub's periodic re-read of a job's row (jobs.realtime.state.reread_events) of the job
  IMAGEGEN_TEST_HELD_REREAD_JOB.

Each held call touches `<name>.entered` in IMAGEGEN_TEST_GATE_DIR and then blocks its thread (as
a database read waiting on a lock would) until the test creates `open` there; every other call
runs as usual. The wrappers replace the calls' sync functions, not the async wrappers, so the
call still goes through the executor choice that is under test.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from imagegen.asgi import application  # noqa: F401  (what uvicorn serves)
from jobs.realtime import state

GATE = Path(os.environ["IMAGEGEN_TEST_GATE_DIR"])
HELD_JOB = os.environ.get("IMAGEGEN_TEST_HELD_JOB", "")
HELD_TOKEN = os.environ.get("IMAGEGEN_TEST_HELD_TOKEN", "")
HELD_REREAD_JOB = os.environ.get("IMAGEGEN_TEST_HELD_REREAD_JOB", "")
HOLD_AT_MOST = 120.0  # a test that died never opens the gate: the thread still comes back


def _hold(name: str) -> None:
    (GATE / f"{name}.entered").touch()
    deadline = time.monotonic() + HOLD_AT_MOST
    while not (GATE / "open").exists() and time.monotonic() < deadline:
        # The poll interval of the gate: holding this call until the test opens it (a file, since
        # the test runs in another process) is the slow call under test, not a wait for work.
        time.sleep(0.02)


def _held_owned_job(inner):
    def owned_job(user, job_id):
        if HELD_JOB and str(job_id) == HELD_JOB:
            _hold("owned_job")
        return inner(user, job_id)

    return owned_job


def _held_token_user(inner):
    def token_user(header: str):
        if HELD_TOKEN and HELD_TOKEN in header:
            _hold("token_user")
        return inner(header)

    return token_user


def _held_reread(inner):
    def reread(job_id, *args, **kwargs):
        if HELD_REREAD_JOB and str(job_id) == HELD_REREAD_JOB:
            _hold("reread")
        return inner(job_id, *args, **kwargs)

    return reread


state.owned_job.func = _held_owned_job(state.owned_job.func)
state.token_user.func = _held_token_user(state.token_user.func)
state.reread_events.func = _held_reread(state.reread_events.func)
