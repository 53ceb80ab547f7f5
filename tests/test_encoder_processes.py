"""The hand-off's encoders in processes of their own (IMAGEGEN_ENCODE_PROCESSES, issue 48 item 5):
an image is encoded, signed and written to quarantine by another process, its file carrying
credentials that name its job; a dead encoder process is noticed, its pool started again and the
next image written; the thread default is unchanged."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from PIL import Image

from gpu_tasks import encoders
from gpu_tasks.rows import Row
from jobs.media import credentials
from jobs.media.storage import quarantine_storage
from jobs.models import GenerationJob

pytestmark = pytest.mark.integration  # starts processes of its own


def job_and_image(seed: int = 5) -> tuple[GenerationJob, Row, Image.Image]:
    job = GenerationJob(prompt="a red circle on a blue background", width=64, height=64, steps=4, guidance_scale=5.0,
                        seed=seed, model_version="shapes-v2", output_format="png")
    pixels = np.random.default_rng(seed).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    return job, Row(str(job.id), 0, job.prompt, "", seed), Image.fromarray(pixels)


@pytest.fixture
def process_encoders(settings):
    settings.IMAGEGEN_ENCODE_PROCESSES = 1
    pool = encoders.Encoders("test-lane")
    pool.warm()
    yield pool
    pool.shutdown()


def test_an_image_is_encoded_signed_and_stored_by_a_process_of_its_own(process_encoders):
    assert process_encoders._pool.submit(os.getpid).result(timeout=60) != os.getpid()
    job, row, image = job_and_image()
    written = process_encoders.submit(row, image, "batch-1", job).result(timeout=60)
    data = quarantine_storage().open(written.key).read()
    assert written.byte_size == len(data) and written.job_id == str(job.id)
    check = credentials.verify(data)
    assert check.ok and check.parameters["jobId"] == str(job.id)
    with Image.open(__import__("io").BytesIO(data)) as back:
        assert np.array_equal(np.asarray(back.convert("RGB")), np.asarray(image)), "lossless, the pixels given"


def test_a_dead_encoder_process_is_noticed_and_the_pool_starts_again(process_encoders):
    job, row, image = job_and_image(6)
    children = list(process_encoders._pool._processes)
    assert children
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    future = process_encoders.submit(row, image, "batch-2", job)
    with pytest.raises(Exception) as lost:
        future.result(timeout=60)
    assert process_encoders.broken(lost.value), lost.value
    process_encoders.restart_if_broken()
    written = process_encoders.submit(row, image, "batch-2", job).result(timeout=60)
    assert credentials.verify(quarantine_storage().open(written.key).read()).ok


def test_the_default_is_threads_in_the_worker(settings):
    assert settings.IMAGEGEN_ENCODE_PROCESSES == 0
    pool = encoders.Encoders("test-lane")
    try:
        assert pool._pool.submit(os.getpid).result(timeout=10) == os.getpid()
    finally:
        pool.shutdown()
