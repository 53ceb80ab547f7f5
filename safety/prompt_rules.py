"""Whole-word matching of policy terms (any language) on normalised prompt text.

A term is one of:

* a word or phrase (``"naked"``, ``"self-harm"``, ``"in the altogether"``): matched on word
  boundaries that are Unicode-aware (a term is not preceded or followed by a letter or digit of
  any script); spaces, hyphens and underscores between its words are interchangeable, and the
  words written together also match (``selfharm``);
* a stem ending in ``*`` (``"desnud*"``, ``"обнаженн*"``): a word that starts with it;
* a term in a script written without spaces (Han, kana, Hangul): matched as a substring, after
  removing whatever separates two such characters (``裸 体``, ``裸*体``);
* an Arabic term: also matched after one attached prefix (``و``, ``ب``, ``ال``, ``وال``, ...),
  since Arabic glues conjunctions, prepositions and the article to the word.

Exceptions are phrases of the same kinds; a hit that lies inside an exception of its category is
not a hit ("naked eye", "Al Gore", "裸眼"), while a second occurrence elsewhere still is.

Benign contexts generalise exceptions to "a term next to a word": a hit of one of the context's
terms with one of its words (or stems, ``провод*``) at most ``window`` words before or after it,
within the same clause (no ``, . ; : ! ? ( ) |`` between them), is not a hit: "a naked copper
wire", "un cable desnudo", "голый провод" (a nudity term describing a thing, not a person).
Matching is a single pass over the words with dictionary look-ups, so its cost grows with the
prompt's length, not with the number of terms.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from . import normalize

# Letters and digits of any script, plus the combining vowel signs of the Indic scripts (which are
# not alphanumeric: without them महिला would be two words); the dandas (U+0964-5) are punctuation.
_WORD_RE = re.compile(r"(?:[^\W_]|[\u0900-\u0963\u0966-\u0dff])+")
_TERM_SEP_RE = re.compile(r"[\s_\-]+")
ARABIC_PREFIXES = ("وبال", "وال", "بال", "فال", "كال", "لل", "ال", "و", "ف", "ب", "ل", "ك")
MIN_STEM = 3


class TermError(ValueError):
    """A term that cannot be matched as written (the policy loader turns it into a PolicyError)."""


@dataclass(frozen=True)
class Entry:
    words: tuple[str, ...]
    label: str  # the policy's spelling, shown in reasons
    owner: int  # category index
    exception: bool
    key: str = ""  # the canonical policy spelling (what benign contexts name)


@dataclass(frozen=True)
class Context:
    terms: frozenset[str]  # canonical policy spellings of the terms it applies to
    words: frozenset[str]
    stems: tuple[str, ...]
    window: int

    def has(self, word: str) -> bool:
        return word in self.words or any(word.startswith(s) for s in self.stems)


_HARD_PUNCT_RE = re.compile(r"[,.;:!?()\[\]|\n]")
# A benign context does not reach past a preposition or conjunction: "a nude woman on concrete" is
# about the woman ("on" stops the scan), "nude concrete" would be about the concrete.
_CONTEXT_STOPS_RAW = """on in at against by with under near beside behind next into onto over from and or of for
    en con sobre contra junto bajo y o de auf an in mit und vor unter neben gegen sur dans contre avec sous et ou
    em na no nas nos com sobre contra e ou su sul sulla nel nella con contro e o на в во у с со под над и или о об""".split()
_CONTEXT_STOPS: frozenset[str] | None = None


def _context_stops() -> frozenset[str]:
    global _CONTEXT_STOPS
    if _CONTEXT_STOPS is None:
        _CONTEXT_STOPS = frozenset(normalize.canonicalize(w) for w in _CONTEXT_STOPS_RAW)
    return _CONTEXT_STOPS


_CJK_RE = re.compile("[\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
                     "\u1100-\u11ff\u3130-\u318f\uff66-\uff9f]")  # confusables.is_cjk as one regex
_ARABIC_RE = re.compile("[\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff]")


def _is_cjk_text(s: str) -> bool:
    return not s.isascii() and _CJK_RE.search(s) is not None


def _arabic_forms(word: str) -> list[str]:
    if word.isascii() or not _ARABIC_RE.search(word):
        return [word]
    forms = [word]
    for p in ARABIC_PREFIXES:
        if word.startswith(p) and len(word) - len(p) >= 2:
            forms.append(word[len(p) :])
    return forms


class TermMatcher:
    """All categories' terms and exceptions in one index; ``find`` gives the first hit per category."""

    def __init__(self) -> None:
        self._first: dict[str, list[Entry]] = {}
        self._stems: dict[str, list[Entry]] = {}
        self._cjk: list[tuple[str, Entry]] = []
        self.words: set[str] = set()  # every word of every term (not their concatenations), for the lexicon
        self.stems: set[str] = set()
        self._contexts: dict[int, list[Context]] = {}

    def add_context(self, terms: list[str], words: list[str], owner: int, window: int = 2) -> None:
        """A benign context of category ``owner`` (see the module docstring)."""
        keys = frozenset(normalize.canonicalize(t) for t in terms)
        plain, stems = set(), []
        for w in words:
            c = normalize.canonicalize(w)
            if c.endswith("*"):
                if not re.fullmatch(r"[^\W_]+", c[:-1]) or len(c) - 1 < MIN_STEM:
                    raise TermError(f"benign context word {w!r}: a stem is one word of at least {MIN_STEM} letters")
                stems.append(c[:-1])
            elif re.fullmatch(r"[^\W_]+", c):
                plain.add(c)
            else:
                raise TermError(f"benign context word {w!r} must be one word (or a stem ending in '*')")
        if not 1 <= window <= 5:
            raise TermError(f"benign context window {window!r} must be 1-5 words")
        self._contexts.setdefault(owner, []).append(Context(keys, frozenset(plain), tuple(stems), window))

    def add(self, raw: str, owner: int, exception: bool = False) -> None:
        canon = normalize.canonicalize(raw)
        if not canon:
            raise TermError(f"term {raw!r} is empty after normalisation")
        if _is_cjk_text(canon):
            key = re.sub(r"[\W_]+", "", canon)
            self._cjk.append((key, Entry((key,), raw, owner, exception, canon)))
            return
        if canon.endswith("*"):
            stem = canon[:-1]
            if not re.fullmatch(r"[^\W_]+", stem) or len(stem) < MIN_STEM:
                raise TermError(f"stem {raw!r} must be one word of at least {MIN_STEM} letters before the '*'")
            self._stems.setdefault(stem, []).append(Entry((stem,), raw, owner, exception, canon))
            self.stems.add(stem)
            return
        if "*" in canon:
            raise TermError(f"term {raw!r}: '*' is only allowed at the end of a one-word stem")
        words = tuple(_WORD_RE.findall(canon))
        if not words:
            raise TermError(f"term {raw!r} has no letters or digits")
        self._first.setdefault(words[0], []).append(Entry(words, raw, owner, exception, canon))
        self.words.update(words)
        if len(words) > 1:  # written together: "selfharm", "sextape"
            joined = "".join(words)
            self._first.setdefault(joined, []).append(Entry((joined,), raw, owner, exception, canon))

    # -- matching ------------------------------------------------------------------------
    def _word_hits(self, text: str, toks: list[tuple[int, int, str]]) -> list[tuple[int, int, Entry, int, int]]:
        hits: list[tuple[int, int, Entry, int, int]] = []
        for i, (start, end, tok) in enumerate(toks):
            forms = _arabic_forms(tok)
            for form in forms:
                for e in self._first.get(form, ()):
                    n = len(e.words)
                    if i + n > len(toks):
                        continue
                    ok = True
                    for k in range(1, n):
                        prev_end, (s_k, _, t_k) = toks[i + k - 1][1], toks[i + k]
                        if not _TERM_SEP_RE.fullmatch(text[prev_end:s_k]) or e.words[k] not in _arabic_forms(t_k):
                            ok = False
                            break
                    if ok:
                        hits.append((start, toks[i + n - 1][1], e, i, i + n - 1))
                if self._stems:
                    for k in range(MIN_STEM, len(form) + 1):
                        for e in self._stems.get(form[:k], ()):
                            hits.append((start, end, e, i, i))
        return hits

    def _cjk_hits(self, text: str) -> list[tuple[int, int, Entry, int, int]]:
        if not self._cjk or not _is_cjk_text(text):
            return []
        from .lexicon import squeeze_cjk

        squeezed = squeeze_cjk(text)
        hits = []
        for key, e in self._cjk:
            start = squeezed.find(key)
            while start >= 0:
                # offsets are in the squeezed text: CJK hits only compete with CJK exceptions
                hits.append((start + 1_000_000, start + 1_000_000 + len(key), e, -1, -1))
                start = squeezed.find(key, start + 1)
        return hits

    def find(self, text: str) -> dict[int, tuple[str, int]]:
        """{category index: (the policy term, position)} for the first non-excepted hit of each."""
        toks = [(m.start(), m.end(), m.group(0)) for m in _WORD_RE.finditer(text)]
        hits = self._word_hits(text, toks) + self._cjk_hits(text)
        if not hits:
            return {}
        excepted: dict[int, list[tuple[int, int]]] = {}
        for s, t, e, _, _ in hits:
            if e.exception:
                excepted.setdefault(e.owner, []).append((s, t))
        found: dict[int, tuple[str, int]] = {}
        for s, t, e, i0, i1 in sorted(hits, key=lambda h: h[0]):
            if e.exception or e.owner in found:
                continue
            if any(a <= s and t <= b for a, b in excepted.get(e.owner, ())):
                continue
            if i0 >= 0 and e.owner in self._contexts and self._in_context(text, toks, e, i0, i1):
                continue
            found[e.owner] = (e.label, s)
        return found

    def _in_context(self, text: str, toks: list[tuple[int, int, str]], e: Entry, i0: int, i1: int) -> bool:
        stops = _context_stops()
        for ctx in self._contexts[e.owner]:
            if e.key not in ctx.terms:
                continue
            for step, edge in ((-1, i0), (1, i1)):
                j = edge
                for _ in range(ctx.window):
                    k = j + step
                    if not 0 <= k < len(toks):
                        break
                    gap = text[toks[j][1] : toks[k][0]] if step > 0 else text[toks[k][1] : toks[j][0]]
                    if _HARD_PUNCT_RE.search(gap):
                        break
                    if ctx.has(toks[k][2]):
                        return True
                    if toks[k][2] in stops:
                        break
                    j = k
        return False
