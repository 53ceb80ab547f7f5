"""Prompt filter of the imagegen safety gate.

Runs on the Celery cpu worker before any GPU work. Pure Python + (optionally) torch;
it never imports Django, so it can be used from plain scripts::

    from safety.prompt_filter import PromptFilter
    verdict = PromptFilter.load().check("a red circle", negative_prompt="blurry")

Pipeline for ``check(prompt, negative_prompt)``:

1. Normalise (``safety.normalize.canonicalize``: Unicode forms, per-script look-alikes, marks),
   then read masked, split and leet words towards the policy's own words
   (``safety.lexicon.Lexicon.resolve``: ``n*ked``, ``p.o.r.n``, ``nu de``, ``su1c1de``).
2. Rules: every category's terms, euphemisms and translations (whole words on Unicode-aware
   boundaries, stems ``desnud*``, substrings in CJK, Arabic clitics; ``safety.prompt_rules``) and
   regex patterns are matched, minus the category's exception phrases ("al gore", "naked eye").
   A hit gives the category's ``rule_decision``.
3. Negative prompt: category terms there are *not* hits (people write "nudity, gore" in negative
   prompts to avoid them). Only a category's ``negative_prompt_terms`` (e.g. "clothes" for
   nudity: excluding clothes asks for nudity) count, and they give at most "review".
4. Semantics (unless a rule already blocked): the learned head (``safety.prompt_semantic``)
   scores the whole prompt when short and its highest-ranked clauses, so filler cannot dilute a
   clause; per category the max calibrated probability; >= ``semantic_block`` blocks,
   >= ``semantic_review`` sends to review. Categories the head was not trained on use the
   nearest-example cosine similarity instead, against the same thresholds.
5. Block beats review beats allow; among equals a rule hit beats a semantic hit, then the
   higher score, then the category listed first in the policy.

Errors in the policy raise ``PolicyError`` at load time (fail closed).
"""
from __future__ import annotations

import copy
import json
import logging
import os
import re
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import normalize
from .language import LanguageID, LanguageReading
from .language_policy import LanguagePolicy, parse_languages
from .lexicon import Lexicon
from .policy_base import LANGUAGES, PolicyError, PolicySpec, validate  # noqa: F401  (PolicyError: callers import it from here)
from .prompt_rules import TermError, TermMatcher
from .prompt_semantic import (  # noqa: F401  (HeadError: re-exported)
    DEFAULT_HEAD_NAME,
    MODELS_DIR,
    EmbeddingCache,
    HeadError,
    SemanticHead,
    texts_to_embed,
)

DEFAULT_POLICY_PATH = Path(__file__).resolve().parent / "policy.json"
ENV_POLICY = "IMAGEGEN_SAFETY_POLICY"
ENV_EMBEDDINGS = "IMAGEGEN_SAFETY_EMBEDDINGS"  # "0"/"false" disables the semantic check

ALLOW, REVIEW, BLOCK = "allow", "review", "block"
_SEVERITY = {ALLOW: 0, REVIEW: 1, BLOCK: 2}
UNDECLARED_LANGUAGE = "undeclared_language"  # the category of a fallback verdict
READINGS_CACHE_SIZE = 1024  # prompts
EMBEDDING_CACHE_SIZE = 4096  # clauses (384 floats each: ~6 MB)


@dataclass(frozen=True)
class PromptVerdict:
    decision: str  # "allow" | "review" | "block"
    category: str  # "" when allow
    score: float  # 1.0 for a rule hit, cosine similarity for a semantic hit, max similarity seen for allow
    reason: str  # readable by the end user; never echoes the prompt beyond the matched policy term
    policy_version: str
    matched: str = ""  # the term/pattern/example that matched, for moderators
    language: str = ""  # the detected language (ISO 639-1 where there is one; "und": no letters)
    languages: tuple[str, ...] = ()  # declared languages it might be, then undeclared ones found

    @property
    def allowed(self) -> bool:
        return self.decision == ALLOW


# --- policy model --------------------------------------------------------------------


@dataclass
class Category:
    name: str
    description: str
    terms: list[str]
    patterns: list[str]
    examples: list[str]
    semantic_review: float
    semantic_block: float
    rule_decision: str
    exceptions: list[str] = field(default_factory=list)
    negative_prompt_terms: list[str] = field(default_factory=list)
    euphemisms: list[str] = field(default_factory=list)
    translations: dict[str, list[str]] = field(default_factory=dict)
    benign_contexts: list[dict] = field(default_factory=list)  # {"terms", "words", "window"}

    def __post_init__(self) -> None:
        self.pattern_res = [re.compile(p) for p in self.patterns]

    def all_terms(self) -> list[str]:
        return self.terms + self.euphemisms + [t for lang in sorted(self.translations) for t in self.translations[lang]]


