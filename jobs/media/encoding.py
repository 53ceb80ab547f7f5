"""Image files: encoding a generated image once, at the GPU worker's hand-off, off the
denoising thread, in the job's output format, with the job's parameters inside the file.

PNG is written here with numpy (row filter) and zlib, not with Pillow: zlib releases the
interpreter lock while it compresses, so several encoder threads use several cores, and it was
twice as fast as Pillow's encoder at the same compression (bench/pipeline.py; 1024x1024: ~115 ms
at level 1, against 227 ms). The level is a setting (IMAGEGEN_PNG_COMPRESS_LEVEL). JPEG and WebP
go through Pillow (libjpeg / libwebp release the lock too).

Every file says how it was made, in the form other tools read:

- PNG: a `parameters` text chunk in the AUTOMATIC1111 form (prompt, `Negative prompt: ...`,
  then `Steps: 20, CFG scale: 5.0, Seed: 7, Size: 64x64, Model: ..., Job id: ...`);
- JPEG and WebP: the same text as the EXIF UserComment (the A1111 convention), and an XMP
  packet with `dc:description` (the same text) and one `imagegen:` property per parameter.

`read_parameters` reads either back with Pillow.
"""

from __future__ import annotations

import base64
import io
import re
import struct
import zlib
from dataclasses import dataclass
from typing import Any
from xml.etree import ElementTree
from xml.sax.saxutils import escape

import numpy as np
from django.conf import settings
from PIL import Image

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_SUB_FILTER = 1

# format -> (content type, key extension, Pillow format). The extension is the format's name,
# so the content type that S3 (and the local server) derive from the key's extension matches.
FORMATS: dict[str, tuple[str, str, str]] = {
    "png": ("image/png", "png", "PNG"),
    "jpeg": ("image/jpeg", "jpeg", "JPEG"),
    "webp": ("image/webp", "webp", "WEBP"),
}
OUTPUT_FORMATS = tuple(FORMATS)
DEFAULT_COMPRESSION = 100  # OpenAI's default for jpeg and webp: the best quality
CONTENT_TYPES = {content_type: fmt for fmt, (content_type, _, _) in FORMATS.items()}

_EXIF_IFD = 0x8769
_USER_COMMENT = 0x9286
_SOFTWARE = 0x0131
XMP_NS = "https://imagegen.invalid/ns/1.0/"  # a namespace name, never fetched
_DC_NS = "http://purl.org/dc/elements/1.1/"
_RDF_NS = "http://www.w3.org/1999/02/22-rdf-syntax-ns#"


@dataclass(frozen=True)
class Encoded:
    data: bytes
    content_type: str
    extension: str


