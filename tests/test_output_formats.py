"""Output formats and the parameters inside every image file: png, jpeg and webp encoded once on
the GPU worker, with the matching extension and content type (locally and on S3); a cache hit in
another format converted, not generated again; the parameters read back with Pillow alone."""

from __future__ import annotations

import io

import pytest
from django.test import Client, override_settings
from PIL import Image

from jobs.media.encoding import ImageParameters, encode, read_parameters
from jobs.models import Batch, GeneratedImage, GenerationJob
from tests.conftest import wait_for_status, wait_until_cached
from tests.test_generation import submit

pytestmark = pytest.mark.django_db(transaction=True)

EXIF_IFD, USER_COMMENT = 0x8769, 0x9286


def magic_ok(data: bytes, fmt: str) -> bool:
    return {
        "png": data.startswith(b"\x89PNG\r\n\x1a\n"),
        "jpeg": data.startswith(b"\xff\xd8\xff"),
        "webp": data[:4] == b"RIFF" and data[8:12] == b"WEBP",
    }[fmt]


def fetch(url: str):
    response = Client().get(url)
    assert response.status_code == 200, url
    return b"".join(response.streaming_content), response["Content-Type"]


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp"])
def test_each_output_format_round_trips_with_its_magic_bytes_content_type_and_parameters(workers, alice_api, fmt):
    job = submit(alice_api, prompt="a green square on a white background", negative_prompt="blurry, dark",
                 seed=5150, count=2, guidance_scale=4.5, output_format=fmt, output_compression=75)
    assert job["output_format"] == fmt and job["output_compression"] == 75
    done = wait_for_status(job["id"], ("done",))
    body = alice_api.get(f"/api/v1/jobs/{job['id']}").json()
    assert len(body["images"]) == 2
    for entry in body["images"]:
        assert entry["url"].endswith("." + fmt)
        data, content_type = fetch(entry["url"])
        assert content_type == f"image/{fmt}" and magic_ok(data, fmt)
        row = GeneratedImage.objects.get(id=entry["id"])
        assert row.content_type == f"image/{fmt}" and row.storage_key.endswith("." + fmt)
        params = read_parameters(data)
        assert params["prompt"] == "a green square on a white background"
        # what the model was given: the policy's steering, then the user's own (tests/test_policy_steering.py)
        assert params["negative_prompt"] == "a star and a heart and blurry, dark"
        if fmt != "png":
            assert params["xmp:originalNegativePrompt"] == "blurry, dark"
        assert (params["Seed"], params["Steps"], params["CFG scale"], params["Size"]) == (
            str(entry["seed"]), str(done.steps), "4.5", "64x64")
        assert params["Model"] == done.model_version and params["Job id"] == str(done.id)
        with Image.open(io.BytesIO(data)) as im:
            assert im.size == (64, 64)


def test_the_parameters_are_readable_with_pillow_alone():
    """What any tool sees: PNG's `parameters` text chunk; JPEG and WebP's EXIF UserComment and
    XMP, all through Pillow's own API."""
    picture = Image.new("RGB", (64, 64), (10, 120, 200))
    params = ImageParameters("a blue circle, çà 日本", "noise", 77, 12, 6.0, 64, 64, "shapes-v1", "job-123")
    png = encode(picture, "png", None, params).data
    with Image.open(io.BytesIO(png)) as im:
        assert im.info["parameters"] == (
            "a blue circle, çà 日本\nNegative prompt: noise\n"
            "Steps: 12, CFG scale: 6, Seed: 77, Size: 64x64, Model: shapes-v1, Job id: job-123"
        )
    for fmt in ("jpeg", "webp"):
        data = encode(picture, fmt, 90, params).data
        with Image.open(io.BytesIO(data)) as im:
            comment = im.getexif().get_ifd(EXIF_IFD)[USER_COMMENT]
            xmp = im.info["xmp"]
        assert comment.startswith(b"UNICODE\0") and comment[8:].decode("utf-16-be") == params.a1111()
        text = xmp.decode("utf-8") if isinstance(xmp, bytes) else xmp
        assert "<imagegen:seed>77</imagegen:seed>" in text and "<imagegen:jobId>job-123</imagegen:jobId>" in text
        assert "a blue circle, çà 日本" in text
        assert read_parameters(data)["xmp:negativePrompt"] == "noise"


