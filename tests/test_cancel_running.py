"""Cancel through the API while the batch denoises: the GPU worker stops within a step."""

from __future__ import annotations

import threading
import time

import pytest
from asgiref.sync import async_to_sync
from channels import DEFAULT_CHANNEL_LAYER
from channels.layers import channel_layers

from jobs.models import Batch, GeneratedImage, GenerationJob
from jobs.realtime.events import group_name
from tests.conftest import wait_for_status

pytestmark = pytest.mark.django_db(transaction=True)


class Watcher:
    """Listens on the job's channel-layer group (what websocket and SSE watchers get), in a thread."""

    def __init__(self, job_id):
        self.job_id = str(job_id)
        self.events: list[tuple[float, dict]] = []
        self.subscribed = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=async_to_sync(self._run), daemon=True)
        self.thread.start()
        assert self.subscribed.wait(60)

    async def _run(self):
        import asyncio

        # A layer of its own: channels_redis binds a layer's receive lock to the first loop that
        # receives on it, and the process-wide layer may have served another test's loop.
        layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
        channel = await layer.new_channel()
        await layer.group_add(group_name(self.job_id), channel)
        self.subscribed.set()
        try:
            while not self.stop.is_set():
                try:
                    message = await asyncio.wait_for(layer.receive(channel), timeout=0.2)
                except TimeoutError:
                    continue
                self.events.append((time.monotonic(), message["event"]))
        finally:
            await layer.group_discard(group_name(self.job_id), channel)

    def steps(self, after: float = 0.0) -> list[int]:
        return [e["step"] for t, e in self.events if e["type"] == "progress" and t >= after]

    def wait_step(self, step: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(s >= step for s in self.steps()):
                return
            time.sleep(0.02)
        raise AssertionError(f"no progress step {step} within {timeout}s: {self.steps()}")

    def close(self):
        self.stop.set()
        self.thread.join(5)


def test_cancelling_a_running_job_stops_its_batch_within_one_step(workers, alice_api):
    # 4 images of 96x96 for 100 steps: about 0.35 s a step here, half a minute in all (and
    # under the admission limit on the estimated wait).
    steps = 100
    response = alice_api.post(
        "/api/v1/jobs",
        {"prompt": "a blue square", "width": 96, "height": 96, "steps": steps, "count": 4, "seed": 9},
        format="json",
    )
    assert response.status_code == 202, response.content
    job_id = response.json()["id"]
    watcher = Watcher(job_id)
    try:
        wait_for_status(job_id, ("running",), timeout=60)
        watcher.wait_step(2, timeout=60)
        seen = watcher.steps()

        cancelled_at = time.monotonic()
        response = alice_api.post(f"/api/v1/jobs/{job_id}/cancel")
        assert response.status_code == 202, response.content
        assert response.json()["status"] == "cancelled"
        at_cancel = max(watcher.steps(after=0) or [0])

        # The batch stops: its row is closed within about one step (plus the VAE decode).
        job = GenerationJob.objects.get(id=job_id)
        deadline = time.monotonic() + 120
        while Batch.objects.filter(id=job.batch_id, finished_at=None).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        batch = Batch.objects.get(id=job.batch_id)
        assert batch.finished_at is not None, "the batch kept running after the cancel"
        # How soon it stopped is counted in steps (below), not in seconds: a loaded machine's
        # step time varies more than the margin a wall-clock bound could allow.

        # At most one more progress event, for the step in flight when the flag was set.
        late = watcher.steps(after=cancelled_at)
        assert all(s <= at_cancel + 1 for s in late), (at_cancel, late)
        last_step = max(watcher.steps())
        assert last_step < steps // 4, (seen, last_step)
        assert GenerationJob.objects.get(id=job_id).progress_step < steps // 4

        # The worker is free: a small job right after runs to the end (how soon the cancelled
        # pass stopped is counted above in steps; a bound in seconds here failed under load).
        nxt = alice_api.post(
            "/api/v1/jobs", {"prompt": "a red circle", "width": 64, "height": 64, "steps": 2, "seed": 1}, format="json"
        ).json()
        wait_for_status(nxt["id"], ("done",), timeout=120)

        job = GenerationJob.objects.get(id=job_id)
        assert job.status == "cancelled" and job.reason == "cancelled by the owner"
        assert not GeneratedImage.objects.filter(job_id=job_id).exists()
        body = alice_api.get(f"/api/v1/jobs/{job_id}").json()
        assert body["status"] == "cancelled" and body["images"] == []
        final = [e for _, e in watcher.events if e["type"] == "status"][-1]
        assert final["status"] == "cancelled"
        assert [e for _, e in watcher.events if e["type"] == "status" and e["status"] == "done"] == []
    finally:
        watcher.close()


def test_cancelling_a_finished_job_answers_409_with_its_status(workers, alice_api, bob_api):
    job = alice_api.post(
        "/api/v1/jobs", {"prompt": "a red circle", "width": 64, "height": 64, "steps": 2, "seed": 4}, format="json"
    ).json()
    wait_for_status(job["id"], ("done",))
    assert bob_api.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 404
    response = alice_api.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert response.status_code == 409
    assert response.json()["status"] == "done"
    assert GenerationJob.objects.get(id=job["id"]).status == "done"
