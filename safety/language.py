"""Language identification for the prompt gate: which of the policy's declared languages a prompt
(and each of its clauses) is written in, and which parts are in a language the gate cannot read.

The identifier is py3langid (a maintained fork of langid.py: a naive Bayes model over byte n-grams,
142 languages, shipped inside the wheel, ~0.5 ms for 2,000 characters); nothing is downloaded.

The answer for a text (``LanguageID.identify``):

* ``language``: the most likely language (ISO 639-1 where there is one), ``"und"`` for a text
  without letters;
* ``candidates``: the declared languages it might be. A text whose language cannot be told with
  confidence (under CONFIDENT_LETTERS letters or a top probability under CONFIDENT_P: "nude woman"
  comes out as Fulah 0.29, English 0.09) may be any declared language among its likely ones or
  written in its script(s), and is judged by the rules of all of them (the rules of every language
  always run, so this decides only whether the fallback applies); when none fits (a script no
  declared language uses) the fallback applies;
* ``unreadable``: the undeclared languages found in the whole prompt or in one of its clauses
  (a mixed prompt: an English style tag around a sentence in Swahili), each found with
  confidence, or the only likely languages of an uncertain text. When it is not empty the
  policy's fallback (``languages.undeclared``: review, block or allow) applies.

A clause whose words are almost all English words (MiniLM's whole-word vocabulary) counts as
English whatever the identifier says, since short English clauses ("gore", "a red circle") are
where it is least sure; that vocabulary holds few words of other languages (checked on the
undeclared-language set of the benchmark).
"""
from __future__ import annotations

import re
import threading
import unicodedata
from collections import Counter
from dataclasses import dataclass

# A language is "likely" when its probability is at least this share of the top one's.
NEAR_SHARE = 0.25
NEAR_MIN = 0.04
TOP_K = 6
# The top language is taken as the answer when it reaches this probability on at least
# CONFIDENT_LETTERS letters; below that the text is uncertain.
CONFIDENT_P = 0.6
CONFIDENT_LETTERS = 15
# A clause is identified on its own from this many letters (shorter ones add little evidence).
CLAUSE_LETTERS = 15
MAX_CLAUSES = 200
ENGLISH_SHARE = 0.7  # of a clause's Latin words in the English vocabulary -> English

# Codes the identifier gives for languages that the policy knows under another code.
ALIASES = {"nn": "no", "nb": "no", "zxx": "und", "wuu": "zh", "yue": "zh"}

_CLAUSE_SPLIT_RE = re.compile(r"[.;!?\n|,:()\[\]\"«»“”。、，！？；：]+|\s[-–—]+\s")
_LATIN_WORD_RE = re.compile(r"[a-z]{2,}")


# The script each declared language is written in; an uncertain text may be any declared language
# of its script. A language missing here has no script fallback (only the identifier's ranking).
SCRIPTS = {
    "LATIN": {"en", "es", "de", "fr", "pt", "it", "pl", "nl", "sv", "tr", "id", "vi", "cs", "da", "fi", "hu",
              "no", "ro"},
    "CYRILLIC": {"ru", "uk", "bg"}, "ARABIC": {"ar", "fa"}, "DEVANAGARI": {"hi"}, "GREEK": {"el"},
    "HEBREW": {"he"}, "THAI": {"th"}, "CJK": {"zh", "ja"}, "HIRAGANA": {"ja"}, "KATAKANA": {"ja"},
    "HANGUL": {"ko"},
}


def scripts(text: str) -> set[str]:
    """The scripts of a text's letters (Unicode name prefixes; Han is "CJK")."""
    out: set[str] = set()
    for ch in set(text):
        if ch.isalpha():
            if ch.isascii():
                out.add("LATIN")
                continue
            name = unicodedata.name(ch, "")
            out.add(name.split(" ", 1)[0] if name else "")
    return out


class LanguageIDError(RuntimeError):
    """The language identifier could not be loaded (callers fail closed)."""


@dataclass(frozen=True)
class LanguageReading:
    language: str  # the most likely language, "und" without letters
    confidence: float  # its probability (0 for "und")
    candidates: tuple[str, ...]  # declared languages it might be, most likely first
    unreadable: tuple[str, ...]  # undeclared languages found (whole prompt or a clause)
    uncertain: bool  # the whole text's language could not be told with confidence
    clauses: tuple[str, ...] = ()  # the language of each clause identified on its own
    by_script: bool = False  # uncertain, and the candidates come only from the text's script

    @property
    def readable(self) -> bool:
        return not self.unreadable


_NON_LETTERS_RE = re.compile(r"[\W\d_]+")


def _letters(text: str) -> int:
    return len(_NON_LETTERS_RE.sub("", text))


def _prepare(text: str) -> str:
    # NFKC (fullwidth, ligatures) and no format characters (zero-width, bidi), as the rules read it;
    # accents are kept: they are what tells Portuguese from Spanish.
    text = unicodedata.normalize("NFKC", text)
    return "".join(ch for ch in text if unicodedata.category(ch) != "Cf").lower()