def parse_policy(data: Any, source: str = "<policy>") -> tuple[str, list[Category], dict]:
    """Validate a decoded policy document (safety/policy_base.PolicySpec); returns (version,
    categories, image section)."""
    spec = validate(PolicySpec, data, source)
    cats = [
        Category(
            name=c.name, description=c.description, terms=list(c.terms), patterns=list(c.patterns),
            examples=list(c.examples), semantic_review=c.semantic_review, semantic_block=c.semantic_block,
            rule_decision=c.rule_decision, exceptions=list(c.exceptions),
            negative_prompt_terms=list(c.negative_prompt_terms), euphemisms=list(c.euphemisms),
            translations={lang: list(terms) for lang, terms in c.translations.items()},
            benign_contexts=[{"terms": list(b.terms), "words": list(b.words), "window": b.window}
                             for b in c.benign_contexts],
        )
        for c in spec.categories
    ]
    return spec.version, cats, data.get("image", {"labels": {}})


def _build_matchers(cats: list[Category], source: str) -> tuple[TermMatcher, TermMatcher, Lexicon]:
    terms, negatives = TermMatcher(), TermMatcher()
    pattern_words: set[str] = set()
    for ci, c in enumerate(cats):
        where = f"{source}: category '{c.name}'"
        try:
            for t in c.all_terms():
                terms.add(t, ci)
            for t in c.exceptions:
                terms.add(t, ci, exception=True)
            for t in c.negative_prompt_terms:
                negatives.add(t, ci)
            known = {normalize.canonicalize(t) for t in c.all_terms()}
            for i, ctx in enumerate(c.benign_contexts):
                unknown = [t for t in ctx["terms"] if normalize.canonicalize(t) not in known]
                if unknown:
                    raise TermError(f"benign_contexts[{i}]: {unknown[0]!r} is not a term of this category")
                terms.add_context(ctx["terms"], ctx["words"], ci, ctx["window"])
        except TermError as exc:
            raise PolicyError(f"{where}: {exc}") from exc
        for p in c.patterns:  # literal words of the patterns ("committing", "suicide", "kids")
            pattern_words.update(re.findall(r"(?<![\\])[a-z]{4,}", p))
    lexicon = Lexicon(terms.words | pattern_words, terms.stems)
    return terms, negatives, lexicon


# --- embeddings cache ----------------------------------------------------------------
_EXAMPLE_CACHE: dict[str, Any] = {}  # example text -> embedding row (per process)
_EXAMPLE_LOCK = threading.Lock()


def _embed_examples(embedder, texts: list[str]):
    import torch

    with _EXAMPLE_LOCK:
        missing = [t for t in dict.fromkeys(texts) if t not in _EXAMPLE_CACHE]
        if missing:
            for t, row in zip(missing, embedder.encode(missing), strict=True):
                _EXAMPLE_CACHE[t] = row
        return torch.stack([_EXAMPLE_CACHE[t] for t in texts])


# --- the filter ------------------------------------------------------------------------
@dataclass(frozen=True)
class _Hit:
    decision: str
    category: str
    score: float
    reason: str
    matched: str
    rank: int  # policy order (lower = listed first)
    rule: bool
    strength: float = float("inf")  # tie-break among semantic hits: the head's calibrated logit


