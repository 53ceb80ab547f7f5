"""Procedural clips of one moving shape, with captions: the motion module's training data (issue 47).

Every clip is 16 frames of 64x64 RGB (8 fps, so two seconds), one shape of training/shapes_data.py
(its kinds, colours and drawing) on a plain background, moving by one of a small grammar of motions:

    a red circle moving left to right on a blue background
    a red circle moving right to left on a blue background
    a yellow square moving up on a black background          (towards the top of the frame)
    a yellow square moving down on a black background
    a yellow square bouncing on a black background           (falls to a floor and rises again)
    a green triangle spinning on a white background          (turns about its centre; no circles)
    a blue star growing on a yellow background               (its radius grows about 2.4x)
    a blue star shrinking on a yellow background

A clip is a pure function of ``(seed, index)`` as shapes_data's samples are. Some
(colour, kind, motion) triples never occur in training (``HELD_OUT``): the evaluation's captions
(bench/motion_eval.py) are drawn from those, so every judged caption is a combination the motion
module has not seen.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image, ImageDraw

from training.shapes_data import COLOUR_NAMES, COLOURS, IMAGE_SIZE, SHAPES, SUPERSAMPLE, _polygon

FRAMES = 16
FPS = 8
TRAIN_SEED = 4747          # clips for training; the evaluation's seeds are disjoint (bench/motion_eval.py)

# motion -> the words of the caption that name it
MOTIONS: dict[str, str] = {
    "right": "moving left to right",
    "left": "moving right to left",
    "up": "moving up",
    "down": "moving down",
    "bounce": "bouncing",
    "spin": "spinning",
    "grow": "growing",
    "shrink": "shrinking",
}
MOTION_NAMES = list(MOTIONS)
MOTION_WORDS = sorted({w for phrase in MOTIONS.values() for w in phrase.split()})

TRAVEL = (12.0, 15.0)      # half the path of a moving shape, pixels (so 24..30 px in 16 frames)
BOUNCE_HEIGHT = (16.0, 22.0)
SPIN_DEG_PER_FRAME = (6.0, 8.0)
GROW_RADIUS = (7.0, 17.0)  # radius at the start and end of "growing" (reversed for "shrinking")
RADIUS = (9.0, 12.0)       # the radius of shapes that do not grow or shrink


def allowed(kind: str, motion: str) -> bool:
    """A spinning circle looks still: the grammar has none."""
    return not (kind == "circle" and motion == "spin")


def _held_out(colour: str, kind: str, motion: str) -> bool:
    # spread over colours, kinds and motions alike: every motion keeps most of its kinds and
    # colours in training, and every held-out triple's pairs occur in training with other third parts
    return (COLOUR_NAMES.index(colour) + 2 * SHAPES.index(kind) + 3 * MOTION_NAMES.index(motion)) % 9 == 0


HELD_OUT: frozenset[tuple[str, str, str]] = frozenset(
    (c, k, m) for c in COLOUR_NAMES for k in SHAPES for m in MOTION_NAMES if allowed(k, m) and _held_out(c, k, m)
)


@dataclass
class ClipGT:
    kind: str
    colour: str
    background: str
    motion: str
    cx: list[float]      # per frame: centre (pixels), radius, angle (degrees, counter-clockwise)
    cy: list[float]
    radius: list[float]
    angle: list[float]

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def caption(self) -> str:
        return caption(self.colour, self.kind, self.motion, self.background)


def caption(colour: str, kind: str, motion: str, background: str) -> str:
    return f"a {colour} {kind} {MOTIONS[motion]} on a {background} background"


def vocabulary() -> list[str]:
    """The words a motion caption adds to shapes_data.vocabulary()."""
    return list(MOTION_WORDS)


def path(motion: str, rng: np.random.Generator, frames: int = FRAMES) -> tuple[list[float], ...]:
    """Per-frame (cx, cy, radius, angle) of one clip of ``motion``."""
    t = np.linspace(0.0, 1.0, frames)
    r0 = float(rng.uniform(*RADIUS))
    jx, jy = (float(v) for v in rng.uniform(-5, 5, size=2))
    cx = np.full(frames, 32.0 + jx)
    cy = np.full(frames, 32.0 + jy)
    r = np.full(frames, r0)
    angle = np.zeros(frames)
    travel = float(rng.uniform(*TRAVEL))
    if motion in ("right", "left"):
        sign = 1.0 if motion == "right" else -1.0
        cx = 32.0 + sign * travel * (2 * t - 1)
    elif motion in ("up", "down"):
        sign = -1.0 if motion == "up" else 1.0
        cy = 32.0 + sign * travel * (2 * t - 1)
    elif motion == "bounce":
        # starts high, falls to the floor half-way, rises back: one bounce, |cos| like a ball
        h = float(rng.uniform(*BOUNCE_HEIGHT))
        floor = 32.0 + h / 2 + float(rng.uniform(-2, 2))
        phase = float(rng.uniform(-0.08, 0.08))
        cy = floor - h * np.abs(np.cos(math.pi * (t + phase)))
    elif motion == "spin":
        rate = float(rng.uniform(*SPIN_DEG_PER_FRAME)) * (1 if rng.random() < 0.5 else -1)
        angle = float(rng.uniform(-10, 10)) + rate * np.arange(frames)
    elif motion in ("grow", "shrink"):
        lo, hi = GROW_RADIUS
        r = lo + (hi - lo) * (t if motion == "grow" else 1 - t)
        cx, cy = 32.0 + jx / 2 + 0 * t, 32.0 + jy / 2 + 0 * t
    else:
        raise ValueError(motion)
    return ([float(v) for v in cx], [float(v) for v in cy], [float(v) for v in r], [float(v) for v in angle])


def render_frame(kind: str, colour: str, background: str, cx: float, cy: float, r: float, angle: float,
                 size: int = IMAGE_SIZE) -> Image.Image:
    """One frame, drawn as shapes_data.render draws a shape, turned by ``angle`` degrees about its centre."""
    s = SUPERSAMPLE * size / IMAGE_SIZE
    big = Image.new("RGB", (int(size * SUPERSAMPLE), int(size * SUPERSAMPLE)), COLOURS[background])
    draw = ImageDraw.Draw(big)
    X, Y, R = cx * s, cy * s, r * s
    if kind == "circle":
        draw.ellipse([X - R, Y - R, X + R, Y + R], fill=COLOURS[colour])
    else:
        a = math.radians(angle)
        ca, sa = math.cos(a), math.sin(a)
        # counter-clockwise on screen (y points down)
        pts = [(X + (px - X) * ca + (py - Y) * sa, Y - (px - X) * sa + (py - Y) * ca)
               for px, py in _polygon(kind, X, Y, R)]
        draw.polygon(pts, fill=COLOURS[colour])
    return big.resize((size, size), Image.BOX)


def render_clip(gt: ClipGT) -> np.ndarray:
    """uint8 array (frames, 64, 64, 3)."""
    return np.stack([np.asarray(render_frame(gt.kind, gt.colour, gt.background, x, y, r, a))
                     for x, y, r, a in zip(gt.cx, gt.cy, gt.radius, gt.angle, strict=True)])


def make_clip(colour: str, kind: str, motion: str, background: str, rng: np.random.Generator) -> ClipGT:
    cx, cy, r, angle = path(motion, rng)
    return ClipGT(kind, colour, background, motion, cx, cy, r, angle)


def random_clip(rng: np.random.Generator, held_out: bool = False) -> ClipGT:
    """A clip whose (colour, kind, motion) is in training (or, with ``held_out``, one of HELD_OUT)."""
    while True:
        kind = SHAPES[rng.integers(len(SHAPES))]
        motion = MOTION_NAMES[rng.integers(len(MOTION_NAMES))]
        colour = COLOUR_NAMES[rng.integers(len(COLOUR_NAMES))]
        if allowed(kind, motion) and ((colour, kind, motion) in HELD_OUT) == held_out:
            break
    bg = [c for c in COLOUR_NAMES if c != colour][rng.integers(len(COLOUR_NAMES) - 1)]
    return make_clip(colour, kind, motion, bg, rng)


def clip(seed: int, index: int, held_out: bool = False) -> tuple[np.ndarray, str, ClipGT]:
    """``(frames uint8 (16, 64, 64, 3), caption, ground truth)`` of clip ``index`` of dataset ``seed``."""
    gt = random_clip(np.random.default_rng([seed, index]), held_out=held_out)
    return render_clip(gt), gt.caption, gt
