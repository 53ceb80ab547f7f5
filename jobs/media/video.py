"""A clip's delivered files: an MP4 for download, a poster, a sprite sheet and an HLS ladder.

Frames (RGB, uint8, all one size) become, in one call of `package`:

- `video.mp4`: H.264 (yuv420p, High profile), `+faststart` (the `moov` box before `mdat`, so a
  browser plays while it downloads), at the ladder's top rendition;
- `poster.png`: the first frame at the same size, for `<video poster>` and a gallery tile;
- `sprites.png`: every frame at its own size in a grid of `SPRITE_COLUMNS` columns (what the
  OpenAI videos API calls the spritesheet variant);
- `hls/master.m3u8` and, per rendition, `hls/<name>/index.m3u8`, `hls/<name>/init.mp4` and
  `hls/<name>/seg_NNN.m4s`: HLS with fMP4 (CMAF) segments, a two-rendition adaptive ladder,
  a segment every `SEGMENT_SECONDS` (each starts on a key frame).

Every name is relative and every playlist refers to its files by relative URIs, so the set is
stored under one prefix and served from any origin (a CDN included) unchanged.

The encoder is the ffmpeg binary that imageio-ffmpeg ships in its wheel (libx264, the mp4 and
hls muxers), run as a child process: it installs with pip on a bare Debian machine (no apt, no
compiler), the HLS ladder is one command (ffmpeg's `var_stream_map`), and the encoding never runs
in the process that holds a GPU. PyAV (the same libraries in-process) would need the ladder and
the segmenting written by hand and would hold the caller's process while it encodes.

The bytes are reproducible: one encoder thread, `bitexact` flags and no metadata, so the same
frames give the same files (what a regeneration compares, and what immutable URLs want).
"""

from __future__ import annotations

import struct
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class Rendition:
    name: str
    scale: int  # the clip's own size times this (nearest neighbour: the shapes stay sharp)
    bitrate_kbps: int  # the target bitrate the playlist announces (BANDWIDTH) and x264 aims at


# Two renditions: the adaptive ladder a player picks from by its bandwidth. The top one is the
# download (video.mp4).
LADDER: tuple[Rendition, ...] = (Rendition("hi", 4, 400), Rendition("lo", 2, 120))
SEGMENT_SECONDS = 1
SPRITE_COLUMNS = 4

CONTENT_TYPES = {
    ".mp4": "video/mp4", ".m4s": "video/iso.segment", ".m3u8": "application/vnd.apple.mpegurl",
    ".png": "image/png",
}
_BITEXACT = ["-threads", "1", "-map_metadata", "-1", "-fflags", "+bitexact", "-flags:v", "+bitexact"]


class EncodeError(RuntimeError):
    """ffmpeg refused or failed; the message carries the end of its log."""


@dataclass(frozen=True)
class MediaFile:
    name: str  # relative: "video.mp4", "hls/hi/seg_000.m4s", ...
    data: bytes

    @property
    def content_type(self) -> str:
        return CONTENT_TYPES[Path(self.name).suffix]


@dataclass(frozen=True)
class Package:
    files: tuple[MediaFile, ...]
    width: int  # the download's (and the top rendition's) size
    height: int
    frames: int
    fps: int

    def file(self, name: str) -> MediaFile:
        for f in self.files:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def duration(self) -> float:
        return self.frames / self.fps


def ffmpeg_exe() -> str:
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def as_array(frames: Sequence[Image.Image] | np.ndarray) -> np.ndarray:
    """(frames, height, width, 3) uint8; refuses an empty clip, mixed sizes and odd sides (4:2:0
    chroma needs even ones)."""
    arr = np.stack([np.asarray(f.convert("RGB")) for f in frames]) if not isinstance(frames, np.ndarray) else frames
    if arr.ndim != 4 or arr.shape[0] == 0 or arr.shape[-1] != 3 or arr.dtype != np.uint8:
        raise ValueError(f"frames must be (n, height, width, 3) uint8, got {arr.shape} {arr.dtype}")
    if arr.shape[1] % 2 or arr.shape[2] % 2:
        raise ValueError(f"frame sides must be even, got {arr.shape[2]}x{arr.shape[1]}")
    return np.ascontiguousarray(arr)