class LanguageID:
    """py3langid over the whole prompt and its clauses, against a set of declared languages."""

    def __init__(self, declared: set[str] | frozenset[str], english_words: frozenset[str] | None = None):
        try:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier
        except ImportError as exc:  # pragma: no cover - a requirement
            raise LanguageIDError(f"py3langid is not installed: {exc}") from exc
        self._ident = _model(LanguageIdentifier, MODEL_FILE)
        self.declared = frozenset(declared)
        if english_words is None:
            from .lexicon import dictionary_words

            english_words = dictionary_words()
        self._english = english_words

    def _english_share(self, text: str) -> float:
        words = _LATIN_WORD_RE.findall(text)
        if not words or _letters(text) > 2 * sum(len(w) for w in words) + 2:  # mostly another script
            return 0.0
        return sum(w in self._english for w in words) / len(words)

    def _scores(self, texts: list[str]):
        """Per text, the identifier's probabilities over its classes: what py3langid's ``_decide``
        gives one text at a time (tests hold them equal), for all texts in one matrix product,
        so a prompt's clauses cost one numpy call instead of one each."""
        import numpy as np
        from py3langid.langid import visit_counts

        ident = self._ident
        encoded = [ident._encode(t) for t in texts]
        visits = [visit_counts(ident.tk_nextmove, ident._rowbase, ident.tk_output, b) or {} for b in encoded]
        feats = sorted({k for v in visits for k in v})
        counts = np.zeros((len(texts), len(feats)), dtype=np.float32)
        if feats:
            col = {k: i for i, k in enumerate(feats)}
            for r, v in enumerate(visits):
                for k, c in v.items():
                    counts[r, col[k]] = c
            scores = np.log1p(counts) @ ident.nb_ptc[feats] + ident.nb_pc
        else:
            scores = np.zeros((len(texts), len(ident.nb_classes)), dtype=np.float32)
        for r, v in enumerate(visits):
            if not v:
                scores[r] = 0.0  # no features: uniform
        scores *= (1.0 / np.sqrt(np.maximum([len(b) for b in encoded], 1)))[:, None]
        scores = np.exp(scores - scores.max(axis=1, keepdims=True))
        scores /= scores.sum(axis=1, keepdims=True)
        for i, j in ident._alias_pairs:  # a label listed twice (srl -> sr): one score
            scores[:, i] += scores[:, j]
            scores[:, j] = 0.0
        return scores

    def _judge(self, text: str, scores) -> tuple[str, float, list[str], bool, bool]:
        """(top language, its probability, declared languages it might be, confident, the
        candidates come from the script alone)."""
        import numpy as np

        classes = self._ident.nb_classes
        idx = np.argpartition(scores, -TOP_K)[-TOP_K:]
        idx = idx[np.argsort(scores[idx])[::-1]]
        ranked = [(ALIASES.get(classes[i], classes[i]), float(scores[i])) for i in idx]
        top, p_top = ranked[0]
        near = [lang for lang, p in ranked if p >= max(NEAR_MIN, p_top * NEAR_SHARE)]
        cands = [lang for lang in dict.fromkeys(near) if lang in self.declared]
        if "en" in self.declared and "en" not in cands and self._english_share(text) >= ENGLISH_SHARE:
            if top in self.declared:
                cands.append("en")
            else:
                cands.insert(0, "en")
        confident = p_top >= CONFIDENT_P and _letters(text) >= CONFIDENT_LETTERS
        by_script = not confident and not cands
        if not confident:
            # too little to tell: every declared language written in the text's script(s) may be it
            for script in sorted(scripts(text)):
                cands += sorted((SCRIPTS.get(script, set()) & self.declared) - set(cands))
        return top, p_top, cands, confident, by_script

    def identify(self, text: str) -> LanguageReading:
        prepared = _prepare(text)
        if _letters(prepared) == 0:
            return LanguageReading("und", 0.0, tuple(sorted(self.declared)), (), False)
        parts = [p.strip() for p in _CLAUSE_SPLIT_RE.split(prepared)]
        parts = list(dict.fromkeys(p for p in parts if _letters(p) >= CLAUSE_LETTERS))[:MAX_CLAUSES]
        if len(parts) < 2:
            parts = []
        english = {p for p in parts if "en" in self.declared and self._english_share(p) >= ENGLISH_SHARE}
        asked = [p for p in parts if p not in english]
        scores = self._scores([prepared, *asked])
        top, p_top, cands, confident, by_script = self._judge(prepared, scores[0])
        by_part = dict(zip(asked, scores[1:], strict=True))
        clause_langs: list[str] = []
        unreadable: list[str] = []
        for part in parts:
            if part in english:
                clause_langs.append("en")
                continue
            c_top, _, c_cands, c_confident, _ = self._judge(part, by_part[part])
            clause_langs.append(c_cands[0] if c_cands else c_top)
            # a clause counts against the prompt only when it is confidently undeclared
            if not c_cands and c_confident and c_top not in unreadable:
                unreadable.append(c_top)
        # A prompt of several clauses is what its clauses are: the whole of a prompt that mixes
        # languages reads as none of them (ten languages together come out as Guadeloupean Creole).
        readable_clauses = [lang for lang in clause_langs if lang in self.declared]
        if not cands and not readable_clauses:
            unreadable.insert(0, top)
        counted = [lang for lang, _ in Counter(readable_clauses).most_common()]
        cands = list(dict.fromkeys(cands + counted))
        if top in self.declared or not cands:
            language = top
        else:
            language = counted[0] if counted else cands[0]
        return LanguageReading(language, round(float(p_top), 4), tuple(cands), tuple(dict.fromkeys(unreadable)),
                               not confident, tuple(clause_langs), by_script and bool(cands) and not counted)


_MODEL = None
_MODEL_LOCK = threading.Lock()


def _model(cls, model_file):
    """The identifier's model, loaded once per process (~1 s)."""
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is None:
            try:
                _MODEL = cls.from_model_file(model_file, norm_probs=True)
            except Exception as exc:  # noqa: BLE001 - any failure to load fails closed
                raise LanguageIDError(f"cannot load the py3langid model: {exc}") from exc
        return _MODEL
