"""The page plays a video job's clip (issue 47 item 4), in Debian's chromium (Playwright) against
daphne: the files are real (jobs.media.video.package of a procedural clip: a red square moving
across), the job a real done GenerationJob row of alice's, rendered by the page's own code (the
gallery's tile, then the current job's card). The video pipeline does not exist yet, so the
browser's requests get from Playwright only what that backend will serve: the job JSON's
`videos` entry, added to the API's own answer, and the clip's files under /media/v/<job>/
(local storage's URL form), with their content types and byte ranges. Each way of playing is
forced in turn: hls.js (chromium as it is), native HLS (no MediaSource, as on an iPhone), the MP4
(neither), and the MP4 after hls.js failed to load."""

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
API = re.compile(r"/api/v1/jobs(\?.*|/[0-9a-f-]{36})$")
MEDIA = re.compile(r"/media/v/[0-9a-f-]{36}/([a-z0-9_/.]+)$")

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


def done_video_job(owner) -> GenerationJob:
    return GenerationJob.objects.create(owner=owner, prompt=PROMPT, width=64, height=64, steps=20, guidance_scale=5.0,
                                        seed=3, model_version="shapes-v2", stage=FIRST_STAGE["done"], progress_total=20)


def done_image_job(owner) -> GenerationJob:
    """An image job beside it, its PNG in local public storage (served by the page's server)."""
    job = done_video_job(owner)
    data = video.png(Image.fromarray(clip()[0]))
    key = public_storage().save(new_image_key(), ContentFile(data))
    GeneratedImage.objects.create(job=job, index=0, seed=job.seed, storage_key=key, width=64, height=64,
                                  byte_size=len(data), sha256="0" * 64, tier="public")
    return job


def videos_entry(job: GenerationJob, files: dict[str, video.MediaFile]) -> list[dict]:
    """The job JSON's `videos`, as the video pipeline will list them (local storage's paths)."""
    base = f"/media/v/{job.id}/"
    mp4 = files["video.mp4"]
    frames = len(clip())
    return [{"url": base + mp4.name, "poster_url": base + "poster.png", "playlist_url": base + "hls/master.m3u8",
             "sprites_url": base + "sprites.png", "width": 256, "height": 256, "frames": frames, "fps": FPS,
             "seconds": frames / FPS, "content_type": mp4.content_type}]


def foreign(playlist: video.MediaFile) -> video.MediaFile:
    """The playlist with its segments on a host the page was not told of."""
    text = re.sub(r"^seg_", f"{ELSEWHERE}/seg_", playlist.data.decode(), flags=re.M)
    return video.MediaFile(playlist.name, text.encode())


def serve_the_missing_backend(page, job, files) -> list[str]:
    """Route the API's answers (the job gains `videos`) and the clip's files; returns the media
    names the browser asked for, in order."""
    entry = videos_entry(job, files)
    asked: list[str] = []

    def api(route):
        response = route.fetch()
        data = response.json()
        for item in data.get("results", [data]) if isinstance(data, dict) else []:
            if item.get("id") == str(job.id):
                item["videos"] = entry
        route.fulfill(response=response, json=data)

    def media(route):
        name = MEDIA.search(route.request.url)[1]
        asked.append(name)
        f = files.get(name)
        if f is None:
            route.fulfill(status=404, body="")
            return
        headers = {"Cache-Control": "public, max-age=31536000, immutable", "Accept-Ranges": "bytes"}
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", route.request.headers.get("range", ""))
        if wanted:
            first = int(wanted[1])
            last = min(int(wanted[2]) if wanted[2] else len(f.data) - 1, len(f.data) - 1)
            headers["Content-Range"] = f"bytes {first}-{last}/{len(f.data)}"
            route.fulfill(status=206, body=f.data[first:last + 1], content_type=f.content_type, headers=headers)
        else:
            route.fulfill(status=200, body=f.data, content_type=f.content_type, headers=headers)

    page.route(API, api)
    page.route(MEDIA, media)
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
    job = done_video_job(alice)
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
    asked = serve_the_missing_backend(page, job, files)
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
    assert state["poster"] == f"/media/v/{job.id}/poster.png" and state["posterWidth"] == 256
    assert state["rendering"] == "pixelated"
    download = page.locator("#results a.download")
    assert download.get_attribute("href") == f"/media/v/{job.id}/video.mp4"
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