@dataclass(frozen=True)
class ImageParameters:
    """What an image file says about how it was made."""

    prompt: str
    negative_prompt: str
    seed: int
    steps: int
    guidance_scale: float
    width: int
    height: int
    model_version: str
    job_id: str
    scheduler: str = ""
    # The user's own prompt and the rewriter's identity, where the rewriter changed what is drawn
    # (`prompt` is always what the image model was given).
    original_prompt: str = ""
    rewriter: str = ""
    # Where the safety policy's steering changed the negative prompt (safety/image_policy.py,
    # "steer"): `negative_prompt` is what the model was given, this is the user's own.
    original_negative_prompt: str | None = None

    @classmethod
    def of(cls, job: Any, seed: int, given_negative: str | None = None) -> ImageParameters:
        """For one image of a job; `given_negative`: the negative prompt the model was given, where
        the worker knows it. A regeneration names the job it regenerates, so its file comes out
        byte for byte the same as the dropped one."""
        drawn = getattr(job, "drawn_prompt", job.prompt)
        rewritten = drawn != job.prompt
        given = job.negative_prompt if given_negative is None else given_negative
        return cls(
            prompt=drawn, original_prompt=job.prompt if rewritten else "",
            rewriter=job.rewriter_version if rewritten else "", negative_prompt=given,
            original_negative_prompt=job.negative_prompt if given != job.negative_prompt else None, seed=int(seed),
            steps=job.steps,
            guidance_scale=float(job.guidance_scale), width=job.width, height=job.height,
            model_version=job.model_version, job_id=str(getattr(job, "regenerates", None) or job.id),
            scheduler=job.scheduler,
        )

    def a1111(self) -> str:
        """The AUTOMATIC1111 `parameters` text that many tools (and people) read."""
        lines = [self.prompt]
        if self.negative_prompt:
            lines.append(f"Negative prompt: {self.negative_prompt}")
        fields = [("Steps", str(self.steps))]
        if self.scheduler:
            fields.append(("Levers", self.scheduler))  # a quality tier's (gpu_tasks/levers.py variants)
        fields += [
            ("CFG scale", f"{self.guidance_scale:g}"),
            ("Seed", str(self.seed)),
            ("Size", f"{self.width}x{self.height}"),
            ("Model", self.model_version),
            ("Job id", self.job_id),
        ]
        lines.append(", ".join(f"{k}: {v}" for k, v in fields))
        return "\n".join(lines)

    def as_dict(self) -> dict[str, str]:
        return {
            "prompt": self.prompt, "negativePrompt": self.negative_prompt, "seed": str(self.seed),
            "steps": str(self.steps), "guidanceScale": f"{self.guidance_scale:g}", "width": str(self.width),
            "height": str(self.height), "modelVersion": self.model_version, "jobId": self.job_id,
            "levers": self.scheduler,
            **({"originalPrompt": self.original_prompt, "rewriter": self.rewriter} if self.original_prompt else {}),
            **({"originalNegativePrompt": self.original_negative_prompt}
               if self.original_negative_prompt is not None else {}),
        }


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def png_bytes(image: Image.Image, level: int | None = None, text: dict[str, str] | None = None) -> bytes:
    """An 8-bit RGB PNG with the Sub filter on every row; `text` becomes tEXt chunks
    (Latin-1) or iTXt chunks (anything else)."""
    level = settings.IMAGEGEN_PNG_COMPRESS_LEVEL if level is None else level
    pixels = np.asarray(image.convert("RGB"), dtype=np.uint8)
    height, width, channels = pixels.shape
    rows = pixels.reshape(height, width * channels)
    raw = np.empty((height, width * channels + 1), dtype=np.uint8)
    raw[:, 0] = _SUB_FILTER
    raw[:, 1 : 1 + channels] = rows[:, :channels]
    np.subtract(rows[:, channels:], rows[:, :-channels], out=raw[:, 1 + channels :])  # wraps mod 256, as PNG wants
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    meta = b""
    for key, value in (text or {}).items():
        try:
            meta += _chunk(b"tEXt", key.encode("latin-1") + b"\0" + value.encode("latin-1"))
        except UnicodeEncodeError:
            meta += _chunk(b"iTXt", key.encode("latin-1") + b"\0\0\0\0\0" + value.encode("utf-8"))
    return (PNG_SIGNATURE + _chunk(b"IHDR", header) + meta + _chunk(b"IDAT", zlib.compress(raw.tobytes(), level))
            + _chunk(b"IEND", b""))


def jpeg_data_url(image: Image.Image, quality: int = 70) -> str:
    """A preview as sent in events: a small JPEG inline."""
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def user_comment(text: str) -> bytes:
    """EXIF UserComment: an 8-byte character-code prefix, then the text (ASCII, or UTF-16
    big-endian after `UNICODE\\0`, as piexif writes it and A1111 reads it)."""
    try:
        return b"ASCII\0\0\0" + text.encode("ascii")
    except UnicodeEncodeError:
        return b"UNICODE\0" + text.encode("utf-16-be")


def decode_user_comment(raw: bytes | str) -> str:
    if isinstance(raw, str):
        return raw
    prefix, body = raw[:8], raw[8:]
    if prefix.startswith(b"UNICODE"):
        return body.decode("utf-16-be")
    return body.decode("ascii" if prefix.startswith(b"ASCII") else "utf-8", errors="replace")


def xmp_packet(parameters: ImageParameters) -> bytes:
    props = "".join(f"<imagegen:{k}>{escape(v)}</imagegen:{k}>" for k, v in parameters.as_dict().items())
    return (
        '<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>'
        '<x:xmpmeta xmlns:x="adobe:ns:meta/">'
        f'<rdf:RDF xmlns:rdf="{_RDF_NS}">'
        f'<rdf:Description rdf:about="" xmlns:dc="{_DC_NS}" xmlns:imagegen="{XMP_NS}">'
        f'<dc:description><rdf:Alt><rdf:li xml:lang="x-default">{escape(parameters.a1111())}</rdf:li></rdf:Alt></dc:description>'
        f"{props}"
        "</rdf:Description></rdf:RDF></x:xmpmeta>"
        '<?xpacket end="r"?>'
    ).encode()