class PromptFilter:
    """Prompt classifier; construct with ``PromptFilter.load()``."""

    def __init__(self, version: str, categories: list[Category], image: dict, embedder=None, source: str = "",
                 head: SemanticHead | None = None, languages: LanguagePolicy | None = None):
        self.version = version
        if languages is None:  # a policy without a "languages" section: the languages it has words for
            languages = LanguagePolicy.default(c.translations for c in categories)
        self.languages = languages
        self.language_id = LanguageID(languages.declared)
        self.categories = categories
        self._image = image
        self.source = source
        self.embedder = embedder
        self.head = head if embedder is not None else None
        self._terms, self._negatives, self.lexicon = _build_matchers(categories, source or "<policy>")
        # Bounded caches (a retried prompt, repeated clauses and style tags): readings by raw
        # prompt, sentence embeddings by clause.
        self.embedding_cache = EmbeddingCache(EMBEDDING_CACHE_SIZE)
        self._readings: OrderedDict[str, list[str]] = OrderedDict()
        self._readings_lock = threading.Lock()
        self._exception_keys: dict[int, list[str]] = {}
        self._example_matrix = None
        self._example_owner: list[tuple[int, str]] = []  # row -> (category index, example)
        # category index -> column of the head (categories the head was trained on)
        self._head_col: dict[int, int] = {}
        if self.head is not None:
            for ci, c in enumerate(categories):
                if c.name in self.head.categories:
                    self._head_col[ci] = self.head.categories.index(c.name)
        if embedder is not None:
            rows = [(ci, ex) for ci, c in enumerate(categories) for ex in c.examples]
            self._example_owner = rows
            if rows:
                self._example_matrix = _embed_examples(embedder, [ex for _, ex in rows])

    @classmethod
    def load(cls, policy_path: str | os.PathLike | None = None, use_embeddings: bool = True,
             head_dir: str | os.PathLike | None = None) -> PromptFilter:
        """Load and validate a policy file (default: $IMAGEGEN_SAFETY_POLICY or safety/policy.json).

        Raises PolicyError on a missing/malformed file, EmbeddingModelError when
        ``use_embeddings`` is set but the MiniLM model cannot be loaded, and HeadError when the
        classifier head (``models/<prompt_head>``, the policy's "prompt_head", default
        ``prompt-head-v2``; its config.json must carry the same name) cannot.
        """
        path = Path(policy_path or os.environ.get(ENV_POLICY) or DEFAULT_POLICY_PATH)
        try:
            raw = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyError(f"cannot read safety policy {path}: {exc}") from exc
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise PolicyError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
        version, cats, image = parse_policy(data, str(path))
        languages = parse_languages(data, cats, str(path))
        head_name = data.get("prompt_head", DEFAULT_HEAD_NAME)
        if not isinstance(head_name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", head_name):
            raise PolicyError(f"{path}: 'prompt_head' must name a folder of models/ (e.g. {DEFAULT_HEAD_NAME!r}), got {head_name!r}")
        embedder = head = None
        if use_embeddings:
            from .embeddings import get_embedder

            embedder = get_embedder()
            if head_dir is None:
                head = SemanticHead.load(MODELS_DIR / head_name)
                if head.name != head_name:
                    raise HeadError(f"{MODELS_DIR / head_name}: config.json names {head.name!r}, the policy {head_name!r}")
            else:
                head = SemanticHead.load(Path(head_dir))
        return cls(version, cats, image, embedder=embedder, source=str(path), head=head, languages=languages)

    def image_thresholds(self) -> dict:
        """The policy's "image" section: {"labels": {label: {"category", "review", "block"}}}."""
        return copy.deepcopy(self._image)

    def category(self, name: str) -> Category:
        for c in self.categories:
            if c.name == name:
                return c
        raise KeyError(name)

    def readings(self, prompt: str) -> list[str]:
        """The normalised texts the rules run on: the lexicon-resolved reading first (also what
        the embedder reads), then the plain canonical form."""
        with self._readings_lock:
            cached = self._readings.get(prompt)
            if cached is not None:
                self._readings.move_to_end(prompt)
                return list(cached)
        canon = normalize.canonicalize(prompt)
        out = list(dict.fromkeys([self.lexicon.resolve(canon), canon]))
        with self._readings_lock:
            self._readings[prompt] = out
            while len(self._readings) > READINGS_CACHE_SIZE:
                self._readings.popitem(last=False)
        return list(out)

    def clear_caches(self) -> None:
        """Forget cached readings and clause embeddings (the benchmark's cold figures)."""
        with self._readings_lock:
            self._readings.clear()
        self.embedding_cache.clear()

    # -- checks --------------------------------------------------------------------
    def _rule_hits(self, texts: list[str]) -> list[_Hit]:
        found: dict[int, _Hit] = {}
        for text in texts:
            for ci, (term, _) in self._terms.find(text).items():
                if ci not in found:
                    cat = self.categories[ci]
                    reason = f"The prompt asks for {cat.description} (matched the term '{term}')."
                    found[ci] = _Hit(cat.rule_decision, cat.name, 1.0, reason, term, ci, True)
        for ci, cat in enumerate(self.categories):
            if ci in found or not cat.pattern_res:
                continue
            for text in texts:
                stripped = self._strip_exceptions(ci, text)
                for pi, pat in enumerate(cat.pattern_res):
                    pm = pat.search(stripped)
                    if pm:
                        reason = f"The prompt asks for {cat.description} (matched a rule of the content policy)."
                        matched = f"pattern[{pi}] {cat.patterns[pi]} on '{pm.group(0)[:80]}'"
                        found[ci] = _Hit(cat.rule_decision, cat.name, 1.0, reason, matched, ci, True)
                        break
                if ci in found:
                    break
        return [found[ci] for ci in sorted(found)]

    def _strip_exceptions(self, ci: int, text: str) -> str:
        keys = self._exception_keys.get(ci)
        if keys is None:
            keys = self._exception_keys[ci] = [normalize.canonicalize(e) for e in self.categories[ci].exceptions]
        low = text
        for key in keys:
            if key and key in low:
                low = re.sub(rf"(?<![^\W_]){re.escape(key)}(?![^\W_])", " ", low)
        return low

    def _negative_hits(self, negative_prompt: str) -> list[_Hit]:
        if not negative_prompt.strip():
            return []
        hits = []
        done: set[int] = set()
        for text in self.readings(negative_prompt):
            for ci, (term, _) in self._negatives.find(text).items():
                if ci in done:
                    continue
                done.add(ci)
                cat = self.categories[ci]
                reason = (
                    f"The negative prompt excludes '{term}', which steers the image towards "
                    f"{cat.description}."
                )
                hits.append(_Hit(REVIEW, cat.name, 1.0, reason, f"negative prompt: {term}", ci, True))
        return hits

    def similarities(self, prompt: str, resolved: str | None = None) -> dict[str, tuple[float, str]]:
        """Per category: (score, the policy example nearest to the prompt). The score is the head's
        calibrated probability for categories it was trained on, else the max cosine similarity
        with the category's examples. Empty without embeddings."""
        if self.embedder is None:
            return {}
        import torch

        text = resolved if resolved is not None else self.readings(prompt)[0]
        texts = texts_to_embed(text, self.embedder, self.head)
        self._last_logits: dict[str, float] = {}
        q = self.embedding_cache.encode(self.embedder, texts)
        best: dict[str, tuple[float, str]] = {}
        if self._example_matrix is not None:
            sims = (q @ self._example_matrix.T).max(dim=0).values.tolist()  # per example
            for (ci, ex), s in zip(self._example_owner, sims, strict=True):
                name = self.categories[ci].name
                if name not in best or s > best[name][0]:
                    best[name] = (float(s), ex)
        if self._head_col and self.head is not None:
            probs = self.head.probabilities(q).max(dim=0).values
            # the logit tells apart two categories that both saturate near 1.0
            logits = torch.logit(probs.clamp(1e-12, 1 - 1e-12)).tolist()
            for ci, col in self._head_col.items():
                name = self.categories[ci].name
                # capped below 1.0: a score of exactly 1.0 means a rule hit
                best[name] = (min(float(probs[col]), 0.9999), best.get(name, (0.0, ""))[1])
                self._last_logits[name] = logits[col]
        return best

    def _semantic_hits(self, prompt: str, resolved: str) -> tuple[list[_Hit], float]:
        best = self.similarities(prompt, resolved)
        hits = []
        max_sim = 0.0
        for ci, cat in enumerate(self.categories):
            if cat.name not in best:
                continue
            s, ex = best[cat.name]
            max_sim = max(max_sim, s)
            if s >= cat.semantic_block:
                decision = BLOCK
            elif s >= cat.semantic_review:
                decision = REVIEW
            else:
                continue
            if ci in self._head_col:
                reason = f"The prompt looks like a request for {cat.description} (classifier score {s:.2f})."
                head = self.head.name if self.head is not None else "head"
                matched = f"example: {ex} (nearest example; classifier {head} {s:.2f})" if ex else f"classifier {head} {s:.2f}"
            else:
                reason = f"The prompt looks like a request for {cat.description} (similarity {s:.2f})."
                matched = f"example: {ex}"
            strength = self._last_logits.get(cat.name, s)
            hits.append(_Hit(decision, cat.name, round(s, 4), reason, matched, ci, False, strength))
        return hits, max_sim

    def identify_language(self, prompt: str, resolved: str | None = None) -> LanguageReading:
        """The prompt's language against the policy's declared ones. A prompt that reads as
        undeclared is read again after normalisation (homoglyphs, spaced and masked letters confuse
        the identifier: "p o r n", "hеntаi"); the second reading wins when it is readable by more
        than its script (normalisation folds look-alike scripts to Latin: Armenian մերկ would
        otherwise pass as an uncertain Latin text)."""
        reading = self.language_id.identify(prompt)
        if reading.unreadable and resolved is not None and resolved != prompt:
            again = self.language_id.identify(resolved)
            if again.readable and not again.by_script:
                return again
        return reading

    def _language_hit(self, reading: LanguageReading) -> _Hit | None:
        action = self.languages.undeclared
        if reading.readable or action == ALLOW:
            return None
        reason = self.languages.reason(reading.unreadable, action)
        matched = f"language: {', '.join(reading.unreadable)} (not declared; fallback {action})"
        return _Hit(action, UNDECLARED_LANGUAGE, 1.0, reason, matched, len(self.categories), True)

    def check(self, prompt: str, negative_prompt: str = "") -> PromptVerdict:
        if not isinstance(prompt, str) or not isinstance(negative_prompt, str):
            raise TypeError("prompt and negative_prompt must be str")
        texts = self.readings(prompt)
        reading = self.identify_language(prompt, texts[0])
        language, languages = reading.language, reading.candidates + reading.unreadable
        hits = self._rule_hits(texts)
        hits += self._negative_hits(negative_prompt)
        fallback = self._language_hit(reading)
        if fallback is not None:
            hits.append(fallback)
        max_sim = 0.0
        if not any(h.decision == BLOCK for h in hits) and texts[0].strip():
            sem, max_sim = self._semantic_hits(prompt, texts[0])
            hits += sem
        if not hits:
            return PromptVerdict(ALLOW, "", round(max_sim, 4), "The prompt is allowed.", self.version, "", language, languages)
        top = min(hits, key=lambda h: (-_SEVERITY[h.decision], not h.rule, -h.score, -h.strength, h.rank))
        return PromptVerdict(top.decision, top.category, top.score, top.reason, self.version, top.matched, language, languages)


    def check_many(self, items: list[tuple[str, str]]) -> list[PromptVerdict | Exception]:
        """check() for several (prompt, negative prompt) pairs, the same verdict each, with the
        encoder run once for all of their clauses (EmbeddingCache.warm) rather than once per
        prompt. A pair whose check raised gets its exception in its place; the others stand."""
        if self.embedder is not None and len(items) > 1:
            texts: list[str] = []
            for prompt, _ in items:
                try:
                    reading = self.readings(prompt)[0] if isinstance(prompt, str) else ""
                except Exception:  # its own check() below raises it again, in its place
                    continue
                if reading.strip():
                    texts += texts_to_embed(reading, self.embedder, self.head)
            if texts:
                self.embedding_cache.warm(self.embedder, texts)
        out: list[PromptVerdict | Exception] = []
        for prompt, negative in items:
            try:
                out.append(self.check(prompt, negative))
            except Exception as exc:
                out.append(exc)
        return out


# --- process-wide instance -----------------------------------------------------------
_INSTANCE: PromptFilter | None = None
_INSTANCE_LOCK = threading.Lock()


def _configured_policy_path() -> str | None:
    """$IMAGEGEN_SAFETY_POLICY, else Django's settings.IMAGEGEN_SAFETY_POLICY, else None (default file).

    Django is consulted only if it is already imported and configured: this module
    must stay importable (and fast) without Django.
    """
    env = os.environ.get(ENV_POLICY)
    if env:
        return env
    conf = sys.modules.get("django.conf")
    if conf is not None:
        try:
            settings = conf.settings
            if settings.configured and getattr(settings, ENV_POLICY, None):
                return str(getattr(settings, ENV_POLICY))
        except Exception:  # pragma: no cover - misconfigured Django: use the default file
            pass
    return None


def get_prompt_filter() -> PromptFilter:
    """Process-wide cached filter (policy: env/settings IMAGEGEN_SAFETY_POLICY, else safety/policy.json;
    embeddings unless IMAGEGEN_SAFETY_EMBEDDINGS is 0/false/no/off)."""
    global _INSTANCE
    if _INSTANCE is None:
        with _INSTANCE_LOCK:
            if _INSTANCE is None:
                use_emb = os.environ.get(ENV_EMBEDDINGS, "1").strip().lower() not in ("0", "false", "no", "off")
                _INSTANCE = PromptFilter.load(_configured_policy_path(), use_embeddings=use_emb)
                logging.getLogger(__name__).info("prompt filter loaded in process %s", os.getpid())
    return _INSTANCE


def reset_prompt_filter() -> None:
    """Drop the cached instance (tests, or after editing the policy file)."""
    global _INSTANCE
    with _INSTANCE_LOCK:
        _INSTANCE = None
