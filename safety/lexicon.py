"""Lexicon-guided reading of a prompt: masked letters, split words and leetspeak resolved towards
the policy's own words.

``normalize.canonicalize`` undoes Unicode tricks; what is left are spellings that only make sense
relative to a vocabulary: ``n*ked`` (a mask standing for a letter), ``p.o.r.n`` / ``s_e_x``
(punctuation standing for nothing), ``nu de`` / ``be head ed`` (a word split by spaces), ``su1c1de``
(digits for letters). ``Lexicon.resolve`` reads every word unit of the prompt under each of these
hypotheses and keeps a reading only when it is a word of the policy (a term word, a pattern word,
or a stem); otherwise the unit keeps its plain reading. So ordinary punctuation never creates a
hit by itself: "e.g.", "well-known", "star-shaped", "3.5" stay what they were, and a masked word
that spells no policy word is left alone.

Costs are bounded: one pass over the units, dictionary look-ups, and at most ``MAX_WILDCARD_UNITS``
wildcard searches (each against the policy words of a plausible length and first letter).
"""
from __future__ import annotations

import re
from collections import defaultdict

from . import normalize

# Characters that may stand for a letter inside a word ("n*ked", "sh**ting", "sw@st*ka").
WILDCARD_CHARS = "*#?%@"
# Characters that may stand for nothing inside a word ("p.o.r.n", "s_e_x", "de-cap-itated").
SPLIT_CHARS = "._-~^'`:"
_MASK_RE = re.compile(r"[*#?%@._\-~^'`:]")
_WILD_RUN_RE = re.compile(r"[*#?%@]+")
_SPLIT_RUN_RE = re.compile(r"[._\-~^'`:]+")
_SUBTOKEN_SPLIT_RE = re.compile(r"[._\-~^*#?%:]+")
# A word unit: anything between whitespace and hard punctuation.
_UNIT_RE = re.compile(r"[^\s,;()\[\]{}\"<>/\\]+")
_EDGE_PUNCT = ".,!?'\"-_~^:`"
_DOUBLE_RE = re.compile(r"(.)\1")
MAX_WILDCARD_UNITS = 64
FUZZY_DROP = 5  # policy words this long are also read with one letter dropped
FUZZY_SUB = 7  # and this long with one letter wrong or one added
MAX_JOIN_FRAGMENTS = 3

# Short, common English words: two of them side by side are never glued into a policy word
# ("he art" is not "heart", "pen is" is not "penis", "be headed" is not "beheaded").
COMMON_WORDS = frozenset(
    """a an and are art as at be been by but can cat do dog for from go got had has have he head her
    him his how i if in into is it its me men my no not now of off on one or our out pen put see she
    so the them then there they this to too two up us was we were what when who why will with you
    your all any big day get man new old red sun top way ago age air arm ass bad bag bar bed bit box
    boy bus car cut dry ear eat egg end eye far fat few fly fun gun hat hit hot ice ink job key kid
    lay leg let lie lip lot low mad map may mix mud net nut oil own pan pay pet pie pig pin pot ran
    raw row run sad sat saw say sea set sit six sky son tea ten tie tin toe toy try use van war wet
    win yes yet zoo back ball band bank bath bear bird blue boat body bone book cake call card care
    city coat cold cook cool dark deep door down draw drop each east face fact fall farm fast fire
    fish five flat food foot four free full game girl give glad gold good gray grey hair half hall
    hand hard heat help here high hill hold hole home hope horn hour idea just keep kind king lady
    lake land last late lead left less life lift like line lion list live long look lord lose loss
    love made main make many mark meat milk mind miss moon more most move much must name near neck
    need nice nine none nose note only open over page pain pair park part pass past path pink plan
    play pool poor pull push rain read rest rich ride ring rise road rock roof room rope rose rule
    safe sail salt same sand seat seed self sell send ship shoe shop shot show shut sick side sign
    sing size skin slow snow soft soil some song soon sort star stay step stop such sure tail take
    talk tall tape team tell than that thin this time tiny tone tree trip true turn type unit very
    view wait walk wall want warm wash wave weak wear week well west wide wife wild wind wine wing
    wire wise wish wood word work yard year""".split()
)


_VOCAB: frozenset[str] | None = None


def dictionary_words() -> frozenset[str]:
    """Whole words (3+ letters) of MiniLM's WordPiece vocabulary, read once from its tokenizer.json:
    a fragment that is such a word ("headed", "art") is a word in its own right, not a piece of a
    split policy word. Only COMMON_WORDS when the model package is not installed."""
    global _VOCAB
    if _VOCAB is None:
        words: set[str] = set()
        try:
            import json

            from .embeddings import default_model_dir

            vocab = json.loads((default_model_dir() / "tokenizer.json").read_text())["model"]["vocab"]
            words = {w for w in vocab if len(w) >= 3 and w.isalpha() and w.isascii()}
        except Exception:  # noqa: BLE001 - any failure leaves the smaller list
            pass
        _VOCAB = frozenset(words | COMMON_WORDS)
    return _VOCAB


