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
Matching is a single pass over the words with dictionary look-ups, so its cost grows with the
prompt's length, not with the number of terms.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from . import confusables, normalize

_WORD_RE = re.compile(r"[^\W_]+")
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


def _is_cjk_text(s: str) -> bool:
    return any(confusables.is_cjk(ch) for ch in s)


def _arabic_forms(word: str) -> list[str]:
    if not any(confusables.is_arabic(ch) for ch in word):
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

    def add(self, raw: str, owner: int, exception: bool = False) -> None:
        canon = normalize.canonicalize(raw)
        if not canon:
            raise TermError(f"term {raw!r} is empty after normalisation")
        if _is_cjk_text(canon):
            key = re.sub(r"[\W_]+", "", canon)
            self._cjk.append((key, Entry((key,), raw, owner, exception)))
            return
        if canon.endswith("*"):
            stem = canon[:-1]
            if not re.fullmatch(r"[^\W_]+", stem) or len(stem) < MIN_STEM:
                raise TermError(f"stem {raw!r} must be one word of at least {MIN_STEM} letters before the '*'")
            self._stems.setdefault(stem, []).append(Entry((stem,), raw, owner, exception))
            self.stems.add(stem)
            return
        if "*" in canon:
            raise TermError(f"term {raw!r}: '*' is only allowed at the end of a one-word stem")
        words = tuple(_WORD_RE.findall(canon))
        if not words:
            raise TermError(f"term {raw!r} has no letters or digits")
        self._first.setdefault(words[0], []).append(Entry(words, raw, owner, exception))
        self.words.update(words)
        if len(words) > 1:  # written together: "selfharm", "sextape"
            joined = "".join(words)
            self._first.setdefault(joined, []).append(Entry((joined,), raw, owner, exception))

    # -- matching ------------------------------------------------------------------------
    def _word_hits(self, text: str) -> list[tuple[int, int, Entry]]:
        toks = [(m.start(), m.end(), m.group(0)) for m in _WORD_RE.finditer(text)]
        hits: list[tuple[int, int, Entry]] = []
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
                        hits.append((start, toks[i + n - 1][1], e))
                if self._stems:
                    for k in range(MIN_STEM, len(form) + 1):
                        for e in self._stems.get(form[:k], ()):
                            hits.append((start, end, e))
        return hits

    def _cjk_hits(self, text: str) -> list[tuple[int, int, Entry]]:
        if not self._cjk or not _is_cjk_text(text):
            return []
        from .lexicon import squeeze_cjk

        squeezed = squeeze_cjk(text)
        hits = []
        for key, e in self._cjk:
            start = squeezed.find(key)
            while start >= 0:
                # offsets are in the squeezed text: CJK hits only compete with CJK exceptions
                hits.append((start + 1_000_000, start + 1_000_000 + len(key), e))
                start = squeezed.find(key, start + 1)
        return hits

    def find(self, text: str) -> dict[int, tuple[str, int]]:
        """{category index: (the policy term, position)} for the first non-excepted hit of each."""
        hits = self._word_hits(text) + self._cjk_hits(text)
        if not hits:
            return {}
        excepted: dict[int, list[tuple[int, int]]] = {}
        for s, t, e in hits:
            if e.exception:
                excepted.setdefault(e.owner, []).append((s, t))
        found: dict[int, tuple[str, int]] = {}
        for s, t, e in sorted(hits, key=lambda h: h[0]):
            if e.exception or e.owner in found:
                continue
            if any(a <= s and t <= b for a, b in excepted.get(e.owner, ())):
                continue
            found[e.owner] = (e.label, s)
        return found
