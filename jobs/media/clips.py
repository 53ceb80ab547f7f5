"""A done clip's public files, made from its strip at publish (jobs/pipeline/publish.py) or when a
moderator approves a held one (jobs/actions/review.py): docs/video.md."""

from __future__ import annotations

import hashlib
from functools import partial

from jobs.media.storage import publish_once, quarantine_storage
from jobs.models import GeneratedImage, GenerationJob


def publish_clip(image: GeneratedImage, job: GenerationJob) -> dict:
    """Package a done clip's strip (its frames side by side, in quarantine) into its public files:
    jobs.media.video.package (MP4, poster, sprites, HLS) and the MP4's content credentials, each an
    immutable object under `v/<row id>/`. Returns the row's fields naming them (the caller writes
    them in the transaction that makes the row public). Idempotent: a file already public is read
    back, not written again (its credentials were signed once), so every run answers the same."""
    from PIL import Image

    from jobs.media import credentials, encoding, video

    with quarantine_storage().open(image.storage_key, "rb") as f:
        strip = Image.open(f)
        strip.load()
    package = video.package(video.frames_of(strip, job.frames), job.fps or 8)
    prefix = f"v/{image.id.hex}/"
    parameters = encoding.ImageParameters.of(job, image.seed, job.negative_prompt)
    for file in package.files[1:]:  # the MP4 last: its object present means the set is
        publish_once(prefix + file.name, partial(bytes, file.data))  # a transient error: the stage retries
    unsigned = package.file("video.mp4").data
    mp4 = publish_once(prefix + "video.mp4", lambda: credentials.sign(unsigned, "mp4", parameters))
    names = [prefix + f.name for f in package.files]
    fields = dict(
        byte_size=len(mp4), sha256=hashlib.sha256(mp4).hexdigest(), content_sha256=credentials.content_digest(unsigned),
        storage_key=prefix + "video.mp4", content_type="video/mp4",
        width=package.width, height=package.height,
        media={"poster": prefix + "poster.png", "sprites": prefix + "sprites.png", "playlist": prefix + "hls/master.m3u8",
               "strip": image.storage_key, "files": names, "frames": package.frames, "fps": package.fps},
    )
    return fields
