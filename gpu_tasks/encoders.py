"""The hand-off's encoders: each denoised image encoded in its job's format (its parameters in the
file), its content credentials signed and written once to quarantine storage.

They run off the denoising thread, on IMAGEGEN_ENCODE_THREADS threads of the GPU worker or, with
IMAGEGEN_ENCODE_PROCESSES > 0, in that many processes of their own (spawned, each with Django set
up once), so that on a fast GPU the encoding, the signing and the upload take none of the GPU
worker's interpreter: the denoising thread only hands each image over (its pixels pickled).
A process that dies takes its images' jobs back to the queue (they are made again: an image is a
pure function of its inputs) and the pool is started again.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections
from PIL import Image

from gpu_tasks.rows import Row

if TYPE_CHECKING:
    from jobs import actions

# This module is what a spawned encoder process unpickles before Django is set up (its
# initializer, write_one): the modules that need the app registry are imported in the functions.

log = logging.getLogger(__name__)

HANDOFF_DB_RETRY_SECONDS = 600.0


class Abandoned(Exception):
    """The image was not stored (storage away) and its job went back to the queue."""


def retry_db(operation):
    """The database is the truth, so a hand-off waits for it through an outage (bounded). Only
    an outage: an error the same statement would raise again (an integrity or programming error)
    is raised at once, not retried for ten minutes while the hand-off queue stops the GPU."""
    deadline = time.monotonic() + HANDOFF_DB_RETRY_SECONDS
    delay = 0.5
    while True:
        try:
            return operation()
        except (OperationalError, InterfaceError):
            if time.monotonic() > deadline:
                raise
            log.warning("database unavailable during a hand-off; retrying in %.1fs", delay)
            time.sleep(delay)
            close_old_connections()
            delay = min(delay * 2, 10.0)


def write_one(row: Row, image: Image.Image, batch_id, job) -> actions.Written:
    """Encoded once, in the job's format, with its parameters in the file (jobs/media/encoding.py)
    and its content credentials signed (jobs/media/credentials.py), then written to quarantine."""
    from jobs import actions
    from jobs.media import credentials, encoding
    from jobs.media.storage import is_transient, store_quarantined

    parameters = encoding.ImageParameters.of(job, row.seed, row.negative_prompt)
    # A clip's strip of frames stays lossless until publish packages it (gpu_tasks/video_model.py).
    fmt, compression = ("png", None) if job.frames > 1 else (job.output_format, job.output_compression)
    encoded = encoding.encode(image, fmt, compression, parameters)
    encoded, content_sha256 = credentials.credentialed(encoded, fmt, parameters)
    try:
        # Written once; on S3 botocore retries transient errors itself (IMAGEGEN_UPLOAD_ATTEMPTS).
        stored = store_quarantined(encoded.data, encoded.extension)
    except Exception as exc:
        if not is_transient(exc):
            raise
        # Storage still away: the job's lease ends now and the reaper puts it back in the
        # queue at once (as for a Redis or database interruption); the image is made again
        # later, since it is a pure function of its inputs. No loop holds the worker here.
        log.warning("quarantine write for batch %s failed (%s); the job goes back to the queue", batch_id, exc,
                    extra={"batch_id": str(batch_id), "stage": "hand-off"})
        retry_db(lambda: actions.return_to_queue_now([row.job_id]))
        raise Abandoned(str(exc)) from None
    return actions.Written(
        job_id=row.job_id, index=row.index, seed=row.seed, key=stored.key, width=image.width // max(1, job.frames), height=image.height,
        byte_size=stored.byte_size, sha256=stored.sha256, content_type=encoded.content_type,
        content_sha256=content_sha256,
    )


def _child_ready() -> None:
    import django

    django.setup()


class Encoders:
    """The lane's encoders: threads, or processes of their own (see the module's docstring)."""

    def __init__(self, lane: str):
        self.lane = lane
        self.processes = max(0, settings.IMAGEGEN_ENCODE_PROCESSES)
        self._lock = threading.Lock()
        self._pool = self._start()

    def _start(self) -> concurrent.futures.Executor:
        if self.processes:
            return concurrent.futures.ProcessPoolExecutor(
                self.processes, mp_context=multiprocessing.get_context("spawn"), initializer=_child_ready)
        return concurrent.futures.ThreadPoolExecutor(max(1, settings.IMAGEGEN_ENCODE_THREADS),
                                                     thread_name_prefix=f"encode-{self.lane}")

    def warm(self) -> None:
        """Start the processes now (each sets Django up once), not on the first batch."""
        if self.processes:
            with self._lock:
                pool = self._pool
            list(pool.map(_noop, range(self.processes)))

    def submit(self, row: Row, image: Image.Image, batch_id, job) -> concurrent.futures.Future:
        with self._lock:
            pool = self._pool
        try:
            return pool.submit(write_one, row, image, batch_id, job)
        except BrokenProcessPool:
            self.restart(pool)
            with self._lock:
                return self._pool.submit(write_one, row, image, batch_id, job)

    def restart(self, broken: concurrent.futures.Executor) -> None:
        """A process of the pool died: start a new pool (once, whoever notices first)."""
        with self._lock:
            if self._pool is broken:
                log.error("an encoder process died; starting the encoders again", extra={"stage": "hand-off"})
                broken.shutdown(wait=False, cancel_futures=True)
                self._pool = self._start()

    def restart_if_broken(self) -> None:
        with self._lock:
            pool = self._pool
        if getattr(pool, "_broken", False):
            self.restart(pool)

    def broken(self, exc: BaseException | None) -> bool:
        return isinstance(exc, BrokenProcessPool)

    def shutdown(self) -> None:
        with self._lock:
            self._pool.shutdown(wait=False)


def _noop(_: int) -> None:
    return None
