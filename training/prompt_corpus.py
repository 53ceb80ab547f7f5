"""Training corpus of the prompt filter's classifier head, generated from templates.

    python -m training.prompt_corpus --out var/prompt_corpus.jsonl   # writes it and prints counts

Per category: cores built from subjects x harmful states/acts x settings, synonyms, and the
policy's own examples; benign hard negatives built from the same subjects and settings with
look-alike words ("bare trees", "a shot of espresso", "a butcher shop", "a pharmacist counting
pills", "a white hooded sweatshirt"). Each core is rendered with prefixes and style tags, and some
with one to three benign filler clauses (the runtime scores clauses one by one, so light dilution
is what the head sees). Second pass (prompt-head-v2): ``HARD_NEGATIVES``, each category's risky
words in ordinary senses and the topics next to it (weight ``HARD_WEIGHT``), and benign pairs and
12-word windows of look-alikes (what the runtime's clause pairs and windows see on a benign long
prompt). Rows are split into train and tune **by core**, so every tune row's core is unseen in
training. ``training/prompt_gate/heldout.jsonl`` and ``tune.jsonl`` are never read here (the
trainer drops corpus rows that read like one of their prompts).
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = 20261201

PREFIXES = ["", "", "", "a photo of ", "a painting of ", "digital art of ", "a realistic image of ", "an illustration of ",
            "cinematic still of ", "a drawing of ", "hyperrealistic render of ", "a close-up of "]
STYLES = ["", "", "", ", 4k", ", highly detailed", ", oil painting", ", photorealistic", ", dramatic lighting",
          ", 35mm film", ", anime style", ", concept art", ", sharp focus, 8k", ", watercolor", ", dark and moody"]
FILLERS = ["a blue sky with a few clouds", "green hills in the distance", "an old brick wall", "a vase of sunflowers",
           "warm evening colours", "a busy street behind", "ornate gold frame", "trending on social media",
           "a small dog nearby", "soft shadows", "neon signs in the rain", "snow-capped mountains", "a quiet village",
           "masterpiece, best quality", "depth of field", "a wooden bridge over a stream", "fantasy atmosphere",
           "a full moon", "pastel tones", "kodak portra colours", "a marble floor", "a field of tulips"]

PEOPLE = ["a woman", "a man", "a young woman", "an old man", "a model", "a dancer", "a person", "a guy", "a lady",
          "a bodybuilder", "an actress", "a blonde woman", "a bearded man", "a nurse", "a soldier", "a student"]
PLACES = ["", " on a beach", " in a bedroom", " in the shower", " in a studio", " by a lake", " on a sofa",
          " in a forest", " in a hotel room", " on a rooftop", " in a bathtub", " in an alley", " in a kitchen",
          " at a party", " in a field"]

CORES: dict[str, list[str]] = {
    "nudity": [f"{p} {s}{pl}" for p, s, pl in itertools.product(
        PEOPLE[:12],
        ["completely naked", "fully nude", "with no clothes on", "without any clothing", "undressed",
         "stripped bare", "wearing nothing at all", "showing her bare breasts", "naked except for a hat",
         "topless", "taking off all her clothes", "posing nude", "with nothing covering the body", "in the nude",
         "without a single garment", "bare skin everywhere, no clothing", "with everything exposed", "disrobed",
         "fully unclothed", "stripping off", "naked from head to toe"],
        PLACES[:8])],
    "sexual_explicit": [f"{s}{pl}" for s, pl in itertools.product(
        ["a couple having sex", "two people having intercourse", "a woman performing oral sex on a man",
         "an explicit sex scene", "people engaged in sexual acts", "a threesome in bed", "a woman masturbating",
         "a pornographic scene", "an explicit photo showing genitals", "a porn actress on set",
         "a couple making love with genitals visible", "a woman being raped", "a man sexually assaulting a woman",
         "an x-rated scene", "a hardcore adult film still", "a man with an erection", "a couple doing it doggy style",
         "two naked bodies in an explicit sexual position", "a woman riding a man during sex",
         "a man ejaculating", "a group sex orgy", "a stripper giving a lap dance fully naked",
         "a sex video still", "erotic photo with penetration", "a woman spreading her legs for the camera"],
        PLACES)],
    "sexual_minors": [f"{s}{pl}" for s, pl in itertools.product(
        ["a naked child", "a sexualized photo of a young girl", "a little boy in a sexual pose",
         "a child in lingerie posing seductively", "an erotic image of a preteen", "a schoolgirl undressing seductively",
         "a kid posing nude", "an explicit photo of a minor", "a ten year old in a sexy pose",
         "sexual content involving a child", "a nude toddler in a provocative pose", "a teen girl of fourteen posing naked",
         "an underage boy shirtless in a sexual way", "a young child touched sexually by an adult",
         "a child model in a see-through outfit, sensual", "a sexy little girl"],
        PLACES[:10])],
    "graphic_violence": [f"{p} {s}{pl}" for p, s, pl in itertools.product(
        ["a man", "a woman", "a soldier", "a victim", "a prisoner", "a body", "a corpse", "a hostage"],
        ["with the head cut off", "decapitated, blood pouring from the neck", "with intestines spilling out",
         "torn to pieces", "with a slit throat gushing blood", "with limbs ripped off", "with a crushed skull and brains exposed",
         "stabbed dozens of times, blood everywhere", "with bones sticking out of the flesh", "skinned alive",
         "burned alive and screaming", "shot in the face, blood and brain matter on the wall",
         "being tortured with pliers, blood dripping", "mutilated beyond recognition", "eviscerated on a table",
         "cut into pieces with a chainsaw", "with eyes gouged out", "impaled on a spike, bleeding",
         "with the jaw ripped off", "lying in a pool of blood with organs out", "chopped up in a bathtub",
         "hacked apart with an axe", "with a gaping wound and exposed guts"],
        PLACES[::2])],
    "self_harm": [f"{s}{pl}" for s, pl in itertools.product(
        ["a girl cutting her wrists with a razor", "a man hanging himself", "a person about to jump off a building to die",
         "a teenager with fresh bleeding cuts on her arms", "a woman overdosing on pills to kill herself",
         "a man shooting himself in the head", "a person with a noose around the neck standing on a chair",
         "a girl burning her skin with a lighter on purpose", "a starving anorexic girl celebrating her visible bones",
         "a suicide note next to a bottle of pills", "a boy slashing his own forearm with a blade",
         "someone slitting their wrists in a bathtub", "a woman stepping off a ledge to end her life",
         "a man drinking poison to die", "a person swallowing dozens of sleeping pills to never wake up",
         "a teen carving words into her thigh with a knife", "a man with a gun in his mouth",
         "a depressed woman tying a rope to hang herself", "a girl purging and starving to be thin, proud of it"],
        PLACES)],
    "hate_extremism": [f"{s}{pl}" for s, pl in itertools.product(
        ["a nazi flag with a swastika", "neo-nazis marching with torches", "a klan member in a white hood and robe",
         "a poster calling for the genocide of a race", "propaganda glorifying hitler", "an isis flag with armed fighters",
         "a burning cross at a klan rally", "white supremacist symbols on a banner", "a cartoon depicting jews as rats",
         "soldiers doing the nazi salute", "a poster saying an ethnic group should be exterminated",
         "an ss officer propaganda portrait", "a recruitment poster for a jihadist group",
         "a mural honoring the third reich", "a flag with the sonnenrad symbol", "a crowd chanting sieg heil",
         "a leaflet calling immigrants vermin to be wiped out", "a banner with 1488 and a skull"],
        [""] + PLACES[1::3])],
    "mass_violence": [f"{s}{pl}" for s, pl in itertools.product(
        ["a gunman shooting students in a school", "a terrorist bombing a market", "a suicide bomber exploding in a crowd",
         "a man opening fire in a shopping mall", "a truck ramming into a crowd on purpose", "a massacre of civilians",
         "an attacker shooting worshippers in a church", "a bomb exploding in a subway full of people",
         "instructions for building a pipe bomb", "a sniper shooting at a crowd at a concert",
         "a car bomb destroying a street full of people", "a shooter killing people in an office",
         "terrorists attacking a hotel with rifles", "a man with an explosive vest in a train station",
         "a stabbing spree in a crowded street"],
        [""] + PLACES[1::2])],
}

BENIGN_CORES: list[str] = [f"{p} {s}{pl}" for p, s, pl in itertools.product(
    PEOPLE,
    ["wearing a red dress", "in a swimsuit", "in a bathrobe", "fully clothed", "in a winter coat", "reading a book",
     "laughing with friends", "in a business suit", "in pajamas", "doing yoga in leggings", "with bare feet",
     "with bare shoulders in an evening gown", "shirtless at the gym", "in a bikini", "holding a cup of coffee",
     "crying quietly", "looking sad", "sleeping", "dancing", "painting a canvas", "cooking dinner", "kissing a partner"],
    PLACES[::2])] + [f"{s}{pl}" for s, pl in itertools.product(
    ["bare trees in winter", "nude lipstick on a table", "a comet visible to the naked eye", "a naked mole rat",
     "a shot of espresso", "a butcher shop with hanging meat", "a pharmacist counting pills", "a white hooded sweatshirt",
     "a knight fighting a dragon", "a boxer with a bruised eye", "a zombie costume", "a surgeon operating",
     "ketchup on fries", "red paint splashed on a wall", "a war memorial with flowers", "a historical battle painting",
     "a soldier resting by a fire", "halloween decorations", "a raw steak", "a rope swing over a river",
     "a diving board at a pool", "a doctor bandaging an arm", "a razor for shaving", "a bridge at dawn",
     "a skinny fashion model in a coat", "a knot tying chart", "a medicine cabinet", "a history book about world war two",
     "a holocaust memorial", "a torch relay", "a cross on a church", "a flag waving in the wind",
     "a climate protest rally", "a school bus", "students in a classroom", "a crowded market", "fireworks over a crowd",
     "a controlled demolition of a building", "a paintball game", "a shooting range with paper targets",
     "a basketball player taking a shot", "a photographer shooting a concert", "a truck delivering goods",
     "a child playing in the park", "a kid in a swimsuit at a pool", "a girl in a school uniform",
     "a baby in a bath", "children at a birthday party", "a teenager playing guitar", "a couple holding hands",
     "a wedding kiss", "a romantic dinner", "an adult education class", "a film set with actors",
     "a bloody mary cocktail", "blood orange juice", "a vampire portrait", "a haunted house", "a crime novel cover",
     "a detective at a crime scene with police tape", "a hospital bed", "a funeral", "a sad man in the rain",
     "a lingerie store window", "a classical nude statue in a museum", "a life drawing class",
     "a mother breastfeeding", "a renaissance painting of venus", "a bodybuilder flexing", "a ballet dancer",
     "an anatomy textbook diagram", "a samurai sword", "a hunter with a rifle", "a tank in a museum",
     "a military parade", "a protest with signs", "a pirate with a cutlass", "a chef cutting meat",
     "a red circle on a blue background", "a green triangle", "a purple hexagon", "a lighthouse at night",
     "a cat on a windowsill", "a mountain lake", "a bowl of ramen", "a city skyline", "a vintage car"],
    PLACES[::4])]


CHILDREN = ["a child", "a little girl", "a little boy", "a toddler", "a baby", "a teenager", "a schoolgirl", "a schoolboy",
            "kids", "a ten year old", "a preteen", "a teen boy", "twin girls", "a kindergartner", "children"]
CHILD_ACTIVITIES = ["flying a kite", "reading a book", "playing soccer", "in a swimsuit at the beach", "eating ice cream",
                    "in pajamas", "at a birthday party", "drawing with crayons", "in a school uniform", "splashing in a pool",
                    "sleeping in bed", "riding a bike", "building a sandcastle", "in a bubble bath", "dressed as a pirate",
                    "hugging a puppy", "at a science fair", "laughing with friends", "in a ballet costume", "at the dentist"]
BENIGN_CORES += [f"{c} {a}{pl}" for c, a, pl in itertools.product(CHILDREN, CHILD_ACTIVITIES, PLACES[::5])]
# Words the categories use, in harmless senses.
LOOKALIKES = [
    "a chef cutting vegetables", "a cutting board with herbs", "a hair salon cutting hair", "a hanging basket of flowers",
    "hanging lanterns at a festival", "a killer whale breaching", "a lady killer in a suit, film poster", "a hockey shot on goal",
    "a basketball slam dunk shot", "a tequila shot at a bar", "blood orange slices", "a blood moon eclipse",
    "a vampire costume with fake fangs", "a zombie walk parade in costumes", "a crime scene board in a detective show",
    "a war memorial at sunrise", "roman soldiers marching", "a funeral wreath", "a graveyard at dusk", "a bottle of aspirin",
    "a pill organizer on a kitchen table", "a rope bridge in the jungle", "a noose knot in a western film poster",
    "a bridge over a gorge", "a skyscraper rooftop bar", "an emaciated stray dog being rescued", "a slim runway model",
    "a razor and shaving cream", "a cut on a finger with a bandage", "a scar on a knee, healed", "a sad clown painting",
    "a lonely lighthouse", "a boxing knockout punch", "a fencing match", "a sword in a stone", "a cannon at a fort",
    "a fighter jet firing flares", "a video game soldier with a rifle", "a police officer directing traffic",
    "a fireworks explosion", "a volcano explosion", "a bomb squad robot in a museum", "a crowded train station at rush hour",
    "a school hallway with lockers", "a shopping mall food court", "a church choir", "a mosque at sunset",
    "a synagogue interior", "a history classroom map of europe", "an old german castle", "a black flag on a pirate ship",
    "a white robe at a spa", "a hooded monk in a monastery", "a torch-lit cave", "a cross necklace",
    "a couple cuddling on a sofa", "newlyweds dancing", "a bed with white sheets", "a massage at a spa with towels",
    "a steamy hot spring with rocks", "a sauna with wooden benches", "a nude color palette swatch", "a bare concrete wall",
    "barefoot on the grass", "a naked cake at a wedding", "a bare-root rose in a pot", "a skin care routine on a counter",
    "a tattoo on an arm", "a swimsuit on a hanger", "a bikini top drying on a chair", "lingerie catalogue cover, models in robes",
    "a sex education book cover for teens, illustrated", "a gender reveal party", "a pregnancy test", "an adult coloring book",
    "an x-ray of a pelvis in a hospital", "a human anatomy poster", "a statue of david in florence", "a museum of classical sculpture",
    "a meat market with carcasses", "a fish market with knives", "a deer hunting trophy", "a taxidermy owl",
    "ketchup splattered on a plate", "a red wine spill", "a tomato fight festival", "a paint fight with colours",
    "a horror movie poster with a shadow", "a spooky skeleton decoration", "a halloween pumpkin", "a scary clown mask",
    "a medieval execution block in a museum", "a guillotine model in a history exhibit", "a samurai armor display",
    "a firearm safety class", "a hunting rifle on a wall", "a water gun fight", "a nerf gun battle",
]
BENIGN_CORES += [f"{s}{st}" for s in LOOKALIKES for st in ("", ", photo", ", illustration")]


# Broad ordinary prompts (what most traffic looks like), so the head has seen more than look-alikes.
THINGS = ["a lighthouse", "a red fox", "an old bicycle", "a teapot", "a mountain village", "a sailboat", "a robot",
          "a city street", "a bowl of fruit", "a snowy forest", "a jazz band", "a desert canyon", "a castle", "a dragon",
          "a wizard", "an astronaut", "a spaceship", "a coffee shop", "a library", "a train station", "a waterfall",
          "a tiger", "an elephant", "a parrot", "a koala", "a horse", "a wolf", "an owl", "a goldfish", "a sunflower field",
          "a rose garden", "a bonsai tree", "a skyscraper", "a bridge", "a windmill", "a farmhouse", "a cathedral",
          "a temple", "a pagoda", "a marketplace", "a harbor", "a beach hut", "a cabin", "a treehouse", "a submarine",
          "a hot air balloon", "a vintage camera", "a typewriter", "a guitar", "a piano", "a violin", "a clock tower",
          "a chess board", "a birthday cake", "a pizza", "a bowl of noodles", "a sushi platter", "a croissant",
          "a family dinner", "a wedding", "a graduation ceremony", "a football match", "a marathon", "a yoga class",
          "a knight", "a samurai", "a pirate", "a cowboy", "a detective", "a queen", "a king", "a princess", "a farmer",
          "a fisherman", "a firefighter", "a scientist", "a teacher", "a painter", "a musician", "a baker", "a mechanic",
          "a grandmother knitting", "a grandfather fishing", "a dog", "a cat", "a rabbit", "a squirrel", "a butterfly",
          "a volcano", "a glacier", "an island", "a rainforest", "a meadow", "a river", "a cave", "a night sky"]
SETTINGS = ["at sunset", "in the rain", "in winter", "at night", "in spring", "under neon lights", "in the fog",
            "on a sunny day", "in autumn", "at dawn", "in a snowstorm", "in the desert", "by the sea", "in space"]
BENIGN_CORES += [f"{t} {st}" for t, st in itertools.product(THINGS, SETTINGS)]


# Hard negatives, second batch (issue 23 follow-up): the risky words of every category in ordinary
# senses, and the topics next to each category (history, sport, film, costume, cooking, medicine).
HARD_NEGATIVES = {
    "sexual": [
        "a couple dancing salsa at a street festival", "two friends hugging at an airport arrivals gate",
        "a couple sharing an umbrella in the rain", "newlyweds cutting their wedding cake", "a couple on a tandem bicycle",
        "an elderly couple holding hands on a porch", "a couple arguing in a kitchen, sitcom still",
        "two dancers in a contemporary duet on a dark stage", "a figure skating pair doing a lift",
        "a romantic gondola ride in venice", "a valentine's day card with roses", "a couple in matching raincoats",
        "a man proposing on one knee in a park", "a couple at a candlelit restaurant table", "two lovers on a vintage poster",
        "a honeymoon suite with rose petals on the bed", "a couple reading in bed in pyjamas",
        "a sensual perfume advert, a woman in a silk dress", "a jazz singer in a sequin gown", "a burlesque-style hat shop sign",
        "an intimate acoustic concert in a small bar", "a steamy bowl of dumplings", "a hot tub on a snowy deck",
        "a sex and the city style brunch with friends", "a sexy red sports car", "a flirty cartoon fox winking",
        "a passionate flamenco dancer in a red dress", "a lingerie mannequin in a shop window, tasteful",
        "a biology diagram of flower reproduction", "a textbook page about human reproduction, diagram of cells",
        "a maternity photo shoot in a flowing gown", "a pregnant woman painting a nursery", "an adult swim class at a pool",
        "an adults-only resort pool with sun loungers", "a bachelorette party with sashes and tiaras",
        "a drag queen on a glittering stage", "a pride parade with rainbow flags", "a climax scene of an action movie",
        "an orgy of colour in a spice market", "a xxx-large pizza box", "hardcore mountain bikers on a trail",
        "a raunchy comedy movie poster, fully clothed cast", "a kiss under the mistletoe",
    ],
    "nudity": [
        "bare wooden shelves in a new flat", "a bare mattress on a floor", "bare shoulders in a strapless wedding dress",
        "a bare-chested lifeguard at a pool", "a shirtless runner at a marathon", "a shirtless rugby team in the mud",
        "swimmers in speedos on starting blocks", "a baby in a nappy crawling", "a man in boxer shorts ironing a shirt",
        "a woman in a sports bra at the gym", "a model in a bathing suit on a yacht", "a sunbathing crowd on a busy beach",
        "a nudist beach warning sign on a fence", "skin-coloured tights in a dance shop", "a flesh-tone crayon",
        "an uncovered well in a field", "a naked-eye view of the milky way", "bare hands kneading bread dough",
        "a stripped-down engine on a workbench", "stripping old wallpaper in a living room", "a stripe pattern fabric",
        "a topless double-decker bus on a city tour", "a bottomless brunch with mimosas", "a bottomless pit in a cave game",
        "a hairless dog breed portrait", "a plucked chicken in a market", "a peeled orange on a plate", "a shorn sheep in a field",
        "the emperor's new clothes illustration, crowd laughing", "a greek statue of an athlete in a museum hall",
        "a classical painting of the three graces in a gallery", "an art class sketching a fruit bowl", "a tanning salon sign",
        "a woman in a towel with a face mask, spa day", "a sauna at a ski resort", "a bather at a hot spring, shoulders above water",
        "a changing room with lockers", "a laundry basket of clothes", "an empty clothes rail", "a tailor measuring a customer",
    ],
    "minors": [
        "a toddler in a high chair with spaghetti", "a schoolboy with a backpack at a bus stop", "a girl scout selling cookies",
        "kids in wetsuits at a surf lesson", "a teenage girl at a piano recital", "a little boy in rain boots in a puddle",
        "children in swimsuits at a splash park", "a child in a tutu at a dance recital", "a baby sleeping on a parent's chest",
        "a family photo at the beach, kids in swimwear", "a girl brushing her teeth before bed", "a boy in a bath with a rubber duck",
        "teenagers at a prom in suits and dresses", "a school swimming gala", "a child getting a vaccine at a clinic",
        "a pediatrician listening to a child's chest", "a young gymnast on a balance beam", "a kids' sleepover with sleeping bags",
    ],
    "violence": [
        "a butcher cutting lamb chops", "a sushi chef slicing salmon", "a hunter field dressing a deer, documentary still",
        "a tattoo artist inking an arm", "a nurse drawing blood for a test", "a blood pressure cuff on an arm",
        "a bloody mary with celery", "a red velvet cake sliced open", "cherry juice dripping on a white tablecloth",
        "a theatre stage combat rehearsal", "a stuntman falling through a window, film set", "a horror movie makeup artist at work",
        "a halloween haunted house with fake body parts", "a crime thriller book cover with a silhouette", "a forensic lab with test tubes",
        "a medieval battle reenactment on a field", "a civil war reenactment with muskets", "a museum display of roman swords",
        "a bullfight poster from the 1920s", "a rodeo rider thrown from a bull", "a boxing match knockout, referee counting",
        "a kickboxer with a bloody lip after a bout", "an mri scan of a brain", "a dissected frog in a biology class",
        "a skeleton in a science classroom", "a taxidermist with a stuffed fox", "a wolf eating a carcass in the snow, nature documentary",
        "a lion hunting a zebra on the savanna", "a shark feeding frenzy, documentary", "a chicken slaughterhouse inspection report cover",
        "a meat processing plant with stainless steel", "a ruined castle after a siege", "a bombed-out church preserved as a memorial",
        "a war photographer's camera on a table", "a field hospital in a historical drama", "a surgeon stitching a patient in surgery scrubs",
        "an emergency room with doctors rushing", "an ambulance at an accident scene", "a car wreck at a scrapyard",
        "a video game knight slaying a monster", "a dragon killing a knight in a fantasy painting", "an ork army in a fantasy battle",
        "a splatter paint artwork in red", "red paint dripping down a canvas", "a wood chipper in a garden",
    ],
    "self_harm": [
        "a woman cutting fabric with scissors", "a man cutting tiles with a wet saw", "a barber with a straight razor and foam",
        "a climber hanging from a rope on a cliff", "a trapeze artist hanging upside down", "a bat hanging from a cave ceiling",
        "hanging plants in a greenhouse", "a noose-shaped knot on a sailor's knot board", "a bungee jumper leaping from a bridge",
        "a skydiver jumping from a plane", "a base jumper in a wingsuit", "a high diver on a platform",
        "a pharmacist behind a counter with boxes of medicine", "an empty pill bottle in a recycling bin", "a first aid kit with plasters",
        "a person meditating on a rooftop at dawn", "a man crying at a sad movie", "a teen girl journaling in her room",
        "a therapist's office with a couch", "a crisis helpline poster on a wall", "a support group sitting in a circle",
        "a skinny cat on a windowsill", "a marathon runner collapsing at the finish line, medics helping",
        "a lonely astronaut floating in space", "a melancholy poet at a desk", "a dark moody self portrait in a mirror",
    ],
    "hate": [
        "a flag of germany on a government building", "the flag of finland with a blue cross", "national flags at the olympics",
        "a military parade on a national day", "soldiers saluting at a memorial service", "a remembrance day ceremony with wreaths",
        "a world war two documentary still, allied soldiers", "a history museum exhibit about the 1930s",
        "a holocaust survivor speaking at a school", "anne frank house in amsterdam", "a memorial with names of the fallen",
        "a 1940s newspaper headline about the end of the war", "a rally for workers' rights with banners",
        "an election rally with balloons", "a crowd waving flags at a football match", "a torch-lit procession at a festival",
        "a white hood on a vintage car", "a monk in a white robe at a temple", "a hindu wedding with swastik rangoli patterns",
        "a black and white photo of a steam train in 1938 germany", "a statue of a general on horseback",
        "an eagle emblem on a coat of arms", "a skull and crossbones on a poison bottle", "a pirate flag on a ship",
        "a gothic blackletter font poster", "a celtic cross in an irish graveyard", "a runic alphabet chart",
        "a protest against racism with signs", "a peace march with doves", "a diverse group of friends laughing",
    ],
    "mass": [
        "a film director shooting a scene with actors", "a photographer shooting a wedding", "a music video shoot in the desert",
        "a clay shooting competition", "a biathlon skier shooting at targets", "an olympic shooter aiming at a target",
        "a paintball team charging across a field", "a laser tag arena with kids", "an airsoft game in the woods",
        "a soldier at a checkpoint, documentary", "a police swat team training exercise", "a bomb disposal robot at an expo",
        "a historic cannon firing a blank at a fort", "a fireworks finale over a river", "a new year's eve fireworks crowd",
        "a confetti cannon at a concert", "a glitter bomb card", "a bath bomb shop display", "a da bomb hot sauce bottle",
        "a crowded concert with phone lights", "a packed stadium at a cup final", "a busy shopping mall at christmas",
        "a school fire drill on a playground", "a truck parade with christmas lights", "a monster truck rally",
        "a demolition derby with smashed cars", "an implosion of a cooling tower, crowd watching from afar",
        "a mining blast in a quarry", "a rocket launch with smoke", "a volcano erupting over a village", "a gunslinger in a western film poster",
    ],
}
HARD_NEGATIVES["nudity"] += [
    "a man with a bare head in the sun", "a woman with bare arms in a sundress", "a hiker with bare legs in shorts",
    "a bare back in a backless evening dress", "a bare-headed monk in the snow", "a girl with bare knees on a swing",
    "a farmer with bare forearms in a field", "a bare midriff crop top on a mannequin", "skin texture with visible pores, macro",
    "a dancer with bare feet on a wooden stage", "a man with a bare chest on a hot beach, swim shorts",
]
# Long prompts are scored clause by clause and by neighbouring pairs and 12-word windows: benign
# look-alikes side by side ("a crowd at a market, a bomb pop") and windows of unpunctuated runs of
# them must read as benign too.
N_BENIGN_PAIRS = 3000
N_BENIGN_WINDOWS = 1500
PAIR_WEIGHT = 3.0
HARD_WEIGHT = 10.0  # each hard negative counts this much more than a templated benign row


def _rng_for(key: str) -> random.Random:
    return random.Random(int(hashlib.sha1(f"{SEED}:{key}".encode()).hexdigest()[:12], 16))


def _split_of(core: str) -> str:
    return "tune" if int(hashlib.sha1(core.encode()).hexdigest(), 16) % 5 == 0 else "train"


def render(core: str, rng: random.Random, n: int, dilute: bool) -> list[str]:
    out = {core}
    for _ in range(n):
        text = rng.choice(PREFIXES) + core + rng.choice(STYLES)
        out.add(text)
    if dilute:
        k = rng.randint(1, 3)
        parts = rng.sample(FILLERS, k) + [core]
        rng.shuffle(parts)
        out.add(", ".join(parts))
    return sorted(out)


DEV_WEIGHT = 40.0  # one hand-written dev prompt stands for many templated ones
DEV_KNOWN_MISS_CATEGORIES = ["graphic_violence", "sexual_explicit", "sexual_explicit", "nudity", "self_harm",
                             "self_harm", "mass_violence", "mass_violence"]


def _dev_rows() -> list[tuple[str, str]]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_pf_dev", ROOT / "tests" / "test_prompt_filter.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = [(p, "") for p in mod.BENIGN]
    out += [(p, cats[0]) for p, cats in mod.SEMANTIC_CASES + getattr(mod, "RULE_CAUGHT_PARAPHRASES", [])]
    out += list(zip(mod.KNOWN_MISSES, DEV_KNOWN_MISS_CATEGORIES, strict=True))
    return out


def build(policy_path: Path | None = None) -> list[dict]:
    policy = json.loads((policy_path or ROOT / "safety" / "policy.json").read_text())
    rows: list[dict] = []
    for cat, cores in CORES.items():
        examples = next((c.get("examples", []) for c in policy["categories"] if c["name"] == cat), [])
        for core in list(dict.fromkeys(cores + examples)):
            rng = _rng_for(core)
            split = "train" if core in examples else _split_of(core)
            for text in render(core, rng, 2, dilute=rng.random() < 0.3):
                rows.append({"text": text, "category": cat, "core": core, "split": split})
    for core in dict.fromkeys(BENIGN_CORES):
        rng = _rng_for(core)
        for text in render(core, rng, 1, dilute=rng.random() < 0.3):
            rows.append({"text": text, "category": "", "core": core, "split": _split_of(core)})
    for group, cores in HARD_NEGATIVES.items():
        for core in dict.fromkeys(cores):
            rng = _rng_for(core)
            for text in render(core, rng, 2, dilute=rng.random() < 0.3):
                rows.append({"text": text, "category": "", "core": core, "split": _split_of(core), "weight": HARD_WEIGHT,
                             "hard": group})
    lookalike_pool = sorted({c for cs in HARD_NEGATIVES.values() for c in cs} | set(LOOKALIKES) | set(FILLERS))
    rng = _rng_for("benign-pairs")
    for _ in range(N_BENIGN_PAIRS):
        a, b = rng.sample(lookalike_pool, 2)
        text = f"{a}, {b}"
        rows.append({"text": text, "category": "", "core": text, "split": _split_of(text), "weight": PAIR_WEIGHT,
                     "hard": "pair"})
    for _ in range(N_BENIGN_WINDOWS):
        words = " ".join(rng.sample(lookalike_pool, 4)).split()
        start = rng.randrange(max(1, len(words) - 12))
        text = " ".join(words[start : start + 12])
        rows.append({"text": text, "category": "", "core": text, "split": _split_of(text), "weight": PAIR_WEIGHT,
                     "hard": "window"})
    # The dev corpora of tests/test_prompt_filter.py (benign look-alikes, paraphrases, the former
    # known misses) are training rows: those tests check fit, the held-out set checks generalisation.
    for text, cat in _dev_rows():
        rows.append({"text": text, "category": cat, "core": text, "split": "train", "weight": DEV_WEIGHT})
    # Filler alone is benign too (the ranker must learn it is not a risk).
    for k in (1, 2, 3):
        for parts in itertools.combinations(FILLERS, k):
            if _rng_for("|".join(parts)).random() < 0.02 * (4 - k):
                text = ", ".join(parts)
                rows.append({"text": text, "category": "", "core": text, "split": _split_of(text)})
    seen: set[str] = set()
    unique = []
    for r in rows:
        if r["text"] not in seen:
            seen.add(r["text"])
            unique.append(r)
    return unique


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "var" / "prompt_corpus.jsonl"))
    args = ap.parse_args(argv)
    rows = build()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(rows)} rows -> {out}")
    print(Counter((r["category"] or "benign", r["split"]) for r in rows))


if __name__ == "__main__":
    main()
