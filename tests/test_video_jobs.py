"""Video jobs end to end: the shipped motion model (models/shapes-v2-motion over models/shapes-v2)
on a GPU lane of its own, through the real stages (prompt check, generate, the frame gate at
classify, publish packaging the clip off the GPU worker), delivered as an MP4 with content
credentials, a poster, sprites and HLS; a frame judged unsafe blocks the whole clip; and the
submit's 400s for frames that do not fit."""

from __future__ import annotations

import io

import numpy as np
import pytest
from django.conf import settings
from django.test import override_settings
from PIL import Image

from jobs.media import credentials
from jobs.media import video as media
from jobs.media.storage import public_storage, quarantine_storage
from jobs.models import GenerationJob
from tests.conftest import VIDEO_MODEL, VIDEO_VERSION, admitted_to, wait_for_status, wait_until, watch_job

VERSION, MOTION = VIDEO_VERSION, VIDEO_MODEL  # on its lane: tests/conftest.py video_lane
SERVED = {VERSION: str(MOTION)}
CLIP = {"prompt": "a red circle moving left to right on a blue background", "frames": 16, "steps": 4, "seed": 5,
        "rewrite": "off"}

pytestmark = pytest.mark.skipif(not (MOTION / "config.json").exists(), reason="the motion model is not in this checkout")


def read(key: str) -> bytes:
    with public_storage().open(key, "rb") as f:
        return f.read()


def submit(api, lane: str, **body) -> dict:
    with admitted_to(settings.IMAGEGEN_MODEL_NAME, held=True):
        response = api.post("/api/v1/jobs", {**CLIP, **body}, format="json")
    assert response.status_code == 202, response.content
    return response.json()


