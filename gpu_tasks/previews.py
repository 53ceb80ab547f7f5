"""Gated previews: a preview is an image too, so it passes the image gate before any watcher
sees it.

The denoising thread only makes the small pictures and offers them; a gate thread judges each
round in one batched call and sends the allowed ones. Each round is judged afresh: a preview judged
block or review is not sent, and the job's next round is judged on its own (an early, blurry
preview the gate cannot tell from a star withheld every later one: the default model's previews of
the README's own example never arrived). When the gate fails, that round sends nothing. The pass's
end ends its previews, so a job whose final images are held or blocked shows none after them.
Previews are best effort: a round offered while the gate is still busy with the previous one is
dropped, so the GPU never waits for the gate.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from PIL import Image

from imagegen import metrics
from jobs.media import encoding
from jobs.realtime import events
from safety import image_gate

log = logging.getLogger(__name__)


class PreviewGate:
    def __init__(self) -> None:
        self._rounds: queue.Queue = queue.Queue(maxsize=1)
        self._lock = threading.Lock()
        self._sent: set[str] = set()  # jobs that have had a preview (for time-to-first-preview)
        self._thread = threading.Thread(target=self._loop, name="preview-gate", daemon=True)
        self._thread.start()

    def offer(self, step: int, pictures: list[tuple[str, Image.Image]], created: dict[str, float]) -> bool:
        """Hand a round of previews to the gate; False when the gate is busy (the round is dropped)."""
        try:
            self._rounds.put_nowait((step, pictures, created))
            return True
        except queue.Full:
            return False

    def forget(self, job_ids) -> None:
        """The jobs' pass is over: no more previews will be offered for them."""
        with self._lock:
            self._sent.difference_update(job_ids)

    def drain(self, timeout: float = 5.0) -> None:
        """Wait until the rounds offered so far are judged (tests and shutdown)."""
        deadline = time.monotonic() + timeout
        while (self._rounds.unfinished_tasks or 0) and time.monotonic() < deadline:
            time.sleep(0.01)

    def _loop(self) -> None:
        while True:
            step, pictures, created = self._rounds.get()
            try:
                self._judge_and_send(step, pictures, created)
            except Exception:
                log.exception("a preview round failed; nothing of it was sent")
            finally:
                self._rounds.task_done()

    def _judge_and_send(self, step: int, pictures: list[tuple[str, Image.Image]], created: dict[str, float]) -> None:
        try:
            judgements = image_gate.judge([picture for _, picture in pictures])
        except image_gate.ImageGateError as exc:
            log.warning("the image gate failed on a preview round (%s); no previews sent", exc)
            return
        for (job_id, picture), judgement in zip(pictures, judgements, strict=True):
            if judgement.decision != "allow":
                metrics.inc("imagegen_previews_withheld_total", decision=judgement.decision)
                continue
            events.publish(job_id, {"type": "preview", "step": step, "image": encoding.jpeg_data_url(picture)})
            with self._lock:
                first = job_id not in self._sent
                self._sent.add(job_id)
            if first and job_id in created:
                metrics.observe("imagegen_time_to_first_preview_seconds", time.time() - created[job_id])
