"""The demo classifier's own contract: native-resolution batches keep the images' order, and the
shipped one (v3; v2 before it, still loadable) is what the policy's section of its version expects."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from safety.shapes_classifier import ShapesClassifier

MODELS = Path(__file__).resolve().parent.parent / "models"
V2, SHIPPED = MODELS / "shapes-classifier-v2", MODELS / "shapes-classifier-v3"


def circle(size) -> Image.Image:
    im = Image.new("RGB", size, (245, 245, 245))
    w, h = size
    ImageDraw.Draw(im).ellipse((w / 2 - 15, h / 2 - 15, w / 2 + 15, h / 2 + 15), fill=(30, 170, 40))
    return im


def test_images_of_mixed_sizes_are_scored_in_order_as_if_one_by_one():
    clf = ShapesClassifier.from_pretrained(SHIPPED)
    images = [circle((64, 64)), circle((96, 64)), circle((64, 96)), Image.new("RGB", (96, 96), (15, 15, 15)), circle((64, 64))]
    together = clf.scores(images)
    alone = [clf.scores([im])[0] for im in images]
    assert len(together) == len(images)
    for a, b in zip(together, alone, strict=True):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], abs=1e-5) for k in a)


@pytest.mark.parametrize(("path", "version"), [(V2, "shapes-classifier-v2"), (SHIPPED, "shapes-classifier-v3")])
def test_v2_and_v3_read_images_at_their_own_size_and_know_other(path, version):
    clf = ShapesClassifier.from_pretrained(path)
    assert clf.input_size is None and clf.version == version
    assert clf.labels == ("circle", "square", "triangle", "star", "heart", "other")
    assert clf.scores([]) == []
    big = clf.prepare(Image.new("RGB", (1024, 512)))
    assert big.shape == (128, 256, 3)  # bounded: larger images are scaled down to 256 a side
