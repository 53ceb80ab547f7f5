"""Processes that die with their parent: Linux's parent-death signal (prctl PR_SET_PDEATHSIG).

The run command (scripts/run.py) starts every child in a session of its own (so Ctrl-C in a
terminal reaches only the supervisor, which stops them in order); without this a supervisor
killed outright would leave the web server, the workers and the private Redis running as
orphans. Each child asks for SIGKILL when its parent dies, and so do the processes the children
fork in turn (a Celery worker's pool, its embedded beat, uvicorn's worker processes) when
IMAGEGEN_DIE_WITH_PARENT is set, as the run command sets it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
ENV = "IMAGEGEN_DIE_WITH_PARENT"


def die_with_parent(expected_parent: int | None = None) -> None:
    """SIGKILL this process when its parent exits. `expected_parent`: the parent it must still
    have (a parent that died before the call leaves the child adopted: it exits at once)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)


def child_preexec(parent: int):
    """A subprocess.Popen preexec_fn: the child dies with `parent` (pass os.getpid())."""
    return lambda: die_with_parent(parent)


# The process that imported this module first. A process forked from it (a Celery pool process,
# the embedded beat) inherits the value: its parent's pid, recorded before the fork.
_IMPORTED_BY = os.getpid()


def die_with_parent_if_asked() -> None:
    """For a process that a supervised child forks (pool processes, uvicorn workers). A forked
    child checks against the pid its parent had before the fork, not os.getppid(): a parent
    killed between the fork and this call has left the child adopted already, and the adopter
    would pass for its parent (a pool process forked just as the worker was killed outlived it)."""
    if os.environ.get(ENV) == "1":
        forked = os.getpid() != _IMPORTED_BY
        die_with_parent(_IMPORTED_BY if forked else os.getppid())
