"""A clip's delivered files (jobs/media/video.py): an MP4 that streams (faststart, H.264), a poster,
a sprite sheet and an HLS ladder of fMP4 segments, each parsed back and decoded by ffmpeg; the same
frames give the same bytes; content credentials in the MP4 verify and stop verifying once a byte
of its pictures changes."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from jobs.media import credentials, video
from jobs.media.encoding import ImageParameters

FPS = 8
pytestmark = pytest.mark.integration  # ffmpeg runs as a child process

PARAMS = ImageParameters(prompt="a red square moving left to right on a blue background", negative_prompt="",
                         seed=3, steps=20, guidance_scale=5.0, width=64, height=64, model_version="shapes-v2",
                         job_id="job-v")


def clip(frames: int = 16, size: int = 64) -> np.ndarray:
    """A red square moving left to right on a blue background."""
    arr = np.zeros((frames, size, size, 3), np.uint8)
    arr[:] = (20, 40, 200)
    for i in range(frames):
        x = 2 + i * 3
        arr[i, 24:40, x:x + 16] = (220, 30, 30)
    return arr


@pytest.fixture(scope="module")
def package() -> video.Package:
    return video.package(clip(), FPS)


def playlist_uris(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_the_mp4_streams_while_it_downloads_and_decodes_to_the_frames(package):
    mp4 = package.file("video.mp4")
    assert mp4.content_type == "video/mp4"
    top = video.top_level(mp4.data)
    assert top[0] == "ftyp" and top.index("moov") < top.index("mdat"), f"faststart: moov before mdat, got {top}"
    assert b"avc1" in mp4.data and b"avcC" in mp4.data, "H.264"
    frames = video.decode(mp4.data)
    scale = video.LADDER[0].scale
    assert frames.shape == (16, 64 * scale, 64 * scale, 3)
    back = frames[:, ::scale, ::scale].astype(int)
    assert np.abs(back - clip().astype(int)).mean() < 4, "the pictures survive the encoding"
    # The motion survives: the red square's centre moves right frame by frame.
    red = (back[..., 0] > 150) & (back[..., 2] < 100)
    xs = [np.nonzero(f)[1].mean() for f in red]
    assert all(b > a for a, b in zip(xs, xs[1:], strict=False)), xs


def test_the_hls_ladder_has_two_renditions_of_fmp4_segments_that_decode(package, tmp_path):
    master = package.file("hls/master.m3u8").data.decode()
    assert master.startswith("#EXTM3U")
    variants = [line for line in master.splitlines() if line.startswith("#EXT-X-STREAM-INF")]
    assert len(variants) == 2 and all("BANDWIDTH=" in v and "RESOLUTION=" in v and "avc1" in v for v in variants)
    sizes = {f"{64 * r.scale}x{64 * r.scale}" for r in video.LADDER}
    assert {v.split("RESOLUTION=")[1].split(",")[0] for v in variants} == sizes
    for f in package.files:
        target = tmp_path / f.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(f.data)
    for uri in playlist_uris(master):
        media = (tmp_path / "hls" / uri).read_text()
        assert "#EXT-X-PLAYLIST-TYPE:VOD" in media and "#EXT-X-ENDLIST" in media
        init = media.split('#EXT-X-MAP:URI="')[1].split('"')[0]
        init_data = (tmp_path / "hls" / Path(uri).parent / init).read_bytes()
        assert video.top_level(init_data)[:2] == ["ftyp", "moov"], "a CMAF init segment"
        segments = playlist_uris(media)
        assert len(segments) == 16 // (FPS * video.SEGMENT_SECONDS)
        for seg in segments:
            kinds = video.top_level((tmp_path / "hls" / Path(uri).parent / seg).read_bytes())
            assert "moof" in kinds and "mdat" in kinds, kinds
        frames = video.decode_path(tmp_path / "hls" / uri)
        assert frames.shape[0] == 16
    # Every name is relative: the set is served from any prefix.
    assert all(not f.name.startswith("/") and ".." not in f.name for f in package.files)
    assert not any("://" in line or line.startswith("/") for line in master.splitlines())


def test_poster_and_sprite_sheet(package):
    poster = Image.open(io.BytesIO(package.file("poster.png").data))
    assert poster.size == (package.width, package.height)
    sheet = np.asarray(Image.open(io.BytesIO(package.file("sprites.png").data)).convert("RGB"))
    assert sheet.shape == (4 * 64, video.SPRITE_COLUMNS * 64, 3)
    assert np.array_equal(sheet[64:128, 64:128], clip()[5]), "frame 5 is row 1, column 1"


def test_the_same_frames_give_the_same_bytes(package):
    again = video.package(clip(), FPS)
    assert [(f.name, f.data) for f in again.files] == [(f.name, f.data) for f in package.files]


def test_bad_frames_are_refused_before_ffmpeg_runs():
    with pytest.raises(ValueError, match="even"):
        video.as_array(np.zeros((4, 63, 64, 3), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        video.as_array(np.zeros((4, 64, 64, 3), np.float32))
    with pytest.raises(ValueError):
        video.as_array(np.zeros((0, 64, 64, 3), np.uint8))


def test_the_mp4_carries_content_credentials_that_break_when_a_picture_byte_changes(package):
    signed = credentials.sign(package.file("video.mp4").data, "mp4", PARAMS)
    check = credentials.verify(signed)
    assert check.ok and check.trusted, check.failures
    assert check.parameters["jobId"] == "job-v" and check.parameters["modelVersion"] == "shapes-v2"
    assert video.decode(signed).shape[0] == 16, "the signed file still plays"
    _, at, size = next(b for b in video.boxes(signed) if b[0] == "mdat")
    changed = bytearray(signed)
    changed[at + size // 2] ^= 0x10
    broken = credentials.verify(bytes(changed))
    assert not broken.ok and broken.state == "Invalid", broken