def test_a_clip_is_drawn_gated_and_delivered_as_mp4_poster_and_hls_with_credentials(video_lane, alice_api):
    job = submit(alice_api, video_lane)
    assert (job["model"], job["frames"], job["fps"], job["width"], job["height"]) == (VERSION, 16, 8, 64, 64)
    seen = watch_job(job["id"], timeout=180, wake_lane=video_lane)
    row = wait_for_status(job["id"], ("done",))
    assert row.status == "done", row.reason
    assert [e["step"] for e in seen if e["type"] == "progress"] == [1, 2, 3, 4]
    # A preview (the middle frame, small) at step 2, sent after the image gate allowed it.
    previews = [e for e in seen if e["type"] == "preview"]
    assert [p["step"] for p in previews] == [2] and previews[0]["image"].startswith("data:image/jpeg;base64,")
    answer = alice_api.get(f"/api/v1/jobs/{job['id']}").json()
    assert answer["images"] == [] and len(answer["videos"]) == 1
    clip = answer["videos"][0]
    assert (clip["frames"], clip["fps"], clip["seconds"], clip["content_type"]) == (16, 8, 2.0, "video/mp4")
    image = row.images.get()
    assert image.tier == "public" and image.media["files"][0] == image.storage_key
    # The MP4: faststart (moov before mdat), 16 frames at the top rendition's size, signed.
    mp4 = read(image.storage_key)
    boxes = media.top_level(mp4)
    assert boxes.index("moov") < boxes.index("mdat")
    frames = media.decode(mp4)
    assert frames.shape == (16, clip["height"], clip["width"], 3)
    # A clip, not one picture repeated: its frames differ (the shape moves).
    assert not np.array_equal(frames[0], frames[-1])
    checked = credentials.verify(mp4)
    assert checked.ok, checked.failures
    tampered = bytearray(mp4)
    tampered[mp4.index(b"mdat") + 64] ^= 0xFF
    assert not credentials.verify(bytes(tampered)).ok
    assert image.sha256 == __import__("hashlib").sha256(mp4).hexdigest()
    # The poster is the first frame; the sprite sheet holds all 16.
    poster = Image.open(io.BytesIO(read(image.media["poster"])))
    assert poster.size == (clip["width"], clip["height"])
    sprites = Image.open(io.BytesIO(read(image.media["sprites"])))
    assert sprites.size == (64 * media.SPRITE_COLUMNS, 64 * (16 // media.SPRITE_COLUMNS))
    # HLS: a master playlist of two renditions, each with its init segment and media segments.
    master = read(image.media["playlist"]).decode()
    variants = [line for line in master.splitlines() if line and not line.startswith("#")]
    assert len(variants) == 2
    prefix = image.media["playlist"].rsplit("/", 1)[0] + "/"
    for variant in variants:
        playlist = read(prefix + variant).decode()
        folder = (prefix + variant).rsplit("/", 1)[0] + "/"
        init = next(line for line in playlist.splitlines() if line.startswith("#EXT-X-MAP:URI="))
        assert "moov" in media.top_level(read(folder + init.split('"')[1]))
        segments = [line for line in playlist.splitlines() if line.endswith(".m4s")]
        assert len(segments) == 2 and all("moof" in media.top_level(read(folder + s)) for s in segments)
    # Every URL the job lists names a public object; the strip it was judged from is gone from quarantine.
    assert all(public_storage().exists(key) for key in image.media["files"])
    # (removed just after the commit that made the job done: waited for, not raced)
    wait_until(lambda: not quarantine_storage().exists(image.media["strip"]), 30, "the strip removed from quarantine")


def test_a_clip_cancelled_mid_run_stops_its_pass(video_lane, alice_api):
    job = submit(alice_api, video_lane, seed=7, steps=50)  # the model's most: ~0.3-0.6 s a step here

    def cancel_once_running(event, asked=[]):  # noqa: B006  # once
        if event["type"] == "progress" and not asked:
            asked.append(True)
            assert alice_api.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202

    seen = watch_job(job["id"], cancel_once_running, timeout=180, wake_lane=video_lane)
    row = wait_for_status(job["id"], ("cancelled",))
    assert row.status == "cancelled" and not row.images.exclude(tier="quarantine").exists()
    # The pass stopped at a step boundary after the cancel, not at the end of its 50 steps (counted
    # in steps, as tests/test_cancel_running.py does: the cancel is sent at the first step's event).
    steps = [e["step"] for e in seen if e["type"] == "progress"]
    assert steps and max(steps) < 50, steps


def test_one_frame_judged_unsafe_blocks_the_whole_clip_and_one_held_holds_it_for_a_moderator(video_lane, alice_api, classifier_mode):
    classifier_mode('index:7:{"star": 0.99}')  # the 8th image of every batch the gate scores
    job = submit(alice_api, video_lane, seed=6)
    watch_job(job["id"], timeout=180, wake_lane=video_lane)
    row = wait_for_status(job["id"], ("blocked",))
    assert row.status == "blocked" and row.blocked_stage == "image"
    assert "frame 7 of 16" in row.verdicts.get(stage="image").notes
    image = row.images.get()
    assert image.tier == "quarantine" and not image.media  # never packaged, nothing public
    assert not public_storage().exists(f"v/{image.id.hex}/video.mp4")
    assert alice_api.get(f"/api/v1/jobs/{job['id']}").json()["videos"] == []

    # One frame held holds the clip; a moderator's approval packages it and delivers it.
    classifier_mode('index:3:{"heart": 0.99}')
    held = submit(alice_api, video_lane, seed=8)
    watch_job(held["id"], timeout=180, wake_lane=video_lane)
    row = wait_for_status(held["id"], ("review",))
    assert row.status == "review" and "frame 3 of 16" in row.verdicts.get(stage="image").notes
    from jobs.actions.review import decide
    from tests.conftest import make_user

    moderator = make_user("video-moderator", is_staff=True)
    assert decide(held["id"], "approve", moderator) == "approved"
    answer = alice_api.get(f"/api/v1/jobs/{held['id']}").json()
    assert answer["status"] == "done" and len(answer["videos"]) == 1 and answer["images"] == []
    image = GenerationJob.objects.get(id=held["id"]).images.get()
    assert image.tier == "public" and media.decode(read(image.storage_key)).shape[0] == 16
    assert all(public_storage().exists(key) for key in image.media["files"])


@pytest.mark.django_db
@override_settings(IMAGEGEN_EXTRA_MODELS=SERVED)
@pytest.mark.parametrize(("body", "field", "said"), [
    ({"frames": 8}, "frames", "no served video model draws 8 frames"),
    ({"model": VERSION, "frames": 8}, "frames", "draws clips of 16 frames"),
    ({"model": VERSION, "width": 96, "height": 96}, "width", "draws 64x64 only"),
    ({"frames": 16, "model": ""}, None, None),
])
def test_frames_that_do_not_fit_are_a_400_naming_the_field(alice_api, body, field, said):
    payload = {"prompt": "a red circle moving left to right on a blue background", "rewrite": "off", **body}
    with admitted_to(settings.IMAGEGEN_MODEL_NAME, held=True):
        response = alice_api.post("/api/v1/jobs", payload, format="json")
    if field is None:
        assert response.status_code == 202, response.content
        assert (response.json()["model"], response.json()["frames"]) == (VERSION, 16)
        GenerationJob.objects.filter(id=response.json()["id"]).delete()
        return
    assert response.status_code == 400, response.content
    assert said in response.json()[field][0]


@pytest.mark.django_db
def test_an_image_model_takes_no_frames(alice_api):
    response = alice_api.post("/api/v1/jobs", {"prompt": "a red circle", "frames": 16, "model": settings.IMAGEGEN_MODEL_VERSION},
                              format="json")
    assert response.status_code == 400
    assert "image model" in response.json()["frames"][0]


@pytest.mark.django_db
@override_settings(IMAGEGEN_EXTRA_MODELS=SERVED)
def test_a_clip_costs_its_frames_in_the_estimate_and_does_not_inflate_an_images(redis_client):
    """Before any measurement a clip's prior is its frames times an image's of the same size and
    steps; a measured clip pass feeds the per-frame figure that unmeasured image shapes use."""
    from scheduling import costs
    from scheduling.scheduler import shape_key

    redis_client.delete(costs.COST_KEY)
    image, clip = shape_key("tiny", 64, 64, 20, 5.0, ""), shape_key(VERSION, 64, 64, 20, 6.0, "")
    assert costs.seconds_per_image(clip, {}) == pytest.approx(16 * costs.seconds_per_image(image, {}))
    costs.record_batch_cost(clip, 2, 8.0)  # 4 s a clip of 16 frames: 0.25 s a frame
    measured = costs.costs()
    assert costs.seconds_per_image(clip, measured) == pytest.approx(4.0)
    other_image = shape_key("tiny", 64, 64, 20, 5.0, "x")
    assert costs.seconds_per_image(other_image, measured) == pytest.approx(0.25)
    redis_client.delete(costs.COST_KEY)


@pytest.mark.django_db
def test_the_media_route_serves_a_public_clips_own_files_with_byte_ranges(alice):
    from django.test import Client

    from jobs.media.storage import publish_once
    from jobs.models import FIRST_STAGE, GeneratedImage

    job = GenerationJob.objects.create(owner=alice, prompt="a clip", width=64, height=64, steps=4, guidance_scale=6.0,
                                       seed=1, model_version=VERSION, frames=16, fps=8, stage=FIRST_STAGE["done"])
    image = GeneratedImage(job=job, index=0, seed=1, width=256, height=256, byte_size=0, sha256="0" * 64,
                           content_type="video/mp4", tier="public")
    prefix = f"v/{image.id.hex}/"
    mp4, playlist = bytes(range(256)) * 4, b"#EXTM3U\n"
    publish_once(prefix + "video.mp4", lambda: mp4)
    publish_once(prefix + "hls/master.m3u8", lambda: playlist)
    publish_once(prefix + "extra.png", lambda: b"not listed")
    image.storage_key, image.media = prefix + "video.mp4", {"files": [prefix + "video.mp4", prefix + "hls/master.m3u8"]}
    image.save()
    client, url = Client(), f"/media/{prefix}"
    whole = client.get(url + "video.mp4")
    assert (whole.status_code, whole["Content-Type"], whole["Accept-Ranges"]) == (200, "video/mp4", "bytes")
    assert whole.content == mp4 and "immutable" in whole["Cache-Control"]
    part = client.get(url + "video.mp4", HTTP_RANGE="bytes=100-199")
    assert (part.status_code, part["Content-Range"], part.content) == (206, "bytes 100-199/1024", mp4[100:200])
    tail = client.get(url + "video.mp4", HTTP_RANGE="bytes=-24")
    assert (tail.status_code, tail.content) == (206, mp4[-24:])
    assert client.get(url + "video.mp4", HTTP_RANGE="bytes=5000-").status_code == 416
    assert client.get(url + "hls/master.m3u8")["Content-Type"] == "application/vnd.apple.mpegurl"
    assert client.get(url + "extra.png").status_code == 404  # stored under the prefix, not one of the clip's files
    GeneratedImage.objects.filter(id=image.id).update(tier="quarantine")  # taken down: nothing served
    assert client.get(url + "video.mp4").status_code == 404
