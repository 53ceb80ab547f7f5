"""The generate stage (gpu.<lane>): take a batch, claim it, denoise and decode it, write each
image to private quarantine storage, hand the batch on to the image gate. Nothing else.

The GPU never waits for CPU work:

- the next batch is taken and claimed (with its fill wait) by a helper thread while the current
  one denoises, started when the pass is about a fill wait from its end, so a batch still fills
  with what arrives meanwhile;
- encoding, signing and the quarantine write run off the denoising thread: each denoised batch
  goes into a bounded hand-off (IMAGEGEN_HANDOFF_DEPTH batches), drained by a writer thread onto
  the encoders (gpu_tasks/encoders.py: IMAGEGEN_ENCODE_THREADS threads, or
  IMAGEGEN_ENCODE_PROCESSES processes of their own); when storage is slow the hand-off fills and
  the denoising thread waits, so memory stays flat;
- previews are judged by the image gate on a thread of their own (gpu_tasks/previews.py), and
  only the allowed ones are sent;
- leases of every job this worker holds (denoising, claimed ahead, waiting in the hand-off) are
  renewed by a keeper thread, the denoising one only while its pass makes progress, so a hung
  pipeline still loses its jobs to the reaper.

A denoised image is never lost to a storage or broker outage: its write is retried for as long
as this worker holds the job; the hand-off (image rows in quarantine, the batch moved to the
classify stage) is one transaction; the classify dispatch is re-sent by the reaper if the broker
lost it. And it never becomes public here: only the publish stage copies to public storage.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import UTC

from django.conf import settings
from django.db import DatabaseError, close_old_connections
from PIL import Image
from redis.exceptions import RedisError

from gpu_tasks import encoders
from gpu_tasks.encoders import Abandoned as _Abandoned
from gpu_tasks.encoders import retry_db as _retry_db
from gpu_tasks.pipeline import Row, get_model
from gpu_tasks.previews import PreviewGate
from imagegen import metrics
from imagegen.stage_table import STAGES
from jobs import actions
from jobs.media.storage import delete_quietly, quarantine_storage
from jobs.models import Batch, GeneratedImage, GenerationJob, JobStage
from jobs.pipeline import stages
from jobs.realtime import events
from safety import image_gate
from safety.image_policy import steered_negative
from safety.models import SafetyVerdict
from scheduling import catalogue, costs, heartbeats, scheduler

log = logging.getLogger(__name__)

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"
PREFETCH_MARGIN = 0.1  # seconds: start taking the next batch this long before the fill wait would end the pass
TOKEN_BUDGET = 30.0  # seconds one batch token keeps running batches back to back (then others' tokens run)


@dataclass
class Claimed:
    batch: Batch
    jobs: list[GenerationJob]
    counts: dict[str, int]

    @property
    def attempts(self) -> dict[str, int]:
        return {str(job.id): job.attempts for job in self.jobs}


def take_and_claim(lane: str, fill_wait: float | None = None) -> Claimed | None:
    """Take a batch from the scheduler and claim it at once; a partial batch then waits at most
    FILL_WAIT (or `fill_wait`) for more of its shape, claiming each arrival as it is taken. (Claiming right after
    taking keeps the window in which a job is neither in Redis nor running to milliseconds, so
    the reaper's rebuild does not re-enqueue work that a worker is about to run.)"""
    while True:
        taken = scheduler.take(lane)
        if taken is None:
            return None
        claimed = _claim_taken(lane, taken, fill_wait)
        if claimed is not None:
            return claimed
        # Every entry taken was stale (its job deleted, cancelled or running already): the token
        # takes again, or the live jobs behind such entries would wait for the reaper's next
        # token. Each take removes what it took, so this ends when the queue does.


def _claim_taken(lane: str, taken: scheduler.Taken, fill_wait: float | None = None) -> Claimed | None:
    shape = taken.shape
    info = scheduler.parse_shape(shape)
    cap = scheduler.cap_for(info["width"], info["height"], info["model_version"])
    batch = actions.open_batch(info, cap, WORKER_ID, lane)
    counts: dict[str, int] = {}
    jobs: dict[str, GenerationJob] = {}

    def claim(entries) -> None:
        fresh = [e for e in entries if e.job_id not in jobs]
        try:
            claimed = actions.claim_batch([e.job_id for e in fresh], batch.id)
        except Exception:
            # The take removed these entries from the buckets: put back those whose jobs still
            # wait for a GPU, so they do not wait for the reaper's rebuild (the claim rolled back).
            _put_back([e.job_id for e in fresh])
            raise
        for job in claimed:
            jobs[str(job.id)] = job
            counts[str(job.id)] = next(e.count for e in fresh if e.job_id == str(job.id))

    claim(taken.entries)
    if not jobs:  # nothing live among what was taken: no fill wait for a batch that has no job
        actions.drop_unclaimed_batch(batch.id)
        return None
    deadline = time.monotonic() + (scheduler.fill_wait_for(info["model_version"]) if fill_wait is None else fill_wait)
    while sum(counts.values()) < cap and time.monotonic() < deadline:
        time.sleep(0.02)
        more = scheduler.take(lane, only_shape=shape, max_images=cap - sum(counts.values()))
        if more is not None:
            claim(more.entries)
    for job in jobs.values():
        if job.queue_wait_seconds is not None:
            metrics.observe("imagegen_queue_wait_seconds", job.queue_wait_seconds)
    metrics.inc("imagegen_attempts_total", len(jobs))
    actions.size_batch(batch, sum(counts.values()))
    return Claimed(batch, list(jobs.values()), counts)


def _put_back(job_ids: list[str]) -> None:
    """Best effort: a failed claim's taken jobs that still wait for a GPU, back in their buckets."""
    try:
        for job in GenerationJob.objects.filter(id__in=job_ids, stage=JobStage.WAITING_GPU):
            actions.enqueue(job, job.scheduled_at.timestamp())
    except Exception:
        log.warning("a failed claim's jobs could not be put back; the reaper's rebuild will", exc_info=True)


@dataclass
class Denoised:
    claimed: Claimed
    rows: list[Row]
    images: list[Image.Image] | None  # None: every job was cancelled mid-pass
    cancelled: set[str]
    pass_started: float  # time.time()
    seconds: float  # on the device: the time it waited paused (`paused`) is not in it
    paused: float = 0.0


@dataclass
class _Current:
    job_ids: list[str]
    step: int = 0
    progressed_at: float = field(default_factory=time.monotonic)


_STOP = object()


class Runner:
    """One per lane in a GPU worker process."""

    def __init__(self, lane: str):
        self.lane = lane
        self._handoff: queue.Queue = queue.Queue(maxsize=max(1, settings.IMAGEGEN_HANDOFF_DEPTH))
        self._encoders = encoders.Encoders(lane)
        self._encoders.warm()  # processes (IMAGEGEN_ENCODE_PROCESSES) start now, not on the first batch
        self._ahead_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"take-ahead-{lane}")
        self._ahead: concurrent.futures.Future | None = None
        self._lock = threading.Lock()
        self._held: dict[str, set[str]] = {}  # batch id -> job ids waiting (claimed ahead, or in the hand-off)
        self._current: _Current | None = None
        self._paused: list[str] = []  # jobs of a batch-tier pass waiting at a step boundary (preemption)
        self._previews = PreviewGate()
        self._stopping = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name=f"handoff-{lane}", daemon=True)
        self._writer.start()
        self._keeper = threading.Thread(target=self._keep_leases, name=f"leases-{lane}", daemon=True)
        self._keeper.start()

    # --- the denoising thread -------------------------------------------------------------

    def run(self) -> list[str]:
        """A batch token: run batches back to back while there is work (the next one taken
        during the current pass), for at most TOKEN_BUDGET seconds."""
        deadline = time.monotonic() + TOKEN_BUDGET
        claimed = self._collect_ahead() or take_and_claim(self.lane)
        ran: list[str] = []
        while claimed is not None:
            self._denoise(claimed, take_ahead=time.monotonic() < deadline and not self._stopping.is_set())
            ran.append(str(claimed.batch.id))
            claimed = self._collect_ahead()
            if claimed is None and time.monotonic() < deadline and not self._stopping.is_set():
                claimed = take_and_claim(self.lane)
        return ran

    def _denoise(self, claimed: Claimed, take_ahead: bool, nested: bool = False) -> None:
        batch, jobs = claimed.batch, claimed.jobs
        have = set(GeneratedImage.objects.filter(job__in=jobs).values_list("job_id", "index"))  # cache hits
        rows = [
            Row(str(job.id), index, job.drawn_prompt, job.negative_prompt, job.seed + index)
            for job in jobs
            for index in range(job.count)
            if (job.id, index) not in have
        ]
        model = get_model(catalogue.version_of_lane(self.lane))  # the lane's model, loaded at worker start
        refused = _refused(model, rows, batch.guidance_scale)
        if refused:  # what the served family cannot honour fails alone, not with its batch
            for job in jobs:
                if str(job.id) in refused:
                    actions.fail_running(job, refused[str(job.id)])
            jobs = [job for job in jobs if str(job.id) not in refused]
            rows = [row for row in rows if row.job_id not in refused]
            claimed = Claimed(batch, jobs, {k: v for k, v in claimed.counts.items() if k not in refused})
            if not jobs:
                actions.close_empty(batch.id)
                return
        rows = _steered(model, catalogue.get(catalogue.version_of_lane(self.lane)), rows, jobs)
        job_ids = [str(job.id) for job in jobs]
        # A pass of batch-tier jobs only gives way to interactive work at a step boundary; a pass
        # run while another waits (nested) never pauses itself.
        preemptible = (settings.IMAGEGEN_PREEMPTION and not nested and all(job.priority == "batch" for job in jobs)
                       and getattr(model, "can_pause", lambda: False)())
        paused_seconds = 0.0
        cancelled: set[str] = set()
        first_row: dict[str, int] = {}  # each job's preview shows its first image
        for i, row in enumerate(rows):
            first_row.setdefault(row.job_id, i)
        created = {str(job.id): job.created_at.timestamp() for job in jobs}
        last_preview = 0.0
        asked_ahead = False
        current = _Current(job_ids)
        with self._lock:
            self._current = current
            self._held.pop(str(batch.id), None)
        pass_started = time.time()
        started = time.monotonic()

        def on_step(step: int, total: int, latents) -> bool:
            nonlocal last_preview, asked_ahead, paused_seconds
            waiting = False
            try:
                newly, waiting = scheduler.step_check([j for j in job_ids if j not in cancelled],
                                                      self.lane if preemptible and step < total else None)
                cancelled.update(newly)
            except RedisError:
                pass  # Redis is away: keep denoising; cancels are seen when it is back (or at publish)
            live = [j for j in job_ids if j not in cancelled]
            if not live:
                return True
            now = time.monotonic()
            current.step, current.progressed_at, current.job_ids = step, now, live
            for job_id in live:
                events.publish(job_id, {"type": "progress", "step": step, "total": total})
            if waiting:
                paused_seconds += self._pause_for_interactive(model, current, step, total)
                try:  # a job cancelled while its pass waited stops here
                    cancelled.update(scheduler.cancelled_among(live))
                except RedisError:
                    pass
                live = [j for j in job_ids if j not in cancelled]
                if not live:
                    return True
                now = time.monotonic()
                current.progressed_at, current.job_ids = now, live
            if take_ahead and not asked_ahead and step < total:
                remaining = (now - started - paused_seconds) / step * (total - step)
                if remaining <= scheduler.fill_wait_for(batch.model_version) + PREFETCH_MARGIN:
                    asked_ahead = True
                    self._take_ahead()
            if (
                step % max(1, settings.IMAGEGEN_PREVIEW_EVERY) == 0
                and step < total
                and now - last_preview >= settings.IMAGEGEN_PREVIEW_MIN_INTERVAL
            ):
                last_preview = now
                pictures = model.preview_images(latents, [first_row[j] for j in live], batch.width, batch.height)
                self._previews.offer(step, list(zip(live, pictures, strict=True)), created)
            return False

        actions.pass_started(batch.id)
        if take_ahead and rows and batch.steps <= 1:
            self._take_ahead()  # no step callback before the pass ends
        try:
            variant = {"variant": batch.scheduler} if batch.scheduler else {}  # the jobs' levers (a quality tier's)
            images = model.generate(rows, batch.width, batch.height, batch.steps, batch.guidance_scale, on_step, **variant)
        except (RedisError, DatabaseError) as exc:
            # Infrastructure, not the job: hand the jobs back to the reaper (lease ends now), so they
            # are requeued and generated again instead of failing for something they did not do.
            log.warning("batch %s interrupted by %s; returning its jobs to the queue", batch.id, type(exc).__name__,
                        extra={"batch_id": str(batch.id), "stage": "generate"})
            self._clear_current()
            actions.return_to_queue_now(job_ids)
            actions.close_empty(batch.id)
            return
        except Exception as exc:
            log.exception("batch %s failed", batch.id, extra={"batch_id": str(batch.id), "stage": "generate"})
            self._clear_current()
            for job in jobs:
                actions.fail_running(job, f"generation failed: {type(exc).__name__}: {exc}")
            _close_pass(batch, 0, time.monotonic() - started - paused_seconds, pass_started, paused_seconds)
            actions.close_empty(batch.id)
            return
        seconds = time.monotonic() - started - paused_seconds
        self._previews.forget(job_ids)
        with self._lock:
            self._held[str(batch.id)] = set(job_ids) - cancelled
            self._current = None
        self._handoff.put(Denoised(claimed, rows, images, cancelled, pass_started, seconds, paused_seconds))  # waits when full

    def _pause_for_interactive(self, model, paused: _Current, step: int, total: int) -> float:
        """Preemption at a step boundary: the batch-tier pass `paused` waits after `step` (its
        latents, generators and scheduler state kept: `model.paused()`) while the interactive
        work waiting for this lane runs, pass after pass, each taken without a fill wait (the
        device would idle through it), for as long as interactive work waits and at most the
        starvation bound. Returns the seconds it waited. Its jobs' leases are renewed meanwhile
        (while the passes run make progress); a worker killed now loses them to the reaper, which
        requeues them as for any killed pass: they run again from their seeds."""
        began = time.monotonic()
        with self._lock:
            self._paused = list(paused.job_ids)
        passes = 0
        try:
            with model.paused():
                while not self._stopping.is_set() and time.monotonic() - began < settings.IMAGEGEN_STARVATION_SECONDS:
                    try:
                        claimed = take_and_claim(self.lane, fill_wait=0.0)
                    except (RedisError, DatabaseError):
                        log.warning("taking the interactive work failed; the paused pass resumes", exc_info=True)
                        break
                    if claimed is None:  # another worker took it first
                        break
                    if not passes:  # told once something runs in its place (after the claim: not on the way)
                        for job_id in paused.job_ids:
                            events.publish(job_id, {"type": "paused", "step": step, "total": total})
                    self._denoise(claimed, take_ahead=False, nested=True)
                    passes += 1
                    try:
                        if not scheduler.interactive_waiting(self.lane):
                            break
                    except RedisError:
                        break
        finally:
            with self._lock:
                self._paused = []
                self._current = paused
            paused.progressed_at = time.monotonic()
        seconds = time.monotonic() - began
        log.info("a batch-tier pass waited %.2f s at step %d of %d for %d interactive pass(es)", seconds, step, total,
                 passes, extra={"stage": "generate"})
        return seconds

    def _clear_current(self) -> None:
        with self._lock:
            self._current = None

    def _take_ahead(self) -> None:
        if self._ahead is None:
            self._ahead = self._ahead_pool.submit(self._take_ahead_job)

    def _take_ahead_job(self) -> Claimed | None:
        close_old_connections()
        try:
            claimed = take_and_claim(self.lane)
        except (RedisError, DatabaseError):
            log.warning("taking the next batch ahead failed", exc_info=True)
            return None
        if claimed is not None:
            with self._lock:
                self._held[str(claimed.batch.id)] = set(claimed.attempts)
        return claimed

    def _collect_ahead(self) -> Claimed | None:
        if self._ahead is None:
            return None
        future, self._ahead = self._ahead, None
        return future.result()

    # --- the keeper thread ----------------------------------------------------------------

    def _keep_leases(self) -> None:
        lease = STAGES["generate"].lease_seconds
        every = max(0.2, min(2.0, lease / 3))
        while not self._stopping.wait(every):
            with self._lock:
                waiting = [j for ids in self._held.values() for j in ids]
                current = self._current
                paused = list(self._paused)
            try:
                close_old_connections()
                if waiting:
                    actions.renew_leases(waiting)
                if current is not None and time.monotonic() - current.progressed_at < lease:
                    actions.renew_leases(current.job_ids, progress_step=current.step)
                if paused and (current is None or time.monotonic() - current.progressed_at < lease):
                    actions.renew_leases(paused)  # waiting for the passes that preempted it, which progress
            except Exception:
                log.warning("renewing leases failed", exc_info=True)

    # --- the writer thread ----------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            item = self._handoff.get()
            try:
                if item is _STOP:
                    return
                close_old_connections()
                self._hand_off(item)
            except Exception:
                # The jobs' leases stop being renewed: the reaper requeues them and they are made
                # again (an image is a pure function of its inputs), so nothing is lost.
                log.exception("handing off a batch failed", extra={"stage": "hand-off"})
            finally:
                if item is not _STOP:
                    with self._lock:
                        self._held.pop(str(item.claimed.batch.id), None)
                self._handoff.task_done()

    def _hand_off(self, item: Denoised) -> None:
        batch = item.claimed.batch
        _close_pass(batch, len(item.rows) if item.images is not None else 0, item.seconds, item.pass_started, item.paused)
        if item.images is None:
            actions.close_empty(batch.id)
            return
        attempts = item.claimed.attempts
        live = [(row, image) for row, image in zip(item.rows, item.images, strict=True) if row.job_id not in item.cancelled]
        if not live:
            actions.close_empty(batch.id)
            return
        by_id = {str(job.id): job for job in item.claimed.jobs}
        futures = [(row, self._encoders.submit(row, image, batch.id, by_id[row.job_id])) for row, image in live]
        concurrent.futures.wait([f for _, f in futures])
        failed = {row.job_id: f.exception() for row, f in futures if f.exception() is not None}
        lost = {job_id for job_id, exc in failed.items() if self._encoders.broken(exc)}
        if lost:  # an encoder process died: its images are made again, from the queue
            self._encoders.restart_if_broken()
            _retry_db(lambda: actions.return_to_queue_now(sorted(lost)))
            failed.update({job_id: _Abandoned("an encoder process died") for job_id in lost})
        for row, f in futures:  # a job with a failed image delivers none: never leave its other objects behind
            if row.job_id in failed and f.exception() is None:
                delete_quietly(f.result().key, quarantine_storage())
        for job in item.claimed.jobs:
            exc = failed.get(str(job.id))
            if exc is not None and not isinstance(exc, _Abandoned):
                log.error("storing the images of job %s failed: %s", job.id, exc, extra={"batch_id": str(batch.id)})
                actions.fail_running(job, f"storing the images failed: {type(exc).__name__}")
        written = [f.result() for row, f in futures if row.job_id not in failed]
        if not written:
            actions.close_empty(batch.id)
            return
        held, orphans = _retry_db(lambda: actions.hand_off(batch.id, attempts, written))
        for w in orphans:
            delete_quietly(w.key, quarantine_storage())
        if held:
            stages.send_next("generate", self.lane, str(batch.id))

    # --- shutdown -------------------------------------------------------------------------

    def close(self, timeout: float = 60.0) -> None:
        """Warm shutdown: finish the hand-offs in flight; jobs claimed ahead go back to the queue."""
        self._stopping.set()
        if self._ahead is not None:
            claimed = self._collect_ahead()
            if claimed is not None:
                actions.return_to_queue_now(list(claimed.attempts))
                actions.close_empty(claimed.batch.id)
        self._handoff.put(_STOP)
        self._writer.join(timeout)
        self._encoders.shutdown()
        self._ahead_pool.shutdown(wait=False)


