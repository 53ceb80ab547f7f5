"""What the demo image classifier is trained, calibrated and evaluated on: the shipped generator's
own outputs, labelled by the prompt that made them.

Every item is a pure function of (split, size, index): a prompt, its labels and a generator seed.
Three splits never share a generator seed, and each has its own list of out-of-vocabulary
("other") prompts, so the evaluation (bench/image_gate_eval.py) sees prompts and seeds that
neither training nor calibration saw.

  train   training/train_classifier.py fits the network on it
  calib   the thresholds in safety/policy.json are chosen on it
  eval    bench/image_gate_eval.py and tests/test_image_gate_eval.py report on it

Shape prompts follow the captions the generator was trained on ("a small red circle on a blue
background"); the out-of-vocabulary prompts are ordinary things people ask an image service for,
none containing a shape word (not even inside another word, e.g. "mustard" holds "star").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from training.shapes_data import COLOUR_NAMES, SHAPES, SIZES

OTHER = "other"
LABELS = [*SHAPES, OTHER]  # the classifier's outputs, in this order
SIZES_MENU = [(64, 64), (96, 64), (64, 96), (96, 96)]  # (width, height), the demo size menu
STEPS = 20
GUIDANCE = 6.0

# Generator seeds: each split owns a disjoint range (size_id * 1e6 + index inside it).
_SEED_BASE = {"train": 10_000_000, "calib": 20_000_000, "eval": 30_000_000}
_SPLIT_SEED = {"train": 7101, "calib": 7202, "eval": 7303}

TRAIN_OOV = [
    "a cat wearing a hat", "a dog running on the beach", "a horse in a field", "a cow eating grass",
    "a sleeping kitten", "a golden retriever puppy", "a parrot on a branch", "an owl at night",
    "a fox in the snow", "a bear fishing in a river", "a penguin on the ice", "an elephant at a waterhole",
    "a giraffe eating leaves", "a lion resting in the savanna", "a tiger in the jungle", "a frog on a lily pad",
    "a butterfly on a flower", "a bee collecting pollen", "a goldfish in a bowl", "a turtle swimming",
    "a rabbit in the garden", "a squirrel holding a nut", "a deer in the forest", "a whale jumping out of the sea",
    "a bowl of ramen", "a slice of pizza", "a cheeseburger with fries", "a cup of coffee", "a stack of pancakes",
    "sushi on a plate", "a bowl of fruit", "a chocolate cake", "fresh bread on a table", "a glass of orange juice",
    "a plate of spaghetti", "a taco with salsa", "a bowl of soup", "grilled vegetables", "an ice cream cone",
    "a basket of apples", "a sandwich on a plate", "scrambled eggs and toast", "a cup of green tea",
    "a sailboat", "a red bicycle", "a vintage car", "a steam train", "an airplane in the sky", "a hot air balloon",
    "a motorcycle on a road", "a yellow school bus", "a fishing boat in a harbour", "a rocket on the launch pad",
    "a tractor in a field", "a submarine under water", "a helicopter over the city", "a skateboard",
    "a mountain landscape", "a lake at sunset", "a forest in autumn", "a desert with dunes", "a waterfall",
    "a snowy village", "rolling green hills", "a tropical beach with palm trees", "a city skyline at night",
    "a field of sunflowers", "a foggy morning in the woods", "a canyon at dusk", "a river through a valley",
    "a lighthouse on a cliff", "a rainy street", "a volcano erupting", "the northern lights over a lake",
    "a wooden chair", "a table lamp", "an old clock", "a pair of shoes", "a red umbrella", "a teapot",
    "a stack of books", "a guitar", "a piano in a room", "a laptop on a desk", "a vase of tulips",
    "a pair of glasses", "a wooden door", "a potted plant", "a candle on a table", "a backpack",
    "a bicycle helmet", "a coffee mug", "a camera on a tripod", "a set of keys", "a wristwatch",
    "a portrait of an old man", "a woman reading a book", "a child flying a kite", "a chef cooking",
    "a man riding a horse", "two friends laughing", "a firefighter", "an astronaut in space",
    "a knight in armour", "a wizard with a staff", "a dancer on a stage", "a farmer in a field",
    "a castle on a hill", "a small cottage", "a modern house", "a bridge over a river", "a windmill",
    "a red barn", "a church in a village", "a skyscraper", "a temple in the mountains", "a market street",
    "a watercolor painting of a garden", "an oil painting of the sea", "a pencil sketch of a tree",
    "a pixel art dragon", "a cartoon robot", "an abstract painting", "a mosaic of tiles",
    "a photo of a busy street", "a black and white photo of a bridge", "a neon sign in the rain",
    "a dragon flying over mountains", "a unicorn in a meadow", "a robot walking a dog", "a treehouse",
    "a snowman in a garden", "a pumpkin on a porch", "a christmas tree", "fireworks over a city",
    "a rainbow after the rain", "clouds over the ocean", "a full moon over the hills", "a sunrise over the sea",
    "a green apple", "a bunch of grapes", "a ripe banana", "a lemon on a table", "a red rose", "a cactus",
    "a mushroom in the forest", "an oak tree", "a bouquet of flowers", "a leaf in autumn",
    "a blue car", "a white horse", "a black cat", "a yellow taxi", "a green frog", "a red dragon",
    "a white cloud", "a black dog on a red background", "a green tree on a white background",
    "a yellow duck on a blue background", "a red boat on a green background", "a white bird on a black background",
]

CALIB_OOV = [
    "a puppy playing with a ball", "a horse jumping a fence", "a koala in a tree", "a flamingo in a lake",
    "a bowl of cereal", "a hot dog with ketchup", "a cup of hot chocolate", "a plate of dumplings",
    "a canoe on a lake", "a red tram", "a cargo ship", "a race car",
    "a meadow with wildflowers", "a glacier", "a misty lake", "a village by the sea",
    "a rocking chair", "a kettle", "a violin", "a typewriter",
    "a grandmother knitting", "a boy playing football", "a pirate ship", "a medieval town",
    "an impressionist painting of a park", "a comic book cover", "a chalk drawing on a sidewalk",
    "a lantern in the dark", "a carousel", "a garden gnome", "a lemon tree", "a snowy mountain peak",
    "a blue whale", "a green parrot", "a white swan on a blue background", "a black horse on a yellow background",
    "a bowl of noodles", "a cottage in the snow", "a jar of honey", "a pair of red boots",
]

EVAL_OOV = [
    "a zebra drinking water", "a hedgehog in the leaves", "a seal on a rock", "a camel in the desert",
    "a hamster eating a seed", "a wolf howling at the moon", "a peacock showing its feathers", "a crab on the sand",
    "a plate of curry and rice", "a croissant", "a bowl of salad", "a glass of lemonade", "a burrito",
    "a strawberry tart", "a pot of stew",
    "a kayak on a river", "a fire truck", "a vintage scooter", "a cable car in the mountains", "a tugboat",
    "a sunset over a wheat field", "a bamboo forest", "a frozen lake", "a coral reef", "a rice terrace",
    "a lavender field", "a desert oasis",
    "an armchair by the window", "a grandfather clock", "a toaster", "a trumpet", "a globe on a desk",
    "a bicycle leaning on a wall", "a sewing machine",
    "a girl with an umbrella", "a fisherman on a pier", "a musician playing a saxophone", "a baker with bread",
    "a lighthouse keeper", "a lighthouse in a storm", "a treehouse in the rain",
    "a tower on a hill", "a stone bridge", "a greenhouse", "a train station",
    "a charcoal sketch of a face", "a stained glass window", "a poster of a jazz concert",
    "a paper boat", "a kite in the wind", "a snow globe", "a sandcastle on the beach",
    "a red apple on a white background", "a blue bird on a yellow background", "a green car",
    "a black umbrella", "a yellow flower", "a white rabbit on a green background",
    "a bowl of oranges", "an old map",
]

_SHAPE_WORDS = ("circle", "square", "triangle", "star", "heart")


def _check(prompts: list[str]) -> None:
    for p in prompts:
        low = p.lower()
        for w in _SHAPE_WORDS:
            if w in low:
                raise ValueError(f"out-of-vocabulary prompt {p!r} contains the shape word {w!r}")


for _list in (TRAIN_OOV, CALIB_OOV, EVAL_OOV):
    _check(_list)
if set(TRAIN_OOV) & set(EVAL_OOV) or set(CALIB_OOV) & set(EVAL_OOV) or set(TRAIN_OOV) & set(CALIB_OOV):
    raise ValueError("the out-of-vocabulary prompt lists must be disjoint")

OOV = {"train": TRAIN_OOV, "calib": CALIB_OOV, "eval": EVAL_OOV}


@dataclass(frozen=True)
class Item:
    prompt: str
    labels: tuple[str, ...]  # shape kinds present, or ("other",)
    seed: int
    group: str  # plain | star | heart | other | two


def shape_caption(rng: np.random.Generator, kinds: list[str]) -> str:
    """A caption in the generator's own grammar for the given kinds (left to right)."""
    bg = COLOUR_NAMES[rng.integers(len(COLOUR_NAMES))]
    fg = [c for c in COLOUR_NAMES if c != bg]
    colours = rng.choice(len(fg), size=len(kinds), replace=False)
    parts = []
    for kind, ci in zip(kinds, colours, strict=True):
        size = SIZES[rng.integers(2)]
        parts.append(f"a {size} {fg[ci]} {kind}" if rng.random() >= 0.3 else f"a {fg[ci]} {kind}")
    return " and ".join(parts) + f" on a {bg} background"


