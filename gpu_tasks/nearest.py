"""What the shipped image model can draw, and the nearest drawable for what it cannot (issue 45,
item 11): a colour or a shape outside the grammar is mapped to its nearest drawable one, and
said so, never silently swapped for an unrelated one; a thing with no sensible nearest (a cat)
is reported as not drawable.

The grammar (the training captions of models/shapes-*): six colours, five kinds, two sizes.

**Colours.** A colour word has an sRGB value (``NAMED_COLOURS``: CSS Color 4's named colours
where CSS has the name, else a common value), converted to CIELAB (D65). A colour whose chroma
C* is at least ``CHROMATIC`` is drawn as the chromatic palette colour (red, green, blue, yellow)
nearest in CIELAB hue angle; a near-grey one as white or black, whichever is nearer in lightness
L*. The grammar's colour words name hues, and a plain CIEDE2000 distance to the palette's
saturated points would draw pink, sky blue and turquoise as white (they are light); the hue rule
agrees with every colour synonym the rewriter was trained on but two (cream, olive), which keep
their trained meaning (``TRAINED_COLOURS``). Where the nearest is already another colour of the same
prompt (a grey star on a white background), the next is used (for a grey the other of white and
black, else the next by CIEDE2000) and the note says why. A shade word before a colour (light, dark, pale, ...)
moves L* (``SHADES``), so dark grey is black and light blue still blue.

**Kinds.** A stated table (``OFF_GRAMMAR_KINDS``), by outline: four-sided shapes are drawn as a
square, three-sided or pointed ones as a triangle, rayed ones as a star, round outlines and
polygons of five or more sides as a circle (their outline is closest to a circle: intersection
over union 0.90-0.96 with the drawn circle, against 0.82-0.84 with the drawn square).

**Not drawable.** Words in ``NOT_DRAWABLE`` (animals, people, things, places) have no sensible
nearest shape: they are reported, never swapped for a circle.

Stdlib only; a pure function of the text.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import partial

# Bumped whenever a table or a rule below changes what a prompt is rewritten to.
VERSION = "1"

SHAPE_KINDS = ("circle", "square", "triangle", "star", "heart")
# The sRGB the shipped models were trained to draw (training/shapes_data.COLOURS; a test holds them equal).
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220),
    "yellow": (240, 220, 40), "white": (245, 245, 245), "black": (15, 15, 15),
}
COLOURS = tuple(PALETTE)
CHROMATIC = 15.0  # C* at or above: a hue; below: a grey, drawn as white or black by lightness

# The colour synonyms the shipped rewriter was trained on (training/rewriter_data.COLOUR_WORDS;
# a test holds them equal): their trained meaning wins over the rule.
TRAINED_COLOURS: dict[str, str] = {
    **dict.fromkeys(["scarlet", "crimson", "vermilion", "ruby", "cherry", "tomato"], "red"),
    **dict.fromkeys(["emerald", "lime", "grass green", "jade", "leafy green", "olive"], "green"),
    **dict.fromkeys(["azure", "cerulean", "navy", "cobalt", "sapphire", "sky blue", "ultramarine"], "blue"),
    **dict.fromkeys(["golden", "gold", "lemon", "amber", "canary", "mustard"], "yellow"),
    **dict.fromkeys(["snowy", "ivory", "pale", "milky", "snow white", "cream"], "white"),
    **dict.fromkeys(["jet black", "ebony", "charcoal", "coal black", "pitch black", "inky"], "black"),
}

NAMED_COLOURS: dict[str, tuple[int, int, int]] = {
    "pink": (255, 192, 203), "hot pink": (255, 105, 180), "deep pink": (255, 20, 147), "rose": (255, 0, 127),
    "salmon": (250, 128, 114), "coral": (255, 127, 80), "peach": (255, 229, 180), "orange": (255, 165, 0),
    "tangerine": (242, 133, 0), "apricot": (251, 206, 177), "rust": (183, 65, 14), "brown": (165, 42, 42),
    "chocolate": (210, 105, 30), "sienna": (160, 82, 45), "copper": (184, 115, 51), "bronze": (205, 127, 50),
    "tan": (210, 180, 140), "beige": (245, 245, 220), "khaki": (240, 230, 140), "sand": (194, 178, 128),
    "maroon": (128, 0, 0), "burgundy": (128, 0, 32), "wine": (114, 47, 55), "magenta": (255, 0, 255),
    "fuchsia": (255, 0, 255), "purple": (128, 0, 128), "violet": (238, 130, 238), "plum": (221, 160, 221),
    "orchid": (218, 112, 214), "lilac": (200, 162, 200), "mauve": (224, 176, 255), "lavender": (230, 230, 250),
    "indigo": (75, 0, 130), "amethyst": (153, 102, 204), "periwinkle": (204, 204, 255), "teal": (0, 128, 128),
    "turquoise": (64, 224, 208), "cyan": (0, 255, 255), "aqua": (0, 255, 255), "aquamarine": (127, 255, 212),
    "mint": (152, 255, 152), "chartreuse": (127, 255, 0), "grey": (128, 128, 128), "gray": (128, 128, 128),
    "silver": (192, 192, 192), "slate": (112, 128, 144), "pewter": (150, 168, 161), "ash": (178, 190, 181),
    "smoke": (115, 130, 118), "snow": (255, 250, 250), "pearl": (234, 224, 200), "bone": (227, 218, 201),
    "forest green": (34, 139, 34), "sea green": (46, 139, 87), "royal blue": (65, 105, 225),
    "navy blue": (0, 0, 128), "midnight blue": (25, 25, 112), "steel blue": (70, 130, 180),
    "baby blue": (137, 207, 240),
}
# Off-palette colours in the rewriter's other languages (French, Spanish, German; German also with
# its endings -e, -er, -es, -em, -en), by the English name above.
FOREIGN_COLOURS: dict[str, str] = {
    "rose": "pink", "violet": "violet", "violette": "violet", "gris": "grey", "grise": "grey", "marron": "brown",
    "turquoise": "turquoise", "beige": "beige", "rosa": "pink", "morado": "purple", "morada": "purple",
    "naranja": "orange", "marrón": "brown", "violeta": "violet", "turquesa": "turquoise", "lila": "lilac",
    "grau": "grey", "braun": "brown", "violett": "violet", "türkis": "turquoise", "pink": "pink",
}
_GERMAN_ENDINGS = ("e", "er", "es", "em", "en")
# A shade word before a colour moves its lightness L* (the grammar has one shade of each colour).
SHADES = {"light": 20.0, "pale": 20.0, "pastel": 20.0, "baby": 20.0, "dark": -25.0, "deep": -25.0}

# Shapes outside the grammar, by outline (see the module's docstring).
OFF_GRAMMAR_KINDS: dict[str, str] = {
    **dict.fromkeys(["oval", "ovals", "ellipse", "ellipses", "ring", "rings", "donut", "doughnut", "annulus",
                     "pentagon", "pentagons", "hexagon", "hexagons", "heptagon", "octagon", "octagons",
                     "polygon", "polygons", "semicircle"], "circle"),
    **dict.fromkeys(["rectangle", "rectangles", "rhombus", "rhombi", "diamond", "diamonds", "lozenge", "kite",
                     "parallelogram", "trapezoid", "trapezium", "quadrilateral", "oblong"], "square"),
    **dict.fromkeys(["cone", "cones", "arrow", "arrows", "chevron"], "triangle"),
    **dict.fromkeys(["hexagram", "asterisk", "sparkle", "starburst", "sunburst"], "star"),
}
# The rewriter's trained shape synonyms (training/rewriter_data.SHAPE_WORDS, single words).
TRAINED_KINDS: dict[str, str] = {
    **dict.fromkeys(["disc", "disk", "ball", "dot", "orb", "pebble", "sphere", "coin"], "circle"),
    **dict.fromkeys(["box", "block", "tile", "cube"], "square"),
    **dict.fromkeys(["wedge", "pyramid", "arrowhead"], "triangle"),
    **dict.fromkeys(["pentagram"], "star"),
}
# ... and its trained phrases of several words (hyphens split), read before the single words.
TRAINED_SHAPE_PHRASES: dict[tuple[str, ...], str] = {
    ("rectangle", "with", "equal", "sides"): "square", ("five", "pointed", "star"): "star",
    ("three", "sided", "shape"): "triangle", ("starfish", "shape"): "star", ("star", "shape"): "star",
    ("love", "heart"): "heart", ("valentine", "heart"): "heart", ("heart", "shape"): "heart",
    ("round", "shape"): "circle",
}
# Things with no sensible nearest shape: reported as not drawable, never swapped.
NOT_DRAWABLE = frozenset("""
cat cats kitten dog dogs puppy horse horses cow sheep pig bird birds owl eagle duck fish whale shark dolphin
lion tiger bear elephant monkey rabbit mouse snake frog butterfly bee spider dragon unicorn dinosaur
man men woman women person people child children boy girl face portrait robot astronaut king queen
car cars truck bus bicycle bike train plane airplane boat ship rocket house houses castle building tower
city bridge church tree trees flower flowers roses forest mountain mountains river lake beach island
sun moon cloud clouds rainbow lightning apple banana pizza burger cake coffee cup bowl ramen bread
chair sofa bed lamp book phone computer guitar piano clock key sword hat shoe shirt dress
skull ghost zombie logo flag map cross crescent spiral squiggle
""".split())

_WORD = re.compile(r"[a-zà-ÿœ]+")
_ARTICLE = re.compile(r"\b(an?)(\s+)$", re.IGNORECASE)
_CLAUSE_END = frozenset(["on", "against", "over", "in", "and", "with", "upon", "above", "behind", "background"])


def _lin(c: float) -> float:
    c /= 255.0
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def lab(rgb: tuple[int, int, int]) -> tuple[float, float, float]:
    """sRGB (0-255) to CIELAB, D65 white."""
    r, g, b = (_lin(x) for x in rgb)
    x = (0.4124564 * r + 0.3575761 * g + 0.1804375 * b) / 0.95047
    y = 0.2126729 * r + 0.7151522 * g + 0.0721750 * b
    z = (0.0193339 * r + 0.1191920 * g + 0.9503041 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116

    fx, fy, fz = f(x), f(y), f(z)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def ciede2000(lab1: tuple[float, float, float], lab2: tuple[float, float, float]) -> float:
    """The CIEDE2000 colour difference (Sharma, Wu and Dalal's formulation, kL = kC = kH = 1)."""
    L1, a1, b1 = lab1
    L2, a2, b2 = lab2
    cbar = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(cbar ** 7 / (cbar ** 7 + 25 ** 7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = math.hypot(a1p, b1), math.hypot(a2p, b2)
    h1p = math.degrees(math.atan2(b1, a1p)) % 360 if c1p else 0.0
    h2p = math.degrees(math.atan2(b2, a2p)) % 360 if c2p else 0.0
    dl, dc = L2 - L1, c2p - c1p
    dh = 0.0
    if c1p * c2p:
        dh = h2p - h1p
        dh = dh - 360 if dh > 180 else dh + 360 if dh < -180 else dh
    dH = 2 * math.sqrt(c1p * c2p) * math.sin(math.radians(dh / 2))
    lbar, cbarp = (L1 + L2) / 2, (c1p + c2p) / 2
    if not c1p * c2p:
        hbar = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        hbar = (h1p + h2p) / 2
    else:
        hbar = (h1p + h2p + 360) / 2 if h1p + h2p < 360 else (h1p + h2p - 360) / 2
    t = (1 - 0.17 * math.cos(math.radians(hbar - 30)) + 0.24 * math.cos(math.radians(2 * hbar))
         + 0.32 * math.cos(math.radians(3 * hbar + 6)) - 0.20 * math.cos(math.radians(4 * hbar - 63)))
    rc = 2 * math.sqrt(cbarp ** 7 / (cbarp ** 7 + 25 ** 7))
    sl = 1 + 0.015 * (lbar - 50) ** 2 / math.sqrt(20 + (lbar - 50) ** 2)
    sc, sh = 1 + 0.045 * cbarp, 1 + 0.015 * cbarp * t
    rt = -math.sin(math.radians(60 * math.exp(-(((hbar - 275) / 25) ** 2)))) * rc
    return math.sqrt((dl / sl) ** 2 + (dc / sc) ** 2 + (dH / sh) ** 2 + rt * (dc / sc) * (dH / sh))


_PALETTE_LAB = {name: lab(rgb) for name, rgb in PALETTE.items()}


def _hue(v: tuple[float, float, float]) -> float:
    return math.degrees(math.atan2(v[2], v[1])) % 360


def ranked(v: tuple[float, float, float]) -> list[str]:
    """The palette from nearest to farthest for the CIELAB colour ``v``: first by the rule (hue
    angle for a chromatic colour; lightness for a grey, then the other of white and black), then
    the rest by CIEDE2000."""
    if math.hypot(v[1], v[2]) >= CHROMATIC:
        def apart(name: str) -> float:
            d = abs(_hue(_PALETTE_LAB[name]) - _hue(v))
            return min(d, 360 - d)
        first = [min(("red", "green", "blue", "yellow"), key=apart)]
    else:  # a grey: white or black by lightness, then the other of the two
        first = sorted(("white", "black"), key=lambda name: abs(_PALETTE_LAB[name][0] - v[0]))
    rest = sorted((n for n in COLOURS if n not in first), key=lambda n: ciede2000(v, _PALETTE_LAB[n]))
    return [*first, *rest]


def colour_lab(word: str, shade: str | None = None) -> tuple[float, float, float] | None:
    """The CIELAB value of a colour word (a palette word, a named colour), shade applied."""
    rgb = PALETTE.get(word) or NAMED_COLOURS.get(word)
    if rgb is None:
        return None
    L, a, b = lab(rgb)
    return (min(100.0, max(0.0, L + SHADES.get(shade or "", 0.0))), a, b)


@dataclass(frozen=True)
class Mention:
    """A colour or a shape word of the prompt outside the grammar, and what it is drawn as."""
    start: int
    end: int
    words: str          # as the user wrote it (lower-cased)
    drawn: str          # the palette colour or the kind
    kind: bool          # a shape (else a colour)
    nearer: str = ""    # a nearer colour passed over (already used in the prompt)
    trained: bool = False  # a word the rewriter was trained on: left in the text for it to read

    def note(self) -> str:
        if self.kind:
            what = f"{_article(self.words)} {self.words}"
            return f"{what} is drawn as {_article(self.drawn)} {self.drawn} (the nearest shape this model draws)"
        if self.nearer:
            return (f"{self.words} is drawn as {self.drawn} ({self.nearer}, nearer, is already another colour "
                    f"in this picture)")
        return f"{self.words} is drawn as {self.drawn} (the nearest colour this model draws)"


@dataclass
class Plan:
    """What the mapping makes of a prompt: ``text`` is the prompt with every mention replaced by
    what it is drawn as (the rewriter's input), ``mentions`` the replacements, ``shapes`` the
    kinds the prompt names (in the grammar, trained synonyms, or mapped), ``not_drawable`` the
    things it names that this model cannot draw."""
    text: str
    mentions: list[Mention] = field(default_factory=list)
    shapes: list[str] = field(default_factory=list)
    colours: list[str] = field(default_factory=list)
    not_drawable: list[str] = field(default_factory=list)

    def not_drawable_note(self) -> str:
        things = ", ".join(f'"{w}"' for w in dict.fromkeys(self.not_drawable))
        return (f"this model cannot draw {things}: it draws circles, squares, triangles, stars and hearts in "
                f"{', '.join(COLOURS[:-1])} or {COLOURS[-1]}")


NOTHING_DRAWABLE = ("nothing here is a shape this model draws (circles, squares, triangles, stars and hearts): "
                    "the prompt is drawn as written")


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def plan(prompt: str) -> Plan:
    """Map what the prompt names outside the grammar to its nearest drawable (see the module).
    Words the rewriter was trained on (crimson, pebble, valentine heart) are left for it to read;
    they are noted where its rewrite draws them as their trained meaning."""
    text = prompt.lower()
    words = [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]
    found: list[tuple[int, int, str, str | None, bool]] = []  # start, end, colour, shade word, trained
    shapes: list[tuple[int, int, str, str, bool]] = []         # start, end, word, kind, trained
    things: list[str] = []
    i = 0
    while i < len(words):
        w, s, e = words[i]
        nxt = words[i + 1] if i + 1 < len(words) else None
        pair = f"{w} {nxt[0]}" if nxt else ""
        if pair in ("colour of", "color of"):  # "the colour of the sky": a colour the rewriter reads, not a thing
            i += 2
            for _ in range(3):
                if i < len(words) and words[i][0] not in _CLAUSE_END:
                    i += 1
            continue
        run = next((p for p in TRAINED_SHAPE_PHRASES if tuple(x for x, *_ in words[i:i + len(p)]) == p), None)
        if run:
            shapes.append((s, words[i + len(run) - 1][2], " ".join(run), TRAINED_SHAPE_PHRASES[run], True))
            i += len(run)
            continue
        if nxt and (pair in TRAINED_COLOURS or pair in NAMED_COLOURS):
            found.append((s, nxt[2], pair, None, pair in TRAINED_COLOURS))
            i += 2
            continue
        if nxt and w in SHADES and (nxt[0] in PALETTE or nxt[0] in NAMED_COLOURS or _foreign(nxt[0])):
            found.append((s, nxt[2], _foreign(nxt[0]) or nxt[0], w, False))
            i += 2
            continue
        base = None if w in TRAINED_COLOURS or w in NAMED_COLOURS else _ish(w) or _foreign(w)
        if w in TRAINED_COLOURS or base in TRAINED_COLOURS:
            found.append((s, e, base or w, None, True))
        elif w in NAMED_COLOURS or base:
            found.append((s, e, base or w, None, False))
        elif w in PALETTE:
            found.append((s, e, w, None, False))
        elif w in SHAPE_KINDS or w.rstrip("s") in SHAPE_KINDS:
            shapes.append((s, e, w, w.rstrip("s"), False))
        elif w in TRAINED_KINDS:
            shapes.append((s, e, w, TRAINED_KINDS[w], True))
        elif w in OFF_GRAMMAR_KINDS:
            shapes.append((s, e, w, OFF_GRAMMAR_KINDS[w], False))
        elif w in NOT_DRAWABLE:
            things.append(w)
        i += 1

    # Colours: the palette's own and the trained synonyms are fixed; each other colour takes its
    # nearest not already another colour of the prompt.
    fixed: dict[str, str] = {}
    for _, _, phrase, shade, trained in found:
        if shade is None and (phrase in PALETTE or trained):
            fixed[phrase] = phrase if phrase in PALETTE else TRAINED_COLOURS[phrase]
    used = set(fixed.values())
    mentions: list[Mention] = []
    colours: list[str] = []
    for s, e, phrase, shade, trained in found:
        said = f"{shade} {phrase}" if shade else phrase
        nearer = ""
        if said not in fixed:
            order = ranked(colour_lab(phrase, shade) or (0.0, 0.0, 0.0))
            fixed[said] = next((c for c in order if c not in used), order[0])
            nearer = order[0] if fixed[said] != order[0] else ""
            used.add(fixed[said])
        colours.append(fixed[said])
        if said != fixed[said]:
            mentions.append(Mention(s, e, prompt[s:e].lower(), fixed[said], kind=False, nearer=nearer,
                                    trained=trained))
    for s, e, word, kind, trained in shapes:
        if word != kind and word.rstrip("s") != kind:
            mentions.append(Mention(s, e, word, kind, kind=True, trained=trained))
    mentions.sort(key=lambda m: m.start)
    out, last = "", 0
    for m in mentions:
        if m.trained:  # the rewriter reads it as it was trained to
            continue
        # the article before the replaced word agrees with it ("an orange square" -> "a yellow square")
        out += _ARTICLE.sub(partial(_agree, drawn=m.drawn), prompt[last:m.start]) + m.drawn
        last = m.end
    out += prompt[last:]
    return Plan(out, mentions, [k for *_, k, _ in shapes], colours, things)


def _agree(found: re.Match, drawn: str) -> str:
    """The article ``found`` before a replaced word, made to agree with what replaces it."""
    want = _article(drawn)
    return (want.capitalize() if found.group(1)[:1].isupper() else want) + found.group(2)


def _foreign(word: str) -> str | None:
    """The English name of an off-palette colour word of the rewriter's other languages, if any."""
    if word in FOREIGN_COLOURS:
        return FOREIGN_COLOURS[word]
    for ending in _GERMAN_ENDINGS:
        stem = word[: -len(ending)]
        if word.endswith(ending) and stem in ("grau", "braun", "violett", "türkis", "lila", "rosa", "beig"):
            return FOREIGN_COLOURS.get(stem, "beige")
    return None


def _ish(word: str) -> str | None:
    """The colour of a word ending in -ish or -y (pinkish, reddish, bluish, orangey), if any."""
    for suffix in ("ish", "ey", "y"):
        if word.endswith(suffix) and len(word) > len(suffix) + 2:
            stem = word[: -len(suffix)]
            for cand in (stem, stem[:-1] if stem[-1:] == stem[-2:-1] else stem, stem + "e", stem + "le"):
                if cand in PALETTE or cand in NAMED_COLOURS or cand in TRAINED_COLOURS:
                    return cand
    return None
