"""Procedural "shapes" dataset: 64x64 RGB images of one or two shapes with captions.

Other frames (the size menu's 96x64, 64x96, 96x96: ``width`` and ``height`` arguments) draw the
same scenes for aspect-ratio buckets (issue 46): a shape's size is relative to the frame's shorter
side as at 64x64, one shape is placed anywhere in the frame (a margin kept), two shapes sit left
and right. At 64x64 every sample is the one it always was.

Every sample is a pure function of ``(seed, index)``: the generator seeds a numpy RNG
with ``[seed, index]``, so the same seed and index always give the same image, caption
and ground truth, and any subset of indices can be generated independently (on the fly).

Example captions::

    a small red circle on a blue background
    a yellow star on a black background            (size word omitted sometimes)
    a green square and a large white heart on a red background   (two shapes, left to right)
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
from PIL import Image, ImageDraw

IMAGE_SIZE = 64
SUPERSAMPLE = 4  # draw at 4x, downsample with a box filter -> anti-aliased edges

SHAPES = ["circle", "square", "triangle", "star", "heart"]

# Six colours far apart in RGB (min pairwise distance ~ 180).
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 40),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 40),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
}
COLOUR_NAMES = list(COLOURS)
SIZES = ["small", "large"]

# Half-extent ("radius") in pixels of a shape at 64x64, by size and by number of shapes.
_RADIUS = {
    1: {"small": (9.0, 11.0), "large": (16.0, 19.0)},
    2: {"small": (7.5, 9.0), "large": (11.5, 13.0)},
}


@dataclass
class ShapeGT:
    kind: str
    colour: str
    size: str
    cx: float  # centre, pixels in the 64x64 image (or the frame it was drawn for)
    cy: float
    radius: float


@dataclass
class SampleGT:
    background: str
    shapes: list[ShapeGT] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _polygon(kind: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    if kind == "square":
        h = 0.85 * r
        return [(cx - h, cy - h), (cx + h, cy - h), (cx + h, cy + h), (cx - h, cy + h)]
    if kind == "triangle":
        # equilateral, pointing up, bounding box centred on (cx, cy)
        side = 2.0 * r
        height = side * math.sqrt(3) / 2
        top = cy - height / 2
        return [(cx, top), (cx + r, top + height), (cx - r, top + height)]
    if kind == "star":
        pts = []
        inner = 0.48 * r
        for i in range(10):
            ang = -math.pi / 2 + i * math.pi / 5
            rr = r if i % 2 == 0 else inner
            pts.append((cx + rr * math.cos(ang), cy + 0.05 * r + rr * math.sin(ang)))
        return pts
    if kind == "heart":
        pts = []
        for t in np.linspace(0, 2 * math.pi, 80, endpoint=False):
            x = 16 * math.sin(t) ** 3
            y = 13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t)
            # x in [-16,16], y in [-17,12]: centre the y-range
            pts.append((cx + x * r / 16.0, cy - (y + 2.5) * r / 15.5))
        return pts
    raise ValueError(kind)


def _draw(gt: SampleGT, width: int, height: int, scale: float) -> Image.Image:
    """The scene supersampled (its coordinates times ``scale`` are pixels of the big canvas),
    box-filtered down to ``width`` x ``height``."""
    big = Image.new("RGB", (int(width * SUPERSAMPLE), int(height * SUPERSAMPLE)), COLOURS[gt.background])
    draw = ImageDraw.Draw(big)
    for sh in gt.shapes:
        fill = COLOURS[sh.colour]
        cx, cy, r = sh.cx * scale, sh.cy * scale, sh.radius * scale
        if sh.kind == "circle":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        else:
            draw.polygon(_polygon(sh.kind, cx, cy, r), fill=fill)
    return big.resize((width, height), Image.BOX)


def render_frame(gt: SampleGT, width: int, height: int) -> Image.Image:
    """Render a ground truth whose coordinates are pixels of a ``width`` x ``height`` frame."""
    return _draw(gt, width, height, SUPERSAMPLE)


def render(gt: SampleGT, size: int = IMAGE_SIZE) -> Image.Image:
    """Render a ground-truth description to an RGB image of ``size`` x ``size``."""
    return _draw(gt, size, size, SUPERSAMPLE * size / IMAGE_SIZE)


def caption_for(gt: SampleGT, with_size: bool | list[bool] = True) -> str:
    if isinstance(with_size, bool):
        with_size = [with_size] * len(gt.shapes)
    parts = []
    for sh, ws in zip(gt.shapes, with_size, strict=True):
        parts.append(f"a {sh.size} {sh.colour} {sh.kind}" if ws else f"a {sh.colour} {sh.kind}")
    return " and ".join(parts) + f" on a {gt.background} background"


def random_gt(rng: np.random.Generator, n_shapes: int | None = None, p_two: float = 0.25,
              width: int = IMAGE_SIZE, height: int = IMAGE_SIZE) -> SampleGT:
    """A random scene; coordinates are pixels of a ``width`` x ``height`` frame (64x64 default)."""
    if (width, height) != (IMAGE_SIZE, IMAGE_SIZE):
        return _random_gt_frame(rng, n_shapes, p_two, width, height)
    if n_shapes is None:
        n_shapes = 2 if rng.random() < p_two else 1
    bg = COLOUR_NAMES[rng.integers(len(COLOUR_NAMES))]
    fg_choices = [c for c in COLOUR_NAMES if c != bg]
    gt = SampleGT(background=bg)
    if n_shapes == 1:
        kind = SHAPES[rng.integers(len(SHAPES))]
        colour = fg_choices[rng.integers(len(fg_choices))]
        size = SIZES[rng.integers(2)]
        r = float(rng.uniform(*_RADIUS[1][size]))
        margin = r + 2
        jit = min(8.0, 32 - margin)
        cx = 32 + float(rng.uniform(-jit, jit))
        cy = 32 + float(rng.uniform(-jit, jit))
        gt.shapes.append(ShapeGT(kind, colour, size, cx, cy, r))
    else:
        colours = rng.choice(len(fg_choices), size=2, replace=False)
        for slot in range(2):
            kind = SHAPES[rng.integers(len(SHAPES))]
            size = SIZES[rng.integers(2)]
            r = float(rng.uniform(*_RADIUS[2][size]))
            base_x = 18.0 if slot == 0 else 46.0
            cx = base_x + float(rng.uniform(-3, 3))
            cy = 32 + float(rng.uniform(-min(10.0, 30 - r), min(10.0, 30 - r)))
            gt.shapes.append(ShapeGT(kind, fg_choices[colours[slot]], size, cx, cy, r))
    return gt


def _random_gt_frame(rng: np.random.Generator, n_shapes: int | None, p_two: float,
                     width: int, height: int) -> SampleGT:
    """A scene in a frame other than 64x64: radii scale with the shorter side; one shape anywhere
    (its whole outline and 2 px of margin inside the frame), two shapes left and right."""
    if n_shapes is None:
        n_shapes = 2 if rng.random() < p_two else 1
    scale = min(width, height) / IMAGE_SIZE
    bg = COLOUR_NAMES[rng.integers(len(COLOUR_NAMES))]
    fg_choices = [c for c in COLOUR_NAMES if c != bg]
    gt = SampleGT(background=bg)
    if n_shapes == 1:
        kind = SHAPES[rng.integers(len(SHAPES))]
        colour = fg_choices[rng.integers(len(fg_choices))]
        size = SIZES[rng.integers(2)]
        r = float(rng.uniform(*_RADIUS[1][size])) * scale
        margin = r + 2 * scale
        cx = float(rng.uniform(margin, width - margin))
        cy = float(rng.uniform(margin, height - margin))
        gt.shapes.append(ShapeGT(kind, colour, size, cx, cy, r))
        return gt
    colours = rng.choice(len(fg_choices), size=2, replace=False)
    for slot in range(2):
        kind = SHAPES[rng.integers(len(SHAPES))]
        size = SIZES[rng.integers(2)]
        r = float(rng.uniform(*_RADIUS[2][size])) * scale
        base_x = width * (18.0 if slot == 0 else 46.0) / IMAGE_SIZE
        cx = base_x + float(rng.uniform(-3, 3)) * width / IMAGE_SIZE
        jit = max(0.0, min(10.0 * height / IMAGE_SIZE, height / 2 - r - 2 * scale))
        cy = height / 2 + float(rng.uniform(-jit, jit))
        gt.shapes.append(ShapeGT(kind, fg_choices[colours[slot]], size, cx, cy, r))
    return gt


def sample(seed: int, index: int, n_shapes: int | None = None, p_two: float = 0.25,
           p_no_size: float = 0.3, width: int = IMAGE_SIZE, height: int = IMAGE_SIZE):
    """Return ``(PIL image, caption, ground truth)`` for sample ``index`` of the dataset ``seed``
    (at 64x64 unless ``width``/``height`` name another frame, whose samples are their own)."""
    square = (width, height) == (IMAGE_SIZE, IMAGE_SIZE)
    rng = np.random.default_rng([seed, index] if square else [seed, index, width, height])
    gt = random_gt(rng, n_shapes=n_shapes, p_two=p_two, width=width, height=height)
    with_size = [bool(rng.random() >= p_no_size) for _ in gt.shapes]
    img = render(gt) if square else render_frame(gt, width, height)
    return img, caption_for(gt, with_size), gt


class ShapesDataset:
    """Indexable, seeded, on-the-fly dataset. ``ds[i] -> (image, caption, gt)``."""

    def __init__(self, seed: int = 0, length: int = 1_000_000, n_shapes: int | None = None,
                 p_two: float = 0.25, p_no_size: float = 0.3, width: int = IMAGE_SIZE,
                 height: int = IMAGE_SIZE):
        self.seed, self.length = seed, length
        self.n_shapes, self.p_two, self.p_no_size = n_shapes, p_two, p_no_size
        self.width, self.height = width, height

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if not 0 <= index < self.length:
            raise IndexError(index)
        return sample(self.seed, index, self.n_shapes, self.p_two, self.p_no_size, self.width, self.height)

    def arrays(self, indices) -> tuple[np.ndarray, list[str], list[SampleGT]]:
        """uint8 array (N, height, width, 3), captions and ground truths for ``indices``."""
        imgs, caps, gts = [], [], []
        for i in indices:
            im, cap, gt = self[i]
            imgs.append(np.asarray(im))
            caps.append(cap)
            gts.append(gt)
        return np.stack(imgs), caps, gts


def vocabulary() -> list[str]:
    """All words that captions can contain."""
    return ["a", "and", "on", "background"] + SIZES + COLOUR_NAMES + SHAPES


def nearest_colour(rgb) -> str:
    rgb = np.asarray(rgb, dtype=np.float32)
    names = COLOUR_NAMES
    d = [float(np.sum((rgb - np.asarray(COLOURS[n], np.float32)) ** 2)) for n in names]
    return names[int(np.argmin(d))]