def size_id(width: int, height: int) -> int:
    return SIZES_MENU.index((width, height))


def seed_of(split: str, width: int, height: int, index: int) -> int:
    return _SEED_BASE[split] + size_id(width, height) * 1_000_000 + index


# Training and calibration mix: ~35% out of vocabulary, ~12% two shapes (train only), the rest one
# shape of a uniformly drawn kind.
P_OOV = 0.35
P_TWO = {"train": 0.12, "calib": 0.0}


def mixed_item(split: str, width: int, height: int, index: int) -> Item:
    rng = np.random.default_rng([_SPLIT_SEED[split], size_id(width, height), index])
    seed = seed_of(split, width, height, index)
    r = rng.random()
    if r < P_OOV:
        return Item(OOV[split][rng.integers(len(OOV[split]))], (OTHER,), seed, "other")
    if r < P_OOV + P_TWO[split]:
        kinds = [SHAPES[rng.integers(len(SHAPES))] for _ in range(2)]
        return Item(shape_caption(rng, kinds), tuple(sorted(set(kinds))), seed, "two")
    kind = SHAPES[rng.integers(len(SHAPES))]
    group = kind if kind in ("star", "heart") else "plain"
    return Item(shape_caption(rng, [kind]), (kind,), seed, group)


EVAL_GROUPS = ("plain", "other", "star", "heart")


def eval_item(width: int, height: int, index: int) -> Item:
    """Evaluation items cycle through the four groups (plain cycles circle/square/triangle), so any
    prefix of the index range is balanced."""
    rng = np.random.default_rng([_SPLIT_SEED["eval"], size_id(width, height), index])
    seed = seed_of("eval", width, height, index)
    group = EVAL_GROUPS[index % 4]
    if group == "other":
        return Item(EVAL_OOV[(index // 4) % len(EVAL_OOV)], (OTHER,), seed, "other")
    kind = group if group in ("star", "heart") else ("circle", "square", "triangle")[(index // 4) % 3]
    return Item(shape_caption(rng, [kind]), (kind,), seed, group)


def item(split: str, width: int, height: int, index: int) -> Item:
    return eval_item(width, height, index) if split == "eval" else mixed_item(split, width, height, index)
