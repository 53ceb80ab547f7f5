"""Text normalisation for the prompt filter.

Evasions handled (each step is a pure function; ``variants()`` combines them):

1. ``canonicalize``: Unicode NFKC (fullwidth, mathematical alphanumerics, circled
   and super/subscript letters, ligatures), removal of format characters
   (zero-width space/joiners, soft hyphen, BOM, bidi controls, variation selectors),
   removal of combining marks (accents, "zalgo" text), a confusables map for the
   common Cyrillic/Greek/IPA/small-capital look-alikes of Latin letters, case
   folding, and whitespace squeezing.
2. ``deleet``: leetspeak (0->o, 1->i or l, 3->e, 4->a, 5->s, 7->t, 8->b, @->a,
   $->s, !/|->i or l inside a word) but only in tokens that mix letters with such
   characters and that do not look like a number with a unit ("1980s", "3d", "4k",
   "20th", "35mm", "4x4"). Pure-digit tokens are never rewritten.
3. ``join_spelled_out``: runs of >= 3 single letters separated by spaces, dots,
   hyphens, underscores, asterisks ... ("n u d e", "n.u.d.e", "n-u-d-e") are joined;
   a variant leaves a leading "a"/"i" article alone ("a n u d e" -> "a nude").
4. ``join_intraword``: punctuation inside a word is dropped ("nu.de", "go_re").
5. ``collapse_repeats``: runs of 3+ identical letters -> 2 ("goooood" -> "good"),
   and in a separate variant every run of 2+ -> 1 ("nuuude" -> "nude"; "good" ->
   "god" only in that variant, so whole-word terms still have to match exactly).

Matching runs over all variants; a term matches if it occurs (as a whole word) in
any of them.
"""
from __future__ import annotations

import re
import unicodedata

from . import confusables as _cf

_CAPITALS = str.maketrans(_cf.CAPITALS)
_CONFUSABLES = str.maketrans({**_cf.LOWER, **_cf.ARABIC, **_cf.HANT_TO_HANS})
# Combining marks that carry meaning and are kept: the kana voicing marks (NFD splits "ド" into
# "ト" + U+3099; dropping it would turn ヌード into ヌート), and the vowel signs, viramas and nasal
# marks of the Indic scripts (U+0900-U+0DFF: without them नंगी "naked" and नग "gem" read alike).
_KEEP_MARKS = {"\u3099", "\u309a"}


def _keep_mark(ch: str) -> bool:
    return ch in _KEEP_MARKS or "\u0900" <= ch <= "\u0dff"

_WS_RE = re.compile(r"\s+")


def canonicalize(text: str) -> str:
    """NFKC + per-script look-alikes + casefold, without format characters or combining marks."""
    text = unicodedata.normalize("NFKC", text)
    text = text.translate(_CAPITALS)
    # Format chars (Cf: ZWSP/ZWJ/ZWNJ/soft hyphen/BOM/bidi) and variation selectors.
    text = "".join(
        ch
        for ch in text
        if unicodedata.category(ch) != "Cf" and not ("\ufe00" <= ch <= "\ufe0f")
    )
    # Combining marks: decompose and drop Mn/Me (accents, zalgo, Arabic harakat), then recompose.
    text = unicodedata.normalize("NFD", text)
    text = "".join(ch for ch in text if unicodedata.category(ch) not in ("Mn", "Me") or _keep_mark(ch))
    text = unicodedata.normalize("NFC", text).casefold()
    text = text.translate(_CONFUSABLES)
    # NFKC again: casefold/confusables can produce compatibility forms.
    text = unicodedata.normalize("NFKC", text)
    return _WS_RE.sub(" ", text).strip()


# --- leetspeak ---------------------------------------------------------------
_LEET_COMMON = {"0": "o", "3": "e", "4": "a", "5": "s", "7": "t", "8": "b", "@": "a", "$": "s", "+": "t"}
_LEET_ONE_I = dict(_LEET_COMMON, **{"1": "i", "!": "i", "|": "i"})
_LEET_ONE_L = dict(_LEET_COMMON, **{"1": "l", "!": "i", "|": "l"})
_LEET_CHARS = set(_LEET_ONE_I) | set(_LEET_ONE_L)
_TOKEN_RE = re.compile(r"[\w@$!|+]+")
# Numbers with a unit/suffix, left alone: 1980s, 3d, 4k, 20th, 35mm, 4x4, 1080p, 2x, 60fps, v2
_NUMERIC_TOKEN_RE = re.compile(
    r"^(?:v?\d+(?:[.,]\d+)?(?:s|st|nd|rd|th|d|k|m|mm|cm|km|kg|g|px|p|fps|x|am|pm|yo|h|hr|hrs|min|ft|in|mp|gb|mb)?"
    r"|\d+x\d+|[a-z]\d+|\d+[a-z]\d*)$"
)