def _refused(model, rows: list[Row], guidance_scale: float) -> dict[str, str]:
    """Job id -> why the served model cannot make it as asked (gpu_tasks/families.py)."""
    refusal = getattr(model, "refusal", None)
    out: dict[str, str] = {}
    if refusal is None:
        return out
    for row in rows:
        why = refusal(row, guidance_scale)
        if why and row.job_id not in out:
            out[row.job_id] = why
    return out


def _steered(model, served, rows: list[Row], jobs: list[GenerationJob]) -> list[Row]:
    """The rows with the policy's steering in their negative prompts (safety/image_policy.py,
    "steer": away from what the image gate refuses, unless the prompt check found that category
    in the job's prompt or its rewrite), on a model that takes a negative prompt and whose
    serving.json does not opt out (`served.steer`); as they were on one that takes none (a
    distilled student, the simulated accelerator). A job that carries its steering (a
    regeneration: its original's) gets that; the others' is recorded on them."""
    takes_none = getattr(model, "negative_prompt_refusal", None)
    if takes_none is None or takes_none() is not None or (served is not None and not served.steer):
        return rows
    steering = {str(job.id): job.steering for job in jobs if job.steering is not None}
    todo = [job for job in jobs if job.steering is None]
    if todo:
        policy = image_gate.image_policy()
        asked: dict[str, set[str]] = {}
        found = (SafetyVerdict.objects.filter(job__in=todo, stage__in=("prompt", "rewrite"))
                 .exclude(decision="allow").values_list("job_id", "category"))
        for job_id, category in found:
            asked.setdefault(str(job_id), set()).add(category)
        made = {str(job.id): policy.steering(asked.get(str(job.id), set())) for job in todo}
        actions.record_steering(made)
        steering.update(made)
    return [replace(row, negative_prompt=steered_negative(steering.get(row.job_id, ""), row.negative_prompt))
            for row in rows]