def _run(args: list[str], stdin: bytes, cwd: Path | None = None) -> None:
    done = subprocess.run([ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-nostdin", "-y", *args],
                          input=stdin, capture_output=True, check=False, cwd=cwd)
    if done.returncode != 0:
        raise EncodeError(done.stderr.decode(errors="replace")[-2000:])


def _input(arr: np.ndarray, fps: int) -> list[str]:
    n, h, w, _ = arr.shape
    return ["-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-r", str(fps), "-i", "pipe:0"]


def _x264(fps: int, bitrate_kbps: int, stream: str = "") -> list[str]:
    """libx264's options for one output stream (`stream`: ":0", ":1", ... where one command
    writes several). A key frame at every segment boundary and no scene-cut ones between, so
    each segment starts with one and a player can switch renditions there."""
    gop = fps * SEGMENT_SECONDS
    return [f"-c:v{stream}", "libx264", f"-preset:v{stream}", "medium", f"-profile:v{stream}", "high",
            f"-pix_fmt:v{stream}", "yuv420p", f"-b:v{stream}", f"{bitrate_kbps}k",
            f"-maxrate:v{stream}", f"{bitrate_kbps * 2}k", f"-bufsize:v{stream}", f"{bitrate_kbps * 2}k",
            f"-g:v{stream}", str(gop), f"-keyint_min:v{stream}", str(gop), f"-sc_threshold:v{stream}", "0",
            f"-x264-params:v{stream}", "threads=1"]


def mp4(arr: np.ndarray, fps: int, rendition: Rendition) -> bytes:
    _, h, w, _ = arr.shape
    with tempfile.TemporaryDirectory(prefix="imagegen-mp4-") as tmp:
        out = Path(tmp) / "video.mp4"
        _run([*_input(arr, fps), "-vf", f"scale={w * rendition.scale}:{h * rendition.scale}:flags=neighbor",
              *_x264(fps, rendition.bitrate_kbps), *_BITEXACT, "-movflags", "+faststart", "-f", "mp4", str(out)],
             arr.tobytes())
        return out.read_bytes()


def hls(arr: np.ndarray, fps: int, ladder: Sequence[Rendition] = LADDER) -> list[MediaFile]:
    """The ladder's playlists, init segments and fMP4 media segments, names under `hls/`."""
    _, h, w, _ = arr.shape
    split = f"[0:v]split={len(ladder)}" + "".join(f"[s{i}]" for i in range(len(ladder)))
    scales = ";".join(f"[s{i}]scale={w * r.scale}:{h * r.scale}:flags=neighbor[v{i}]" for i, r in enumerate(ladder))
    args = [*_input(arr, fps), "-filter_complex", f"{split};{scales}"]
    for i, r in enumerate(ladder):
        args += ["-map", f"[v{i}]", *_x264(fps, r.bitrate_kbps, f":{i}")]
    args += [*_BITEXACT, "-f", "hls", "-hls_time", str(SEGMENT_SECONDS), "-hls_playlist_type", "vod",
             "-hls_segment_type", "fmp4", "-hls_fmp4_init_filename", "init.mp4",
             "-hls_segment_filename", "%v/seg_%03d.m4s", "-master_pl_name", "master.m3u8",
             "-var_stream_map", " ".join(f"v:{i},name:{r.name}" for i, r in enumerate(ladder)), "%v/index.m3u8"]
    with tempfile.TemporaryDirectory(prefix="imagegen-hls-") as tmp:
        for r in ladder:
            (Path(tmp) / r.name).mkdir()
        _run(args, arr.tobytes(), Path(tmp))
        files = sorted(p for p in Path(tmp).rglob("*") if p.is_file())
        return [MediaFile(f"hls/{p.relative_to(tmp).as_posix()}", p.read_bytes()) for p in files]


def png(image: Image.Image) -> bytes:
    from jobs.media.encoding import png_bytes

    return png_bytes(image, level=6)


def sprite_sheet(arr: np.ndarray, columns: int = SPRITE_COLUMNS) -> Image.Image:
    n, h, w, _ = arr.shape
    rows = -(-n // columns)
    sheet = np.zeros((rows * h, columns * w, 3), np.uint8)
    for i, frame in enumerate(arr):
        r, c = divmod(i, columns)
        sheet[r * h:(r + 1) * h, c * w:(c + 1) * w] = frame
    return Image.fromarray(sheet)


def package(frames: Sequence[Image.Image] | np.ndarray, fps: int, ladder: Sequence[Rendition] = LADDER) -> Package:
    """Every file a delivered clip is made of (see the module's docstring)."""
    arr = as_array(frames)
    n, h, w, _ = arr.shape
    top = ladder[0]
    poster = Image.fromarray(arr[0]).resize((w * top.scale, h * top.scale), Image.Resampling.NEAREST)
    files = [MediaFile("video.mp4", mp4(arr, fps, top)), MediaFile("poster.png", png(poster)),
             MediaFile("sprites.png", png(sprite_sheet(arr))), *hls(arr, fps, ladder)]
    return Package(tuple(files), w * top.scale, h * top.scale, n, fps)


# --- reading the files back (checks, tests and the benchmark) ---------------------------------

def strip_of(frames: list[Image.Image]) -> Image.Image:
    """A clip's frames side by side, left to right, in one RGB picture."""
    width, height = frames[0].size
    strip = Image.new("RGB", (width * len(frames), height))
    for i, frame in enumerate(frames):
        strip.paste(frame.convert("RGB"), (i * width, 0))
    return strip


def frames_of(strip: Image.Image, frames: int) -> np.ndarray:
    """The frames of a strip as (frames, height, width, 3) uint8; ValueError when the strip is not
    `frames` frames wide (fail closed: the gate never judges part of a clip as the whole)."""
    arr = np.asarray(strip.convert("RGB"))
    height, width, _ = arr.shape
    if frames < 2 or width % frames:
        raise ValueError(f"a {width}x{height} picture is not a strip of {frames} frames")
    side = width // frames
    return np.stack([arr[:, i * side:(i + 1) * side] for i in range(frames)])


def boxes(data: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[str, int, int]]:
    """The ISO BMFF boxes between start and end: (type, offset, size)."""
    end = len(data) if end is None else end
    at = start
    while at + 8 <= end:
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        if size == 1:
            size = struct.unpack(">Q", data[at + 8:at + 16])[0]
        elif size == 0:
            size = end - at
        if size < 8 or at + size > end:
            raise ValueError(f"a box at {at} runs past the end ({size} bytes)")
        yield kind.decode("latin-1"), at, size
        at += size


def top_level(data: bytes) -> list[str]:
    return [kind for kind, _, _ in boxes(data)]


def decode(data: bytes, suffix: str = ".mp4") -> np.ndarray:
    """The frames of an MP4 (or of an HLS playlist's directory, given as a path), RGB uint8."""
    with tempfile.TemporaryDirectory(prefix="imagegen-decode-") as tmp:
        src = Path(tmp) / f"in{suffix}"
        src.write_bytes(data)
        return decode_path(src)


def decode_path(src: Path) -> np.ndarray:
    probe = subprocess.run([ffmpeg_exe(), "-hide_banner", "-nostdin", "-i", str(src)], capture_output=True, text=True,
                           check=False).stderr
    size = _size_from_log(probe)
    demuxer = ["-allowed_extensions", "ALL"] if src.suffix == ".m3u8" else []
    done = subprocess.run([ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-nostdin", *demuxer,
                           "-i", str(src), "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"],
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise EncodeError(done.stderr.decode(errors="replace")[-2000:])
    w, h = size
    return np.frombuffer(done.stdout, np.uint8).reshape(-1, h, w, 3)


def _size_from_log(log: str) -> tuple[int, int]:
    import re

    m = re.search(r"Video: .*?(\d{2,5})x(\d{2,5})", log)
    if not m:
        raise EncodeError(f"no video stream found: {log[-500:]}")
    return int(m.group(1)), int(m.group(2))