def _exif(parameters: ImageParameters) -> bytes:
    exif = Image.Exif()
    exif[_SOFTWARE] = "imagegen"
    exif.get_ifd(_EXIF_IFD)[_USER_COMMENT] = user_comment(parameters.a1111())
    return exif.tobytes()


def encode(image: Image.Image, output_format: str = "png", compression: int | None = None,
           parameters: ImageParameters | None = None) -> Encoded:
    """The image as a file of `output_format` (png, jpeg, webp). `compression` (0-100) is the
    quality of jpeg and webp (100, the default, is the best); png is lossless at the server's
    zlib level and ignores it."""
    if output_format not in FORMATS:
        raise ValueError(f"output_format must be one of {', '.join(FORMATS)}, not {output_format!r}")
    content_type, extension, pillow_format = FORMATS[output_format]
    if output_format == "png":
        text = {"parameters": parameters.a1111()} if parameters is not None else None
        return Encoded(png_bytes(image, text=text), content_type, extension)
    quality = DEFAULT_COMPRESSION if compression is None else max(0, min(100, int(compression)))
    options: dict[str, Any] = {"quality": quality}
    if parameters is not None:
        options.update(exif=_exif(parameters), xmp=xmp_packet(parameters))
    if output_format == "webp":
        # libwebp's fastest method: the hand-off must keep up with the GPU (1024x1024 q85, median of
        # 7 here: 35 ms against 273 ms at the default method 4, for 10% fewer bytes; at q100 4
        # makes 40% fewer bytes in 1.7x the time). bench/encode_formats.py measures it.
        options["method"] = 0
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format=pillow_format, **options)
    return Encoded(buf.getvalue(), content_type, extension)


def convert(data: bytes, output_format: str, compression: int | None, parameters: ImageParameters | None) -> Encoded:
    """A stored image in another format (a request-hash cache hit): decoded, encoded again."""
    with Image.open(io.BytesIO(data)) as source:
        source.load()
        return encode(source.convert("RGB"), output_format, compression, parameters)


def format_of_key(key: str) -> str:
    """The output format named by a storage key's extension (`i/<hex>.jpeg` -> jpeg)."""
    return key.rsplit(".", 1)[-1].lower() if "." in key else "png"


_A1111_FIELD = re.compile(r"\s*([\w][\w \-/]*):\s*([^,]*)(?:,|$)")


def parse_a1111(text: str) -> dict[str, str]:
    """The A1111 `parameters` text back into fields (prompt, negative prompt, Steps, Seed, ...)."""
    lines = text.split("\n")
    last = lines.pop() if lines else ""
    out: dict[str, str] = {k.strip(): v.strip() for k, v in _A1111_FIELD.findall(last)}
    negative = [i for i, line in enumerate(lines) if line.startswith("Negative prompt: ")]
    if negative:
        out["negative_prompt"] = "\n".join(lines[negative[0]:])[len("Negative prompt: "):]
        lines = lines[: negative[0]]
    out["prompt"] = "\n".join(lines)
    return out


def read_parameters(data: bytes) -> dict[str, str]:
    """The parameters an image file carries, read back with Pillow: the A1111 fields, and for
    JPEG/WebP the XMP properties as `xmp:<name>` too. Empty when it carries none."""
    with Image.open(io.BytesIO(data)) as im:
        info = dict(im.info)
        exif = im.getexif()
    if "parameters" in info:
        return parse_a1111(str(info["parameters"]))
    out: dict[str, str] = {}
    comment = exif.get_ifd(_EXIF_IFD).get(_USER_COMMENT)
    if comment:
        out.update(parse_a1111(decode_user_comment(comment)))
    xmp = info.get("xmp")
    if xmp:
        root = ElementTree.fromstring(xmp if isinstance(xmp, bytes) else str(xmp).encode("utf-8"))
        for node in root.iter():
            if node.tag.startswith("{" + XMP_NS + "}"):
                out["xmp:" + node.tag.split("}", 1)[1]] = node.text or ""
    return out
