"""The OpenAI-compatible Videos API (/v1/videos), driven by the official `openai` package against a
live daphne serving the shipped motion model, with a real GPU worker on that model's lane (the
pattern of tests/test_video_jobs.py `video_lane`): one clip is created, polled until completed,
listed, downloaded in its three variants (through the 302 the client follows) and deleted. The
400s and 404s go through the same server; the mapping of the other job states (held, failed,
blocked, cancelled, not ready) runs in-process on rows made for it."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import openai
import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from PIL import Image
from rest_framework.test import APIClient

from jobs.api.openai.videos import job_id_of, video_id_of
from jobs.models import FIRST_STAGE, GeneratedImage, GenerationJob
from tests.browser import sign_in
from tests.conftest import ROOT, make_user, wait_until
from tests.live_server import start_daphne, stop_daphne
from tests.test_web_page import browser_page  # noqa: F401  (the fixture)

VERSION = "shapes-v2-motion"
MOTION = ROOT / "models" / VERSION
SERVED = {VERSION: str(MOTION)}
PROMPT = "a red circle moving left to right on a blue background"

pytestmark = pytest.mark.skipif(not (MOTION / "config.json").exists(), reason="the motion model is not in this checkout")

@pytest.fixture(scope="module")
def video_server(worker_env, workers, video_worker):
    """daphne serving the motion model beside the default one; the session's GPU worker on the
    video model's lane (tests/conftest.py video_worker) draws the clips."""
    extra = {"IMAGEGEN_EXTRA_MODELS": f"{VERSION}={MOTION}"}
    server = start_daphne({**worker_env, **extra}, Path(settings.VAR_DIR), name="daphne-videos")  # the page's script too
    try:
        yield server
    finally:
        stop_daphne(server)


def client(server, user) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=user.auth_token.key, max_retries=0, timeout=60)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(io.BytesIO(data)) as im:
        return im.size


def video_row(owner, status: str = "done", **fields) -> GenerationJob:
    """A video job's row in `status` (nothing drawn), as the pipeline leaves it."""
    return GenerationJob.objects.create(owner=owner, prompt=PROMPT, width=64, height=64, steps=4, guidance_scale=6.0,
                                        seed=1, model_version=VERSION, frames=16, fps=8, stage=FIRST_STAGE[status],
                                        progress_total=4, **fields)