def _is_leet_candidate(tok: str) -> bool:
    if not any(c.isalpha() for c in tok):
        return False  # "1488", "3", "$$$" stay as they are
    if not any(c in _LEET_CHARS for c in tok):
        return False
    plain = tok.strip("!|+")  # trailing "!" is punctuation, not a letter
    if _NUMERIC_TOKEN_RE.match(plain):
        return False
    return True


def deleet(text: str, one_as: str = "i") -> str:
    """Rewrite leetspeak inside mixed letter/digit tokens; see module docstring."""
    table = _LEET_ONE_I if one_as == "i" else _LEET_ONE_L

    def fix(m: re.Match) -> str:
        tok = m.group(0)
        if not _is_leet_candidate(tok):
            return tok
        # keep leading/trailing "!", "|", "+" as punctuation
        lead = len(tok) - len(tok.lstrip("!|+"))
        trail = len(tok) - len(tok.rstrip("!|+"))
        core = tok[lead : len(tok) - trail] if trail else tok[lead:]
        core = "".join(table.get(c, c) for c in core)
        return tok[:lead] + core + (tok[len(tok) - trail :] if trail else "")

    return _TOKEN_RE.sub(fix, text)


# --- spelled-out words ------------------------------------------------------------
_SEP = r"[\s.\-_*·'`~^:/\\,|+]+"
_LETTER = r"[^\W\d_]"
_SPELLED_RE = re.compile(rf"(?<![\w])(?:{_LETTER}{_SEP}){{2,}}{_LETTER}(?![\w])")
_SEP_RE = re.compile(_SEP)


def join_spelled_out(text: str, keep_article: bool = False) -> str:
    """'n u d e' / 'n.u.d.e' / 'n-u-d-e' -> 'nude' (runs of >= 3 single letters).

    With ``keep_article`` a leading 'a'/'i' is kept as a separate word, so
    'a n u d e woman' -> 'a nude woman'.
    """

    def fix(m: re.Match) -> str:
        letters = _SEP_RE.sub("", m.group(0))
        if keep_article and letters[0] in "ai" and len(letters) > 3:
            return letters[0] + " " + letters[1:]
        return letters

    return _SPELLED_RE.sub(fix, text)


_INTRAWORD_RE = re.compile(r"(?<=[a-z])[.\-_*·'`~^]+(?=[a-z])")


def join_intraword(text: str) -> str:
    """Drop punctuation between letters: 'nu.de' -> 'nude', 'go_re' -> 'gore'."""
    return _INTRAWORD_RE.sub("", text)


_RUN3_RE = re.compile(r"([a-z])\1{2,}")
_RUN2_RE = re.compile(r"([a-z])\1+")


def collapse_repeats(text: str, min_run: int = 3) -> str:
    """min_run=3: 'gooood' -> 'good'. min_run=2: every doubled letter -> one."""
    if min_run >= 3:
        return _RUN3_RE.sub(r"\1\1", text)
    return _RUN2_RE.sub(r"\1", text)


def primary(text: str) -> str:
    """The single most readable normalisation (used for embeddings)."""
    t = canonicalize(text)
    t = deleet(t, "i")
    t = join_spelled_out(t, keep_article=True)
    return collapse_repeats(t, 3)


def variants(text: str) -> list[str]:
    """All normalised variants of ``text`` (deduplicated, primary first)."""
    base = canonicalize(text)
    leet_forms = [base]
    if any(c in _LEET_CHARS for c in base):
        for one_as in ("i", "l"):
            leet_forms.append(deleet(base, one_as))
    out: list[str] = []
    seen: set[str] = set()

    def add(s: str) -> None:
        s = _WS_RE.sub(" ", s).strip()
        if s not in seen:
            seen.add(s)
            out.append(s)

    add(primary(text))
    for form in dict.fromkeys(leet_forms):
        joined = [form, join_spelled_out(form, keep_article=True), join_spelled_out(form)]
        joined.append(join_intraword(joined[1]))
        for j in dict.fromkeys(joined):
            add(collapse_repeats(j, 3))
            add(collapse_repeats(j, 2))
            add(j)
    return out