def test_compression_trades_bytes_for_quality_and_png_is_lossless():
    import numpy as np

    rng = np.random.default_rng(3)
    picture = Image.fromarray(rng.integers(0, 255, (96, 96, 3), dtype=np.uint8))
    assert len(encode(picture, "jpeg", 20).data) < len(encode(picture, "jpeg", 95).data)
    assert len(encode(picture, "webp", 20).data) < len(encode(picture, "webp", 95).data)
    with Image.open(io.BytesIO(encode(picture, "png", 0).data)) as im:
        assert im.convert("RGB").tobytes() == picture.tobytes()
    with pytest.raises(ValueError, match="output_format"):
        encode(picture, "gif")


def test_bad_format_fields_are_400_naming_the_field(alice_api):
    for body, field in (({"output_format": "gif"}, "output_format"), ({"output_compression": -1}, "output_compression"),
                        ({"output_compression": 101}, "output_compression")):
        response = alice_api.post("/api/v1/jobs", {"prompt": "a red circle", **body}, format="json")
        assert response.status_code == 400 and field in response.json(), response.json()


def test_a_cache_hit_in_another_format_is_converted_not_generated(workers, alice_api, bob_api, settings):
    from django.contrib.auth import get_user_model

    settings.IMAGEGEN_CACHE_SCOPE = "global"  # shared across users (the default keeps each user's own)

    from jobs.actions import reject_delivered
    from jobs.media.storage import public_storage

    first = wait_for_status(submit(alice_api, prompt="a purple triangle", seed=9090, output_format="webp")["id"], ("done",))
    wait_until_cached(first)  # the cache entry is written after the job is done
    original = first.images.get()
    batches = Batch.objects.count()
    again = submit(bob_api, prompt="a purple triangle", seed=9090, output_format="png")
    assert again["status"] == "done", "served from the cache in the submit answer"
    assert Batch.objects.count() == batches, "no GPU pass"
    converted = GeneratedImage.objects.get(job_id=again["id"])
    assert converted.storage_key.endswith(".png") and converted.source_key == original.storage_key
    assert again["images"][0]["url"].endswith(".png")
    data, content_type = fetch(again["images"][0]["url"])
    assert content_type == "image/png" and magic_ok(data, "png")
    assert read_parameters(data)["Job id"] == again["id"]  # the file names the job that asked for it
    assert read_parameters(data)["negative_prompt"] == "a star and a heart", "what the model was given, as the source says"
    webp, _ = fetch(alice_api.get(f"/api/v1/jobs/{first.id}").json()["images"][0]["url"])
    with Image.open(io.BytesIO(webp)) as a, Image.open(io.BytesIO(data)) as b:
        assert a.convert("RGB").tobytes() == b.convert("RGB").tobytes(), "the same pixels, re-encoded"

    # Same format again: a file of its own (its own credentials and key), made from the original.
    same = submit(bob_api, prompt="a purple triangle", seed=9090, output_format="webp")
    row = GeneratedImage.objects.get(job_id=same["id"])
    assert row.storage_key != original.storage_key and row.source_key == original.storage_key

    # A moderator's take-down of the original reaches the converted copy too.
    moderator = get_user_model().objects.create_user("mod-formats", is_staff=True)
    reject_delivered(original, moderator, "not allowed")
    converted.refresh_from_db()
    assert converted.tier != "public" and not public_storage().exists(converted.storage_key)
    assert GenerationJob.objects.get(id=again["id"]).status == "blocked"


def test_on_s3_the_content_type_follows_the_key_extension(seaweed):
    from jobs.media.storage import publish_object, store_quarantined
    from tests.s3_fixtures import s3_overrides
    from tests.s3_server import PUBLIC_BUCKET, QUARANTINE_BUCKET

    picture = Image.new("RGB", (64, 64), (200, 30, 30))
    with override_settings(**s3_overrides(seaweed)):
        for fmt in ("png", "jpeg", "webp"):
            encoded = encode(picture, fmt)
            stored = store_quarantined(encoded.data, encoded.extension)
            assert stored.key.endswith("." + fmt)
            head = seaweed.client().head_object(Bucket=QUARANTINE_BUCKET, Key=stored.key)
            assert head["ContentType"] == encoded.content_type == f"image/{fmt}"
            publish_object(stored.key)
            head = seaweed.client().head_object(Bucket=PUBLIC_BUCKET, Key=stored.key)
            assert head["ContentType"] == f"image/{fmt}"