@pytest.mark.django_db(transaction=True)
def test_a_clip_created_polled_listed_downloaded_in_three_variants_and_deleted(video_server, alice, bob):
    oai = client(video_server, alice)
    # Beside it: an image job of alice's (never listed) and a video of bob's (never listed, a 404 to alice).
    GenerationJob.objects.create(owner=alice, prompt=PROMPT, width=64, height=64, steps=4, guidance_scale=5.0, seed=1,
                                 model_version=settings.IMAGEGEN_MODEL_VERSION, stage=FIRST_STAGE["done"])
    bobs = video_row(bob)

    video = oai.videos.create(prompt=PROMPT, seconds="2", size="64x64")
    job = GenerationJob.objects.get(owner=alice, frames=16)
    assert video.id == "video_" + job.id.hex and job_id_of(video.id) == job.id
    assert (video.object, video.model, video.seconds, video.size, video.prompt) == ("video", VERSION, "2", "64x64", PROMPT)
    assert video.status in ("queued", "in_progress") and video.error is None and video.completed_at is None
    assert (job.frames, job.fps, job.width, job.height, job.count, job.rewrite) == (16, 8, 64, 64, 1, False)

    polled = []

    def finished():
        got = oai.videos.retrieve(video.id)
        polled.append((got.status, got.progress))
        return got if got.status in ("completed", "failed") else None

    done = wait_until(finished, timeout=120, what="the video completed", pause=0.25)
    assert done.status == "completed", done.error
    assert done.progress == 100 and done.completed_at >= done.created_at == video.created_at
    order = ["queued", "in_progress", "completed"]
    assert [order.index(s) for s, _ in polled] == sorted(order.index(s) for s, _ in polled)
    assert [p for _, p in polled] == sorted(p for _, p in polled)

    listed = oai.videos.list()
    assert [v.id for v in listed.data] == [video.id] and listed.has_more is False
    assert listed.data[0].status == "completed"

    # The three variants: a 302 to the clip's public URL (the job JSON's), followed by the client.
    clip = GenerationJob.objects.get(id=job.id).images.get()
    urls = {"video": clip.storage_key, "thumbnail": clip.media["poster"], "spritesheet": clip.media["sprites"]}
    mp4 = oai.videos.download_content(video.id)
    assert mp4.content[4:8] == b"ftyp" and mp4.response.headers["content-type"] == "video/mp4"
    assert [r.status_code for r in mp4.response.history] == [302]
    assert str(mp4.response.url) == f"{video_server.url}/media/{urls['video']}"
    thumbnail = oai.videos.download_content(video.id, variant="thumbnail")
    # The poster is the first frame at the MP4's top rendition (the 64x64 clip upscaled, as the job JSON says).
    assert png_size(thumbnail.content) == (clip.width, clip.height) and str(thumbnail.response.url).endswith(urls["thumbnail"])
    sprites = oai.videos.download_content(video.id, variant="spritesheet")
    width, height = png_size(sprites.content)
    assert width % 64 == 0 and height % 64 == 0 and (width // 64) * (height // 64) == 16
    assert str(sprites.response.url).endswith(urls["spritesheet"])

    with pytest.raises(openai.NotFoundError) as foreign:
        oai.videos.retrieve(video_id_of(bobs))
    assert foreign.value.code == "video_not_found"

    deleted = oai.videos.delete(video.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (video.id, "video.deleted", True)
    with pytest.raises(openai.NotFoundError):
        oai.videos.retrieve(video.id)
    assert oai.videos.list().data == []
    assert httpx.get(str(mp4.response.url), timeout=10).status_code == 404  # the public objects are gone


@pytest.mark.django_db(transaction=True)
def test_refusals_and_unknown_ids_in_openai_shape(video_server, alice):
    oai = client(video_server, alice)

    def refused(**body) -> openai.APIStatusError:
        with pytest.raises(openai.BadRequestError) as raised:
            oai.videos.create(prompt=PROMPT, **body)
        assert raised.value.status_code == 400 and raised.value.body["type"] == "invalid_request_error"
        return raised.value

    seconds = refused(seconds="4")
    assert (seconds.param, seconds.code) == ("seconds", "invalid_value") and "'2'" in seconds.message
    size = refused(size="720x1280")
    assert (size.param, size.code) == ("size", "invalid_value") and "64x64" in size.message
    reference = refused(input_reference=("ref.png", b"\x89PNG\r\n\x1a\n", "image/png"))
    assert (reference.param, reference.code) == ("input_reference", "unsupported_parameter")
    sora = refused(model="sora-2")
    assert (sora.param, sora.code) == ("model", "model_not_found") and VERSION in sora.message
    image_model = refused(model=settings.IMAGEGEN_MODEL_VERSION)
    assert (image_model.param, image_model.code) == ("model", "invalid_value")
    unknown = refused(extra_body={"fps": "8"})
    assert (unknown.param, unknown.code) == ("fps", "unknown_parameter")
    assert not GenerationJob.objects.exists()

    for missing in ("video_" + "0" * 32, "video_nothex", "not-a-video-id"):
        with pytest.raises(openai.NotFoundError) as raised:
            oai.videos.retrieve(missing)
        assert raised.value.code == "video_not_found" and missing in raised.value.message
        with pytest.raises(openai.NotFoundError):
            oai.videos.download_content(missing)
        with pytest.raises(openai.NotFoundError):
            oai.videos.delete(missing)
    with pytest.raises(openai.BadRequestError) as after:
        oai.videos.list(after="video_" + "0" * 32)
    assert after.value.param == "after"

    wrong_key = openai.OpenAI(base_url=f"{video_server.url}/v1", api_key="not-a-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong_key.videos.list()


# --- in-process: the other states, paging, the content route's answers (no workers) -------------


@pytest.fixture
def carol(db):
    return make_user("carol")


@pytest.fixture
def carol_bearer(carol):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {carol.auth_token.key}")
    return api


@pytest.mark.django_db
@pytest.mark.parametrize(("status", "fields", "expected", "error"), [
    ("queued", {}, ("queued", 0), None),
    ("running", {"progress_step": 3}, ("in_progress", 75), None),
    ("running", {"progress_step": 4}, ("in_progress", 99), None),  # drawn, in the frame gate or publish
    ("review", {"reason": "held"}, ("in_progress", 0), None),
    ("blocked", {"reason": "frame 7 of 16: star", "blocked_stage": "image"}, ("failed", 0),
     {"code": "moderation_blocked", "message": "frame 7 of 16: star"}),
    ("failed", {"reason": "out of memory"}, ("failed", 0), {"code": "failed", "message": "out of memory"}),
    ("cancelled", {"reason": "by its owner"}, ("failed", 0), {"code": "cancelled", "message": "by its owner"}),
])
def test_job_states_map_to_video_states(carol, carol_bearer, status, fields, expected, error):
    job = video_row(carol, status, **fields)
    body = carol_bearer.get(f"/v1/videos/{video_id_of(job)}").json()
    assert (body["status"], body["progress"]) == expected
    assert body["error"] == error
    content = carol_bearer.get(f"/v1/videos/{video_id_of(job)}/content")
    assert content.status_code == 404
    assert content.json()["error"]["code"] == ("video_failed" if error else "video_not_ready")


@pytest.mark.django_db
def test_content_redirects_to_each_variants_public_url(carol, carol_bearer):
    job = video_row(carol, finished_at=timezone.now(), progress_step=4)
    prefix = "v/" + "c" * 32 + "/"
    GeneratedImage.objects.create(
        job=job, index=0, seed=1, storage_key=prefix + "video.mp4", width=64, height=64, byte_size=1, sha256="0" * 64,
        content_type="video/mp4", media={"poster": prefix + "poster.png", "sprites": prefix + "sprites.png",
                                         "playlist": prefix + "hls/master.m3u8", "frames": 16, "fps": 8,
                                         "files": [prefix + "video.mp4"]})
    vid = video_id_of(job)
    body = carol_bearer.get(f"/v1/videos/{vid}").json()
    assert (body["status"], body["progress"], body["completed_at"]) == ("completed", 100, int(job.finished_at.timestamp()))
    for variant, name in (("", "video.mp4"), ("video", "video.mp4"), ("thumbnail", "poster.png"),
                          ("spritesheet", "sprites.png")):
        response = carol_bearer.get(f"/v1/videos/{vid}/content", {"variant": variant} if variant else {})
        assert response.status_code == 302 and response["Location"] == f"http://testserver/media/{prefix}{name}"
        assert "no-store" in response["Cache-Control"]
    bad = carol_bearer.get(f"/v1/videos/{vid}/content", {"variant": "gif"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "variant"
    dave = make_user("dave")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {dave.auth_token.key}")
    assert other.get(f"/v1/videos/{vid}/content").status_code == 404


@pytest.mark.django_db
def test_list_pages_by_after_in_either_order(carol, carol_bearer):
    jobs = [video_row(carol) for _ in range(5)]
    ids = [video_id_of(j) for j in sorted(jobs, key=lambda j: (j.created_at, j.id), reverse=True)]
    page = carol_bearer.get("/v1/videos", {"limit": 2}).json()
    assert [v["id"] for v in page["data"]] == ids[:2] and page["has_more"] is True
    assert (page["object"], page["first_id"], page["last_id"]) == ("list", ids[0], ids[1])
    seen = []
    after = None
    while True:
        page = carol_bearer.get("/v1/videos", {"limit": 2, **({"after": after} if after else {})}).json()
        seen += [v["id"] for v in page["data"]]
        after = page["last_id"]
        if not page["has_more"]:
            break
    assert seen == ids
    ascending = carol_bearer.get("/v1/videos", {"order": "asc", "after": ids[-1]}).json()
    assert [v["id"] for v in ascending["data"]] == ids[-2::-1]
    for params, param in (({"limit": 0}, "limit"), ({"limit": "x"}, "limit"), ({"order": "up"}, "order")):
        response = carol_bearer.get("/v1/videos", params)
        assert response.status_code == 400 and response.json()["error"]["param"] == param


@pytest.mark.django_db
@override_settings(IMAGEGEN_EXTRA_MODELS=SERVED)
def test_create_in_json_too_and_without_a_video_model_names_model(carol, carol_bearer):
    response = carol_bearer.post("/v1/videos", {"prompt": PROMPT}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["model"], body["seconds"], body["size"], body["status"]) == (VERSION, "2", "64x64", "queued")
    assert GenerationJob.objects.get(id=job_id_of(body["id"])).frames == 16
    with override_settings(IMAGEGEN_EXTRA_MODELS={}):
        response = carol_bearer.post("/v1/videos", {"prompt": PROMPT}, format="multipart")
    assert response.status_code == 400 and response.json()["error"]["param"] == "model"


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_page_offers_the_video_model_at_its_sizes_and_prices_a_clip_as_its_frames(video_server, alice, browser_page):  # noqa: F811
    """In Debian's chromium: choosing the video model leaves only the sizes it draws and says what
    a clip costs (its frames' worth of the daily images); the image model gives the menu back."""
    page = browser_page
    sign_in(page, video_server, alice)
    page.select_option("#model", VERSION)
    sizes = dict(page.eval_on_selector_all("#size option", "os => os.map((o) => [o.value, o.disabled])"))
    assert sizes == {f"{w}x{h}": (w, h) != (64, 64) for w, h in settings.IMAGEGEN_SIZE_MENU}  # only 64x64 open
    assert page.input_value("#size") == "64x64"
    assert "per clip of 16 frames" in page.text_content("#choice-work")
    page.wait_for_function("/Costs 16 of your \\d+ interactive images a day .*: 1 clip of 16 frames/"
                           ".test(document.getElementById('choice-cost').textContent)")
    page.select_option("#model", settings.IMAGEGEN_MODEL_VERSION)
    sizes = dict(page.eval_on_selector_all("#size option", "os => os.map((o) => [o.value, o.disabled])"))
    assert not any(sizes.values()) and "per image" in page.text_content("#choice-work")
