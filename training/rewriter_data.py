"""Training and held-out data for the prompt rewriter (issue 30): free-form descriptions of the
shapes domain, each paired with the caption the shipped image model was trained on.

The shipped model knows one grammar (``a small red circle on a blue background``, see
``training/shapes_data.caption_for``). People write "a vermilion pebble against a cerulean sky" or
"un cercle rouge sur fond bleu". A sample here is a scene (one or two shapes, each with a kind, a
colour and maybe a size, on a background), the canonical caption of that scene (the target), and a
free-form rendering of it (the source) drawn from templates and synonyms.

* The training split and the held-out split use **different templates** (other word orders, other
  filler, other sentence frames), so the held-out figure measures phrasings the model never saw.
  Synonyms are shared: a word the tokenizer has never seen cannot be mapped by any model.
* 20% of sources are already canonical (the target is the source: the rewriter leaves such a
  prompt as it is); 12% are out of the domain (no shape the model can draw), whose target is
  ``KEEP``: the serving code then keeps the user's prompt unchanged.
* What the user leaves out, the caption needs: a missing background becomes white (black where a
  shape is white, then blue), a missing shape colour white (black on a white background); a scene whose
  colours collide (a red star on red) is not generated.

Every sample is a pure function of ``(split, seed, index)``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu_tasks.rewriter import KEEP
from training.shapes_data import COLOUR_NAMES, SHAPES, SIZES

COLOUR_WORDS = {
    "red": ["red", "scarlet", "crimson", "vermilion", "ruby", "cherry", "tomato"],
    "green": ["green", "emerald", "lime", "grass green", "jade", "leafy green", "olive"],
    "blue": ["blue", "azure", "cerulean", "navy", "cobalt", "sapphire", "sky blue", "ultramarine"],
    "yellow": ["yellow", "golden", "gold", "lemon", "amber", "canary", "mustard"],
    "white": ["white", "snowy", "ivory", "pale", "milky", "snow white", "cream"],
    "black": ["black", "jet black", "ebony", "charcoal", "coal black", "pitch black", "inky"],
}
# "the colour of X" phrasings
COLOUR_OF = {
    "red": ["blood", "a fire truck", "cherries"], "green": ["grass", "leaves", "a frog"],
    "blue": ["the sky", "the sea", "sapphires"], "yellow": ["the sun", "lemons", "butter"],
    "white": ["snow", "milk", "clouds"], "black": ["night", "coal", "ink"],
}
BACKGROUND_WORDS = {
    "blue": ["sky", "ocean", "sea"], "black": ["night sky", "darkness", "void"],
    "green": ["lawn", "meadow", "field"], "white": ["snowfield", "blank page", "paper"],
    "yellow": ["desert", "sand"], "red": ["wall of red", "red carpet"],
}
SHAPE_WORDS = {
    "circle": ["circle", "disc", "disk", "ball", "dot", "round shape", "orb", "pebble", "sphere", "coin"],
    "square": ["square", "box", "block", "tile", "cube", "rectangle with equal sides"],
    "triangle": ["triangle", "wedge", "pyramid", "three-sided shape", "arrowhead"],
    "star": ["star", "five-pointed star", "pentagram", "starfish shape", "star shape"],
    "heart": ["heart", "love heart", "valentine heart", "heart shape"],
}
SIZE_WORDS = {
    "small": ["small", "little", "tiny", "miniature", "petite"],
    "large": ["large", "big", "huge", "giant", "enormous", "massive"],
}

# other languages: (word tables, templates); the adjective order is the language's own
LANG = {
    "fr": dict(
        shape={"circle": ("cercle", "m"), "square": ("carré", "m"), "triangle": ("triangle", "m"),
               "star": ("étoile", "f"), "heart": ("cœur", "m")},
        colour={"red": ("rouge", "rouge"), "green": ("vert", "verte"), "blue": ("bleu", "bleue"),
                "yellow": ("jaune", "jaune"), "white": ("blanc", "blanche"), "black": ("noir", "noire")},
        size={"small": ("petit", "petite"), "large": ("grand", "grande")},
        art=("un", "une"), bg="sur fond {bg}", bg_alt="sur un fond {bg}", join="et"),
    "es": dict(
        shape={"circle": ("círculo", "m"), "square": ("cuadrado", "m"), "triangle": ("triángulo", "m"),
               "star": ("estrella", "f"), "heart": ("corazón", "m")},
        colour={"red": ("rojo", "roja"), "green": ("verde", "verde"), "blue": ("azul", "azul"),
                "yellow": ("amarillo", "amarilla"), "white": ("blanco", "blanca"), "black": ("negro", "negra")},
        size={"small": ("pequeño", "pequeña"), "large": ("grande", "grande")},
        art=("un", "una"), bg="sobre fondo {bg}", bg_alt="en un fondo {bg}", join="y"),
    "de": dict(
        shape={"circle": ("kreis", "m"), "square": ("quadrat", "n"), "triangle": ("dreieck", "n"),
               "star": ("stern", "m"), "heart": ("herz", "n")},
        colour={"red": ("roter", "rotes", "rot", "rotem"), "green": ("grüner", "grünes", "grün", "grünem"),
                "blue": ("blauer", "blaues", "blau", "blauem"), "yellow": ("gelber", "gelbes", "gelb", "gelbem"),
                "white": ("weißer", "weißes", "weiß", "weißem"), "black": ("schwarzer", "schwarzes", "schwarz", "schwarzem")},
        size={"small": ("kleiner", "kleines"), "large": ("großer", "großes")},
        art=("ein", "ein"), bg="auf {bg} hintergrund", bg_alt="vor {bg} hintergrund", join="und"),
}

OUT_OF_DOMAIN = [
    "a cat sleeping on a sofa", "portrait of an old man, oil painting", "a city skyline at dusk",
    "a bowl of ramen", "mountains reflected in a lake", "a robot playing chess", "a dog in the rain",
    "a bicycle leaning on a wall", "a cup of coffee on a wooden table", "sunflowers in a vase",
    "a castle on a hill", "an astronaut riding a horse", "a forest path in autumn", "a lighthouse",
    "un chat sur un canapé", "ein hund im regen", "una taza de café", "hello", "test", "asdf",
    "make it pretty", "something cool", "surprise me", "a car", "an owl at night", "a sailing boat",
]

# templates: {shapes} is the rendered shape list, {bg} the background phrase
TRAIN_TEMPLATES = [
    "{shapes} on a {bg} background", "{shapes} against a {bg} background", "{shapes} on {bg}",
    "{shapes} over a {bg} backdrop", "a picture of {shapes} on a {bg} background",
    "draw {shapes} on a {bg} background", "{shapes}, {bg} background", "{bg} background with {shapes}",
    "an image of {shapes} against {bg}", "please draw {shapes} on a {bg} background",
    "{shapes} in front of a {bg} wall", "{shapes} set against a {bg} background, high quality",
    "{shapes} on a {bg} canvas", "simple drawing: {shapes}, {bg} background",
    "{shapes} against the {bgword}", "{shapes} floating in a {bgword}",
    "{shapes} resting on a {bg} floor", "{shapes} lying on a {bg} table", "{shapes} over {bg}",
    "{shapes} with {bg} behind it", "{shapes}. background: {bg}", "{shapes}; the background is {bg}",
    "{bg} canvas, {shapes}", "{bg} wallpaper showing {shapes}", "a {bg} poster of {shapes}",
    "{shapes} drawn on {bg} paper", "{shapes} in the {bgword}", "{shapes} beneath the {bgword}",
    "make {shapes} with a {bg} background", "generate {shapes} on a {bg} backdrop, sharp",
    "{shapes} and a {bg} background", "{shapes} in the centre of a {bg} square canvas",
    "illustration of {shapes} over a {bg} ground", "{shapes}, flat {bg} background, vector art",
    "a photo of {shapes} on a {bg} sheet", "{bg}: {shapes}", "{shapes} - {bg} bg",
]
HELDOUT_TEMPLATES = [
    "i would like {shapes} on a {bg} background", "show me {shapes} placed on {bg}",
    "{bg} backdrop, {shapes} in the middle", "{shapes} sitting on a {bg} surface",
    "render {shapes} with a {bg} background please", "on a {bg} background, {shapes}",
    "{shapes} atop a {bg} field, minimalist", "can you make {shapes}? background {bg}",
    "{shapes} under a {bgword}", "a {bg} scene with {shapes}",
]
ORDER_TRAIN = ["{size} {colour} {shape}", "{colour} {shape}", "{size} {shape} in {colour}",
               "{shape} coloured {colour}", "{colour} {size} {shape}", "{shape} that is {colour}",
               "{shape} in a {colour} shade", "{colour} tinted {shape}", "{shape} ({colour})",
               "{shape} with a {colour} colour", "{colour} {shape} of {size} size", "{shape} in bright {colour}"]
ORDER_HELDOUT = ["{size} {shape}, {colour}", "{shape} of {colour} colour", "{colour}-coloured {size} {shape}",
                 "{shape} painted {colour}"]

# Training frames composed of parts (rewriter-v2): a prefix, the shapes and the background in
# either order, joined by a preposition and a background noun, then a suffix. They widen the word
# orders the model sees (a background named first; a colour after its shape, past a separator)
# without using the held-out split's templates or its words ("atop", "scene", "placed", "painted").
PREFIXES = ["", "", "", "a picture of ", "draw ", "please draw ", "an image of ", "make ", "generate ",
            "illustration of ", "a photo of ", "paint ", "create ", "a sketch of ", "i want ", "give me ",
            "a drawing of ", "picture: ", "we need ", "could you draw ", "just ", "try "]
SUFFIXES = ["", "", "", ", high quality", ", sharp", ", vector art", ", simple", " please", ", flat colours",
            ", centred", ", clean lines", ", 2d", " in flat style", ", thanks", ", no text", "!"]
PREPS = ["on", "against", "over", "upon", "across", "in front of", "before", "above", "onto", "set against",
         "resting on", "lying on", "floating over", "drawn on", "standing on", "hovering over", "centred on"]
BG_NOUNS = ["background", "background", "backdrop", "canvas", "wall", "floor", "table", "ground", "sheet",
            "paper", "board", "page", "panel", "plane", "setting", "base", "frame"]
LEAD_NOUNS = ["background", "backdrop", "canvas", "wallpaper", "poster", "image", "picture", "world", "room",
              "page", "frame", "setting"]
FRAMES_AFTER = ["{shapes} {prep} a {bg} {noun}", "{shapes} {prep} {bg}", "{shapes}, {bg} {noun}",
                "{shapes} with a {bg} {noun}", "{shapes}; {noun}: {bg}", "{shapes} {prep} the {bgword}",
                "{shapes} - {noun} {bg}", "{shapes}, and the {noun} is {bg}"]
FRAMES_BEFORE = ["{bg} {lead} with {shapes}", "a {bg} {lead} showing {shapes}", "{bg} {lead}, {shapes}",
                 "{bg} {lead}: {shapes}", "with a {bg} {noun}: {shapes}", "against a {bg} {noun}, {shapes}",
                 "over a {bg} {noun} - {shapes}", "a {bg} {lead} and {shapes} on it", "{bg} {lead}; {shapes} in front",
                 "a {bg} {lead} containing {shapes}", "{noun} {bg}, {shapes}", "the {bgword}, and {shapes}"]
ORDER_TRAIN += ["{shape} - {colour}", "{shape}; {colour}", "{shape} in {colour}", "{shape} of a {colour} hue",
                "{colour} hued {shape}", "{shape} which is {colour}", "{shape} dyed {colour}",
                "{shape} filled with {colour}", "{size} {shape} - {colour}", "{shape} in the colour {colour}",
                "{colour} toned {size} {shape}", "{shape}: {colour}",
                # a colour past a comma that still belongs to its shape
                "{shape}, in {colour}", "{shape}, coloured {colour}", "{shape}, that is {colour}",
                "{size} {shape}, in {colour}"]
_BG_WORDS_ALL = [w for ws in BACKGROUND_WORDS.values() for w in ws if " " not in w]
JOIN_TRAIN = [" and ", " next to ", " beside ", ", ", " alongside ", " and also ", " as well as ", " & ",
              " near ", " and then "]
JOIN_HELDOUT = [" plus ", " together with "]

# A second held-out split (heldout2), written once before rewriter-v2 was trained and never used to
# choose its training frames: other templates, orders, joiners and prefixes again.
HELDOUT2_TEMPLATES = ["picture {shapes}, with {bg} all around", "{shapes} positioned over a {bg} plain",
                      "my idea: {shapes} and behind it {bg}", "{shapes} drawn against {bg} colour",
                      "could i get {shapes} over a {bg} base", "{bg} surroundings, {shapes}",
                      "{shapes} in the middle of a {bg} expanse", "i need {shapes} upon a {bg} layer"]
ORDER_HELDOUT2 = ["{shape} done in {colour}", "{colour}-ish {size} {shape}", "{shape} whose colour is {colour}",
                  "{size} {shape} tinted {colour}"]
JOIN_HELDOUT2 = [" accompanied by ", " along with "]


@dataclass(frozen=True)
class Shape:
    kind: str
    colour: str | None      # None: the user did not say
    size: str | None


@dataclass(frozen=True)
class Sample:
    source: str
    target: str
    lang: str


def canonical(shapes: list[Shape], background: str | None) -> str:
    """The caption the image model was trained on, filling in what the user left out."""
    colours = [s.colour for s in shapes if s.colour]
    bg = background or next(c for c in ("white", "black", "blue", "green") if c not in colours)
    parts = []
    used = set(colours)
    for s in shapes:
        colour = s.colour or next(c for c in ("white", "black", "red", "blue") if c != bg and c not in used)
        used.add(colour)
        parts.append(f"a {s.size} {colour} {s.kind}" if s.size else f"a {colour} {s.kind}")
    return " and ".join(parts) + f" on a {bg} background"


def _pick(rng: np.random.Generator, xs):
    return xs[int(rng.integers(len(xs)))]


def _scene(rng: np.random.Generator) -> tuple[list[Shape], str | None]:
    n = 2 if rng.random() < 0.25 else 1
    bg = _pick(rng, COLOUR_NAMES) if rng.random() < 0.9 else None
    free = [c for c in COLOUR_NAMES if c != bg]
    cols = list(rng.choice(free, size=n, replace=False))
    shapes = []
    for i in range(n):
        colour = str(cols[i]) if rng.random() < 0.93 else None
        size = _pick(rng, SIZES) if rng.random() < 0.6 else None
        shapes.append(Shape(_pick(rng, SHAPES), colour, size))
    if bg is None and any(s.colour is None for s in shapes):
        spare = [c for c in COLOUR_NAMES if c not in cols]
        shapes = [Shape(s.kind, s.colour or spare[i], s.size) for i, s in enumerate(shapes)]
    return shapes, bg


def _colour_phrase(rng, colour: str) -> str:
    if rng.random() < 0.1:
        return "the colour of " + _pick(rng, COLOUR_OF[colour])
    return _pick(rng, COLOUR_WORDS[colour])


def _english(rng, shapes: list[Shape], bg: str | None, split: str) -> str:
    orders = {"train": ORDER_TRAIN, "heldout": ORDER_HELDOUT, "heldout2": ORDER_HELDOUT2}[split]
    rendered = []
    for s in shapes:
        shape = _pick(rng, SHAPE_WORDS[s.kind])
        if s.colour is None:
            phrase = (f"{_pick(rng, SIZE_WORDS[s.size])} {shape}" if s.size else shape)
        else:
            order = _pick(rng, orders)
            if s.size is None:
                order = order.replace(" of {size} size", "").replace("{size} ", "").replace(" {size}", "")
            elif "{size}" not in order:
                order = "{size} " + order
            colour_after = order.endswith("{colour}")    # where "the colour of snow" reads as English
            colour = _colour_phrase(rng, s.colour) if colour_after else _pick(rng, COLOUR_WORDS[s.colour])
            phrase = order.format(size=_pick(rng, SIZE_WORDS[s.size]) if s.size else "", colour=colour, shape=shape)
        art = "an" if phrase[0] in "aeiou" else "a"
        rendered.append(f"{art} {phrase}")
    joiner = _pick(rng, {"train": JOIN_TRAIN, "heldout": JOIN_HELDOUT, "heldout2": JOIN_HELDOUT2}[split])
    shapes_text = joiner.join(rendered)
    if bg is None:
        lead = ["draw ", "a picture of ", "show me "] if split != "heldout2" else ["picture ", "i need "]
        return shapes_text if rng.random() < 0.5 else _pick(rng, lead) + shapes_text
    if split == "train" and rng.random() < 0.6:
        t = _pick(rng, PREFIXES) + _pick(rng, FRAMES_BEFORE if rng.random() < 0.4 else FRAMES_AFTER) + _pick(rng, SUFFIXES)
    else:
        templates = {"train": TRAIN_TEMPLATES, "heldout": HELDOUT_TEMPLATES, "heldout2": HELDOUT2_TEMPLATES}[split]
        t = _pick(rng, templates)
    bgword = _pick(rng, BACKGROUND_WORDS.get(bg, [bg])) if "{bgword}" in t else ""
    # A colour named before a noun decides the background even where the noun alone names
    # another colour ("a red meadow" is red; "the meadow" alone is green).
    noun = _pick(rng, BG_NOUNS) if rng.random() < 0.8 else _pick(rng, _BG_WORDS_ALL)
    return t.format(shapes=shapes_text, bg=_pick(rng, COLOUR_WORDS[bg]), bgword=bgword, prep=_pick(rng, PREPS),
                    noun=noun, lead=_pick(rng, LEAD_NOUNS))


def _foreign(rng, lang: str, shapes: list[Shape], bg: str | None, heldout: bool) -> str:
    L = LANG[lang]
    parts = []
    for s in shapes:
        word, gender = L["shape"][s.kind]
        colour = s.colour or "white"
        if lang == "de":
            g = 0 if gender == "m" else 1
            col = L["colour"][colour][g]
            adj = f"{L['size'][s.size][g]} {col}" if s.size else col
            parts.append(f"{L['art'][0]} {adj} {word}")
        else:
            g = 0 if gender == "m" else 1
            col = L["colour"][colour][g]
            if s.size:
                size = L["size"][s.size][g]
                parts.append(f"{L['art'][g]} {size} {word} {col}" if lang == "fr" or heldout else f"{L['art'][g]} {word} {col} {size}")
            else:
                parts.append(f"{L['art'][g]} {word} {col}")
    text = f" {L['join']} ".join(parts)
    if bg is not None:
        bgcol = L["colour"][bg][3] if lang == "de" else L["colour"][bg][0]
        text += " " + (L["bg_alt"] if heldout else L["bg"]).format(bg=bgcol)
    return text


def sample(split: str, seed: int, index: int) -> Sample:
    """Sample ``index`` of ``split`` ("train", "heldout" or "heldout2")."""
    heldout = split != "train"
    rng = np.random.default_rng([seed, index, {"train": 0, "heldout": 1, "heldout2": 2}[split]])
    u = rng.random()
    if u < 0.12:
        text = _pick(rng, OUT_OF_DOMAIN)
        if rng.random() < 0.3:
            text = text + _pick(rng, [", 4k", ", trending", " in watercolour", ", detailed"])
        return Sample(text, KEEP, "ood")
    shapes, bg = _scene(rng)
    target = canonical(shapes, bg)
    if u < 0.32:
        full = [Shape(s.kind, s.colour or "white", s.size) for s in shapes]
        bg2 = bg or "black"
        if any(s.colour == bg2 for s in full) or len({s.colour for s in full}) < len(full):
            return Sample(target, target, "canonical")
        text = canonical(full, bg2)
        return Sample(text, text, "canonical")
    if u < 0.44:
        lang = _pick(rng, list(LANG))
        if any(s.colour is None for s in shapes) or bg is None:
            shapes = [Shape(s.kind, s.colour or "white", s.size) for s in shapes]
            bg = bg if bg is not None else "black"
            if any(s.colour == bg for s in shapes) or len({s.colour for s in shapes}) < len(shapes):
                return Sample(target, target, "canonical")
            target = canonical(shapes, bg)
        return Sample(_foreign(rng, lang, shapes, bg, heldout), target, lang)
    return Sample(_english(rng, shapes, bg, split), target, "en")


def samples(split: str, seed: int, n: int) -> list[Sample]:
    return [sample(split, seed, i) for i in range(n)]
