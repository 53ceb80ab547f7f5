"""The page plays a video job's clip (issue 47 item 4), in Debian's chromium (Playwright) against
daphne and the service's own answers: a done video job of alice's whose clip's files (jobs.media.
video.package of a procedural clip: a red square moving across) are public objects in local
storage under v/<clip>/, listed by the job JSON's `videos` as the publish stage lists them and
served by the service's media route (content types, byte ranges). Each way of playing is forced in
turn: hls.js (chromium as it is), native HLS (no MediaSource, as on an iPhone), the MP4 (neither),
and the MP4 after hls.js failed to load or the playlist named another host."""

from __future__ import annotations

import re

import pytest
from django.core.files.base import ContentFile
from PIL import Image

from jobs.media import video
from jobs.media.storage import new_image_key, public_storage
from jobs.models import FIRST_STAGE, GeneratedImage, GenerationJob
from tests.browser import screenshot, sign_in
from tests.test_video_media import clip
from tests.test_web_page import browser_page  # noqa: F401  (the fixture)
from tests.test_web_states import errors  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FPS = 8
ELSEWHERE = "http://media.elsewhere.invalid"
PROMPT = "a red square moving left to right on a blue background"
MEDIA = re.compile(r"/media/v/[0-9a-f]{32}/([a-z0-9_/.]+)$")

# Browsers by what they can play: chromium as it is (MediaSource: hls.js); an iPhone's Safari
# (HLS itself, no MediaSource); one with neither (the MP4).
NO_MEDIA_SOURCE = "delete window.MediaSource; delete window.ManagedMediaSource;"
NO_HLS = NO_MEDIA_SOURCE + """
(() => {
  const can = HTMLMediaElement.prototype.canPlayType;
  HTMLMediaElement.prototype.canPlayType = function (type) {
    return /mpegurl/i.test(type) ? "" : can.call(this, type);
  };
})();
"""


@pytest.fixture(scope="module")
def clip_files() -> dict[str, video.MediaFile]:
    return {f.name: f for f in video.package(clip(), FPS).files}


def done_video_job(owner, files: dict[str, video.MediaFile] | None = None) -> GenerationJob:
    """A done video job; with `files`, its clip delivered: each file a public object under
    v/<clip>/ and the row naming them, as the publish stage leaves them."""
    job = GenerationJob.objects.create(owner=owner, prompt=PROMPT, width=64, height=64, steps=20, guidance_scale=6.0,
                                       seed=3, model_version="shapes-v2-motion", frames=16, fps=FPS,
                                       stage=FIRST_STAGE["done"], progress_total=20)
    if files is None:
        return job
    image = GeneratedImage(job=job, index=0, seed=job.seed, width=256, height=256, sha256="0" * 64, tier="public",
                           content_type="video/mp4")
    prefix = f"v/{image.id.hex}/"
    for f in files.values():
        public_storage().save(prefix + f.name, ContentFile(f.data))
    image.storage_key, image.byte_size = prefix + "video.mp4", len(files["video.mp4"].data)
    image.media = {"poster": prefix + "poster.png", "sprites": prefix + "sprites.png", "playlist": prefix + "hls/master.m3u8",
                   "files": [prefix + "video.mp4", *(prefix + n for n in files if n != "video.mp4")], "frames": 16, "fps": FPS}
    image.save()
    return job


def done_image_job(owner) -> GenerationJob:
    """An image job beside it, its PNG in local public storage (served by the page's server)."""
    job = GenerationJob.objects.create(owner=owner, prompt=PROMPT, width=64, height=64, steps=20, guidance_scale=5.0,
                                       seed=3, model_version="shapes-v2", stage=FIRST_STAGE["done"], progress_total=20)
    data = video.png(Image.fromarray(clip()[0]))
    key = public_storage().save(new_image_key(), ContentFile(data))
    GeneratedImage.objects.create(job=job, index=0, seed=job.seed, storage_key=key, width=64, height=64,
                                  byte_size=len(data), sha256="0" * 64, tier="public")
    return job


def foreign(playlist: video.MediaFile) -> video.MediaFile:
    """The playlist with its segments on a host the page was not told of."""
    text = re.sub(r"^seg_", f"{ELSEWHERE}/seg_", playlist.data.decode(), flags=re.M)
    return video.MediaFile(playlist.name, text.encode())


def media_asked(page) -> list[str]:
    """The clip's file names the browser asks the service for, in order."""
    asked: list[str] = []
    page.on("request", lambda request: asked.append(MEDIA.search(request.url)[1]) if MEDIA.search(request.url) else None)
    return asked


