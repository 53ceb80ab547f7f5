"""Test settings: the real settings, pointed at a private Redis (or REDIS_URL's server on a
separate database), a temporary var dir and the tiny random pipeline.

Everything is set through the environment, so the Celery workers the tests start as separate
processes read exactly the same configuration through imagegen.settings.
"""

import atexit
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent

# Each pytest-xdist worker (PYTEST_XDIST_WORKER gw0, gw1, ...) prepares its own var folder,
# Redis database (and so its own Celery queues) and model copy; pytest-django gives it its own
# test database. A worker inherits the controller's prepared environment: it starts again from
# what the run was given.
_WHO = os.environ.get("PYTEST_XDIST_WORKER", "main")
_OURS = ("IMAGEGEN_", "REDIS_URL")

KEEP_VAR = False  # set by tests/conftest.py when the run failed: its worker logs stay to be read


def _clean_up(var: Path, redis_proc) -> None:
    """At exit of the process that prepared it: its private Redis stops and, unless the run
    failed, its var folder goes (about 30 MB a run: model copy, logs, storage)."""
    if redis_proc is not None:
        redis_proc.terminate()
        try:
            redis_proc.wait(10)
        except Exception:
            redis_proc.kill()
    if not KEEP_VAR:
        shutil.rmtree(var, ignore_errors=True)


if os.environ.get("IMAGEGEN_TEST_PREPARED") != _WHO:
    if "IMAGEGEN_TEST_GIVEN_ENV" in os.environ:
        given = json.loads(os.environ["IMAGEGEN_TEST_GIVEN_ENV"])
        for name in [n for n in os.environ if n.startswith(_OURS) and n != "IMAGEGEN_TEST_GIVEN_ENV"]:
            del os.environ[name]
        os.environ.update(given)
    else:
        os.environ["IMAGEGEN_TEST_GIVEN_ENV"] = json.dumps({n: v for n, v in os.environ.items() if n.startswith(_OURS)})
    os.environ["IMAGEGEN_TEST_PREPARED"] = _WHO
    _INDEX = int(_WHO[2:]) if _WHO.startswith("gw") and _WHO[2:].isdigit() else 0
    var = Path(tempfile.mkdtemp(prefix=f"imagegen-test-{_WHO}-"))
    _redis_proc = None
    os.environ["IMAGEGEN_VAR_DIR"] = str(var)
    if os.environ.get("REDIS_URL"):
        # A shared server: use a database of its own, emptied at the start (9, or
        # IMAGEGEN_TEST_REDIS_DB: two runs on one server at once each need their own; an xdist
        # worker adds its index).
        base = os.environ["REDIS_URL"].rsplit("/", 1)[0] if os.environ["REDIS_URL"].count("/") >= 3 else os.environ["REDIS_URL"]
        os.environ["REDIS_URL"] = f"{base}/{int(os.environ.get('IMAGEGEN_TEST_REDIS_DB', '9')) + _INDEX}"
    else:
        sys.path.insert(0, str(_ROOT))
        from scripts.private_redis import start

        _redis_proc, url = start(var / "redis")
        os.environ["REDIS_URL"] = url
    atexit.register(_clean_up, var, _redis_proc)
    os.environ.setdefault("IMAGEGEN_MODEL_PATH", str(var / "models" / "tiny-random"))
    os.environ.setdefault("IMAGEGEN_MODEL_VERSION", "tiny-random")
    # A real gate over a scripted classifier: tests switch it to raise, hang, block, ... at will.
    os.environ.setdefault("IMAGEGEN_IMAGE_CLASSIFIER", "python:tests.fake_classifiers:Scripted")
    # Long enough for a real classifier (NudeNet, the shapes classifier) on a loaded 2-core
    # machine: a timeout is tested where a test sets its own (tests/test_image_gate_failclosed.py).
    os.environ.setdefault("IMAGEGEN_CLASSIFIER_TIMEOUT", "60")
    os.environ.setdefault("IMAGEGEN_CDN_PURGE_HOOK", "tests.fake_classifiers:record_purge")
    os.environ.setdefault("IMAGEGEN_DEFAULT_STEPS", "4")
    os.environ.setdefault("IMAGEGEN_METRICS_CACHE_SECONDS", "0")  # scrapes see each test's rows at once
    os.environ.setdefault("IMAGEGEN_FILL_WAIT", "0.3")
    # The queue-wait limit is tested where a test sets it: on a loaded 2-core machine an honest
    # estimate behind another test's blocker can pass the 120 s default.
    os.environ.setdefault("IMAGEGEN_MAX_QUEUE_WAIT", "3600")
    # And the batch tier's (6 h by default): its estimate waits behind every interactive job and
    # arrival, and on a loaded machine the measured step costs made 12 batch images behind a
    # blocker an 8 h wait (a 429 in the fair-share test).
    os.environ.setdefault("IMAGEGEN_BATCH_MAX_QUEUE_WAIT", "864000")
    os.environ.setdefault("IMAGEGEN_BATCH_CAP", "4")
    os.environ.setdefault("IMAGEGEN_LEASE_SECONDS", "6")
    os.environ.setdefault("IMAGEGEN_REAPER_INTERVAL", "1")
    os.environ.setdefault("IMAGEGEN_PROMPT_CHECK_RESEND_SECONDS", "10")
    os.environ.setdefault("IMAGEGEN_STAGE_RETRY_MAX_BACKOFF", "4")
    os.environ.setdefault("IMAGEGEN_STAGE_RESEND_SECONDS", "20")
    os.environ.setdefault("IMAGEGEN_TORCH_THREADS", "1")
    # Only the tests of the rewrite stage turn it on (a request's `rewrite: on`).
    os.environ.setdefault("IMAGEGEN_REWRITE_DEFAULT", "off")
    os.environ.setdefault("IMAGEGEN_REWRITER_PATH", str(Path(__file__).resolve().parent.parent / "models" / "rewriter-v2"))
    # Webhooks: short attempts and retries, so a failure and its retry fit a test.
    os.environ.setdefault("IMAGEGEN_WEBHOOK_TIMEOUT", "2")
    os.environ.setdefault("IMAGEGEN_WEBHOOK_LEASE_SLACK", "2")
    os.environ.setdefault("IMAGEGEN_WEBHOOK_BACKOFF", "0.5")
    # 60x60 is on the menu only so a test can make the pipeline itself raise (sizes must be
    # multiples of 8): a real failure inside the real worker.
    os.environ.setdefault("IMAGEGEN_SIZE_MENU", "64x64,96x64,64x96,96x96,60x60")
    # Tests send far more than a person would, often as one user and from 127.0.0.1: the
    # abuse limits are off unless a test sets them (tests/test_limits.py, test_throttles.py).
    for name, value in (("IMAGEGEN_THROTTLE_SUBMIT", "off"), ("IMAGEGEN_THROTTLE_READ", "off"),
                        ("IMAGEGEN_THROTTLE_STREAM", "off"), ("IMAGEGEN_THROTTLE_IP", "off"),
                        ("IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE", "0"), ("IMAGEGEN_USER_MAX_IN_REVIEW", "1000"),
                        ("IMAGEGEN_USER_MAX_STREAMS", "1000")):
        os.environ.setdefault(name, value)

from imagegen.settings import *  # noqa: E402,F401,F403

# Tests create users by the hundred; the production hasher costs ~1 s each on a loaded core.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