def _close_pass(batch: Batch, images: int, seconds: float, pass_started: float, paused: float = 0.0) -> None:
    """The pass is over: its GPU-seconds on the batch row, the cost model, the metrics (`seconds`
    on the device; a pass that waited `paused` seconds for interactive work ended that much later)."""
    actions.pass_finished(batch.id, seconds, _at(pass_started + seconds + paused))
    heartbeats.record_busy(pass_started, pass_started + seconds)
    metrics.inc("imagegen_batches_total", model=batch.model_version)
    metrics.inc("imagegen_gpu_seconds_total", seconds, worker=WORKER_ID)
    metrics.observe("imagegen_batch_size", images)
    metrics.observe("imagegen_batch_fill", images / batch.cap if batch.cap else 0)
    if images:
        metrics.inc("imagegen_images_generated_total", images, model=batch.model_version)
        costs.record_batch_cost(
            scheduler.shape_key(batch.model_version, batch.width, batch.height, batch.steps, batch.guidance_scale,
                                batch.scheduler),
            images,
            seconds,
        )


def _at(timestamp: float):
    from datetime import datetime

    return datetime.fromtimestamp(timestamp, tz=UTC)


_runners: dict[str, Runner] = {}
_runners_lock = threading.Lock()


def runner_for(lane: str) -> Runner:
    with _runners_lock:
        if lane not in _runners:
            _runners[lane] = Runner(lane)
        return _runners[lane]


def close_runners() -> None:
    with _runners_lock:
        for runner in _runners.values():
            runner.close()
        _runners.clear()