@pytest.mark.parametrize(("browser_kind", "init", "player", "fallback"), [
    pytest.param("chromium", "", "hls.js", None, id="hls.js"),
    pytest.param("native HLS", NO_MEDIA_SOURCE, "native", None, id="native"),
    pytest.param("MP4 only", NO_HLS, "mp4", None, id="mp4"),
    pytest.param("hls.js lost", "", "mp4", "hls.js", id="hls.js-lost"),
    pytest.param("a playlist naming another host", "", "mp4", "hls.js", id="foreign-segment"),
])
def test_a_done_video_job_plays_in_its_card_and_its_tile_shows_the_poster(
    daphne_server, alice, browser_page, errors, clip_files, browser_kind, init, player, fallback,  # noqa: F811
):
    page = browser_page
    image_job = done_image_job(alice) if player == "hls.js" else None
    if init:
        page.add_init_script(init)
    scripts: list[str] = []
    elsewhere: list[str] = []
    page.on("request", lambda request: scripts.append(request.url) if "hls.light" in request.url else None)
    page.on("request", lambda request: elsewhere.append(request.url) if ELSEWHERE in request.url else None)
    if browser_kind == "hls.js lost":
        page.route(re.compile(r"hls\.light\.min\.js$"), lambda route: route.fulfill(status=404, body=""))
    files = clip_files
    if browser_kind == "a playlist naming another host":
        files = {**files, "hls/hi/index.m3u8": foreign(files["hls/hi/index.m3u8"]),
                 "hls/lo/index.m3u8": foreign(files["hls/lo/index.m3u8"])}
    job = done_video_job(alice, files)
    clip_url = f"/media/v/{job.images.get().id.hex}/"
    asked = media_asked(page)
    sign_in(page, daphne_server, alice)

    # The gallery's tile: the poster, decoded; a click makes the job the current one.
    poster = page.locator(f".gallery .tile[data-job='{job.id}'] .thumbs img")
    poster.wait_for()
    page.wait_for_function("(img) => img.complete && img.naturalWidth === 256", arg=poster.element_handle())
    poster.click()

    # The card's player: it plays (the clock passes half a second of the two-second clip).
    video = page.locator("#results video")
    video.wait_for()
    page.wait_for_function("(v) => v.currentTime > 0.5", arg=video.element_handle(), timeout=20_000)
    state = video.evaluate("""async (v) => {
      const poster = new Image();
      poster.src = v.poster;
      await poster.decode();
      return {player: v.dataset.player, fallback: v.dataset.fallback || null, muted: v.muted, loop: v.loop,
              controls: v.controls, playsinline: v.hasAttribute("playsinline"), src: v.currentSrc,
              poster: v.getAttribute("poster"), posterWidth: poster.naturalWidth, width: v.videoWidth,
              rendering: getComputedStyle(v).imageRendering, error: v.error && v.error.code,
              refused: v.dataset.refused || null, canPlayHls: v.canPlayType("application/vnd.apple.mpegurl")};
    }""")
    # (Native HLS needs a chromium that says it plays HLS itself: Debian's 156 says "maybe".)
    assert (state["player"], state["fallback"]) == (player, fallback), (browser_kind, state)
    assert state["refused"] == ("foreign" if files is not clip_files else None), state
    assert state["error"] is None and state["width"] in (128, 256), state
    assert state["muted"] and state["loop"] and state["controls"] and state["playsinline"], state
    assert state["poster"] == clip_url + "poster.png" and state["posterWidth"] == 256
    assert state["rendering"] == "pixelated"
    download = page.locator("#results a.download")
    assert download.get_attribute("href") == clip_url + "video.mp4"
    assert download.get_attribute("download").endswith(".mp4")

    # What was fetched says which path played: segments for HLS, the file itself for the MP4;
    # hls.js only where it was used (or tried).
    assert elsewhere == []
    segments = [name for name in asked if name.endswith(".m4s")]
    if player in ("hls.js", "native"):
        assert segments and "video.mp4" not in asked, asked
        assert "hls/master.m3u8" in asked
    else:
        assert "video.mp4" in asked and not segments, asked
    assert bool(scripts) == (player == "hls.js" or fallback == "hls.js"), scripts
    if image_job is None:
        return
    screenshot(page, "video_card", clip=page.locator("#current").bounding_box())

    # Another job's card replaces the player (its hls.js stopped with it); an image job's tile and
    # card are as before.
    page.locator(f".gallery .tile[data-job='{image_job.id}'] .thumbs img").click()
    page.wait_for_function("""() => document.querySelectorAll('#results video').length === 0
      && [...document.querySelectorAll('#results img.final')].some((img) => img.complete && img.naturalWidth === 64)""")