def _script_letters(word: str) -> bool:
    return word.isalpha()  # letters of any script, and not empty


class Lexicon:
    """The policy's vocabulary, for resolving masked, split and leet spellings."""

    def __init__(self, words: set[str], stems: set[str], dictionary: frozenset[str] | None = None):
        self.words = {w for w in words if w}
        self.dictionary = dictionary if dictionary is not None else dictionary_words()
        self.stems = {s for s in stems if len(s) >= 3}
        self._by_len_first: dict[tuple[int, str], list[str]] = defaultdict(list)
        for w in self.words:
            self._by_len_first[(len(w), w[0])].append(w)
        self._max_len = max((len(w) for w in self.words), default=0)
        self._fuzzy = self._fuzzy_index()

    # -- one letter dropped, added or wrong --------------------------------------
    def _fuzzy_index(self) -> dict[str, str]:
        """Keys of the policy's Latin words read with one letter dropped ("nakd", "fuking") or one
        letter wrong ("decapitaded", as ``\x00`` at its place) -> the word: a pattern per lexicon
        word that allows one missing or masked letter, without a list of variants. Only words of at
        least FUZZY_DROP / FUZZY_SUB letters (shorter ones are too close to ordinary words), and a
        key that is itself a dictionary or policy word is left out ("horn" is not "horny")."""
        index: dict[str, str] = {}
        for w in sorted(self.words):
            if not (w.isascii() and w.isalpha()):
                continue
            keys = []
            if len(w) >= FUZZY_DROP:
                keys += [w[:i] + w[i + 1 :] for i in range(len(w))]
            if len(w) >= FUZZY_SUB:
                keys += [w[:i] + "\x00" + w[i + 1 :] for i in range(len(w))]
            for k in keys:
                if k not in self.dictionary and k not in self.words:
                    index.setdefault(k, w)
        return index

    def fuzzy(self, word: str) -> str | None:
        """The policy word that ``word`` (lower-case ASCII letters, not a dictionary word) spells
        with one letter dropped, added or wrong; None if none."""
        if not self._fuzzy or len(word) < FUZZY_DROP - 1 or word in self.dictionary or self.known(word):
            return None
        hit = self._fuzzy.get(word)
        if hit:
            return hit
        for i in range(len(word)):
            if len(word) >= FUZZY_SUB:
                hit = self._fuzzy.get(word[:i] + "\x00" + word[i + 1 :])
                if hit:
                    return hit
            if len(word) > FUZZY_DROP:  # one letter added: "nakied"
                cand = word[:i] + word[i + 1 :]
                if cand in self.words and cand.isascii():
                    return cand
        return None

    def known(self, word: str) -> bool:
        if word in self.words:
            return True
        return any(word[:k] in self.stems for k in range(3, len(word)))

    # -- readings of one unit ----------------------------------------------------
    def _plain_readings(self, core: str) -> list[str]:
        """Masks as nothing, with and without leet, with repeats collapsed."""
        joined = _SPLIT_RUN_RE.sub("", _WILD_RUN_RE.sub("", core)) if _MASK_RE.search(core) else core
        forms = [core, joined]
        if any(c in normalize._LEET_CHARS for c in joined):
            forms += [normalize.deleet(joined, "i"), normalize.deleet(joined, "l")]
        out: list[str] = []
        for f in forms:
            for g in (f, normalize.collapse_repeats(f, 3), normalize.collapse_repeats(f, 2)):
                if g not in out:
                    out.append(g)
        return out

    def _wildcard(self, core: str) -> str | None:
        """'n*ked' -> 'naked', 'sh**ting' -> 'shooting': each run of k wildcard characters stands
        for 1..k letters; split characters stand for nothing; leet digits for their letters."""
        if not any(c in WILDCARD_CHARS for c in core):
            return None
        core = _SPLIT_RUN_RE.sub("", core)
        core = normalize.deleet(core.replace("@", "\x00"), "i").replace("\x00", "@")
        parts = _WILD_RUN_RE.split(core)
        runs = [len(r) for r in _WILD_RUN_RE.findall(core)]
        if not any(parts) or sum(len(p) for p in parts) < 2:
            return None
        body = ""
        for i, p in enumerate(parts):
            body += re.escape(p)
            if i < len(runs):
                body += rf"[^\W\d_]{{1,{runs[i]}}}"
        pat = re.compile(body)
        fixed = sum(len(p) for p in parts)
        firsts = [parts[0][0]] if parts[0] else None
        for n in range(fixed + len(runs), min(fixed + sum(runs), self._max_len) + 1):
            if firsts:
                cands = self._by_len_first.get((n, firsts[0]), [])
            else:
                cands = [w for (ln, _), ws in self._by_len_first.items() if ln == n for w in ws]
            for w in sorted(cands):
                if pat.fullmatch(w):
                    return w
        return None

    def _resolve_unit(self, unit: str, budget: list[int]) -> str:
        lead = len(unit) - len(unit.lstrip(_EDGE_PUNCT))
        trail = len(unit) - len(unit.rstrip(_EDGE_PUNCT))
        core = unit[lead : len(unit) - trail] if trail else unit[lead:]
        if not core or not any(c.isalpha() for c in core):
            return unit
        pre, post = unit[:lead], unit[len(unit) - trail :] if trail else ""
        if core.isalpha() and core in self.dictionary:
            return unit  # a word in its own right: "tree" is not read as the policy word "tre"
        if core.isalpha() and not _DOUBLE_RE.search(core):
            if core.isascii() and len(core) >= FUZZY_DROP - 1 and core not in self.dictionary:
                hit = self.fuzzy(core)
                if hit:
                    return pre + hit + post
            return unit  # an ordinary word: no reading to try (the common case)
        for r in self._plain_readings(core):
            if self.known(r):
                return pre + r + post
        if budget[0] > 0 and any(c in WILDCARD_CHARS for c in core):
            budget[0] -= 1
            w = self._wildcard(core)
            if w:
                return pre + w + post
        # No policy word as a whole: read the pieces between split characters one by one.
        pieces = [p for p in _SUBTOKEN_SPLIT_RE.split(core) if p]
        if len(pieces) > 1:
            return pre + " ".join(self._resolve_piece(p, budget) for p in pieces) + post
        return pre + self._resolve_piece(core, budget) + post

    def _resolve_piece(self, piece: str, budget: list[int]) -> str:
        for r in self._plain_readings(piece):
            if self.known(r):
                return r
        if budget[0] > 0 and any(c in WILDCARD_CHARS for c in piece):
            budget[0] -= 1
            w = self._wildcard(piece)
            if w:
                return w
        plain = normalize.deleet(piece, "i") if normalize._is_leet_candidate(piece) else piece
        return normalize.collapse_repeats(plain, 3)

    # -- split words ----------------------------------------------------------------
    def _join_fragments(self, words: list[str]) -> list[str]:
        """Glue 2-3 neighbouring fragments whose concatenation is a policy word ("nu de" ->
        "nude", "be head ed" -> "beheaded"), unless every fragment is a word in its own right
        ("be headed", "he art", "pen is")."""
        out: list[str] = []
        i = 0
        while i < len(words):
            done = False
            for n in range(MAX_JOIN_FRAGMENTS, 1, -1):
                frag = words[i : i + n]
                if len(frag) < n or all(f in self.dictionary for f in frag):
                    continue
                if not all(_script_letters(f) for f in frag):
                    continue
                cat = "".join(frag)
                if len(cat) < 4 or not self.known(cat):
                    continue
                out.append(cat)
                i += n
                done = True
                break
            if not done:
                out.append(words[i])
                i += 1
        return out

    def _spelled_out(self, text: str) -> str:
        """'n u d e' -> 'nude'; 'a n a k e d' -> 'a naked' when the rest is a policy word."""

        def fix(m: re.Match) -> str:
            letters = normalize._SEP_RE.sub("", m.group(0))
            if self.known(letters):
                return letters
            if any(c in WILDCARD_CHARS for c in m.group(0)):
                return m.group(0)  # "a c*m": a masked word, read by the unit resolver below
            if letters[0] in "ai" and len(letters) > 3 and self.known(letters[1:]):
                return letters[0] + " " + letters[1:]
            if letters[0] in "ai" and len(letters) > 3:
                return letters[0] + " " + letters[1:]
            return letters

        return normalize._SPELLED_RE.sub(fix, text)

    def resolve(self, canonical: str) -> str:
        """The canonical text with every unit in its policy reading (see the module docstring)."""
        text = self._spelled_out(canonical)
        budget = [MAX_WILDCARD_UNITS]
        pieces: list[str] = []
        seen: dict[str, str] = {}  # long prompts repeat their words
        pos = 0
        for m in _UNIT_RE.finditer(text):
            pieces.append(text[pos : m.start()])
            unit = m.group(0)
            if unit not in seen:
                seen[unit] = self._resolve_unit(unit, budget)
            pieces.append(seen[unit])
            pos = m.end()
        pieces.append(text[pos:])
        resolved = "".join(pieces)
        # Glue split fragments, keeping hard punctuation where it was.
        out = []
        for chunk in re.split(r"([,;()\[\]{}\"<>/\\.!?]+)", resolved):
            words = chunk.split()
            if len(words) < 2:
                out.append(chunk)
                continue
            lead = " " if chunk[:1].isspace() else ""
            trail = " " if chunk[-1:].isspace() else ""
            out.append(lead + " ".join(self._join_fragments(words)) + trail)
        return normalize._WS_RE.sub(" ", "".join(out)).strip()


def squeeze_cjk(text: str) -> str:
    """Remove whatever separates two CJK/Hangul characters ("裸 体", "裸*体" -> "裸体")."""
    from .confusables import is_cjk

    out: list[str] = []
    n = len(text)
    i = 0
    while i < n:
        ch = text[i]
        if not ch.isalnum() and out and is_cjk(out[-1]):
            j = i
            while j < n and not text[j].isalnum():
                j += 1
            if j < n and is_cjk(text[j]):
                i = j
                continue
        out.append(ch)
        i += 1
    return "".join(out)
