"""Prompt filter of the imagegen safety gate.

Runs on the Celery cpu worker before any GPU work. Pure Python + (optionally) torch;
it never imports Django, so it can be used from plain scripts::

    from safety.prompt_filter import PromptFilter
    verdict = PromptFilter.load().check("a red circle", negative_prompt="blurry")

Pipeline for ``check(prompt, negative_prompt)``:

1. Normalise the prompt into several variants (``safety.normalize.variants``).
2. Rules: every category's terms (whole words/phrases) and regex patterns are
   matched on every variant, after removing the category's exception phrases
   ("al gore", "naked eye"). A hit gives the category's ``rule_decision``.
3. Negative prompt: category terms there are *not* hits (people write "nudity,
   gore" in negative prompts to avoid them). Only a category's
   ``negative_prompt_terms`` (e.g. "clothes" for nudity: excluding clothes asks for
   nudity) count, and they give at most "review".
4. Semantics (unless a rule already blocked): cosine similarity between the MiniLM
   embedding of the normalised prompt (and of its clauses, for long prompts) and the
   category examples, max over examples; >= ``semantic_block`` blocks, >=
   ``semantic_review`` sends to review.
5. Block beats review beats allow; among equals a rule hit beats a semantic hit,
   then the higher score, then the category listed first in the policy.

Errors in the policy raise ``PolicyError`` at load time (fail closed).
"""
from __future__ import annotations

import copy
import json
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import normalize

DEFAULT_POLICY_PATH = Path(__file__).resolve().parent / "policy.json"
ENV_POLICY = "IMAGEGEN_SAFETY_POLICY"
ENV_EMBEDDINGS = "IMAGEGEN_SAFETY_EMBEDDINGS"  # "0"/"false" disables the semantic check

ALLOW, REVIEW, BLOCK = "allow", "review", "block"
_SEVERITY = {ALLOW: 0, REVIEW: 1, BLOCK: 2}
# A threshold above 1 disables that level (cosine similarity is <= 1).
_MAX_THRESHOLD = 1.01


class PolicyError(ValueError):
    """The policy file is missing or malformed. Callers must treat it as "not allowed"."""


@dataclass(frozen=True)
class PromptVerdict:
    decision: str  # "allow" | "review" | "block"
    category: str  # "" when allow
    score: float  # 1.0 for a rule hit, cosine similarity for a semantic hit, max similarity seen for allow
    reason: str  # readable by the end user; never echoes the prompt beyond the matched policy term
    policy_version: str
    matched: str = ""  # the term/pattern/example that matched, for moderators

    @property
    def allowed(self) -> bool:
        return self.decision == ALLOW


# --- policy model --------------------------------------------------------------------
_TERM_SEP = r"[\s_\-]+"
_LB = r"(?<![^\W_])"  # not preceded by a letter/digit (underscore counts as a separator)
_RB = r"(?![^\W_])"


def _term_key(s: str) -> str:
    return re.sub(_TERM_SEP, " ", s).strip()


def _phrase_regex(phrases: list[str]) -> re.Pattern | None:
    if not phrases:
        return None
    alts = sorted({_term_key(p) for p in phrases}, key=len, reverse=True)
    body = "|".join(_TERM_SEP.join(re.escape(w) for w in a.split(" ")) for a in alts)
    return re.compile(rf"{_LB}(?:{body}){_RB}")


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

    def __post_init__(self) -> None:
        self.term_re = _phrase_regex([normalize.canonicalize(t) for t in self.terms])
        self.term_by_key: dict[str, str] = {}
        for t in self.terms:  # first listed spelling wins ("self-harm" over "self harm")
            self.term_by_key.setdefault(_term_key(normalize.canonicalize(t)), t)
        self.exception_re = _phrase_regex([normalize.canonicalize(t) for t in self.exceptions])
        self.negative_re = _phrase_regex([normalize.canonicalize(t) for t in self.negative_prompt_terms])
        self.negative_by_key: dict[str, str] = {}
        for t in self.negative_prompt_terms:
            self.negative_by_key.setdefault(_term_key(normalize.canonicalize(t)), t)
        self.pattern_res = [re.compile(p) for p in self.patterns]

    def strip_exceptions(self, text: str) -> str:
        return self.exception_re.sub(" ", text) if self.exception_re else text


def _req(obj: dict, key: str, typ, where: str):
    if key not in obj:
        raise PolicyError(f"{where}: missing required key '{key}'")
    val = obj[key]
    if not isinstance(val, typ) or (typ is not bool and isinstance(val, bool)):
        tname = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise PolicyError(f"{where}: '{key}' must be {tname}, got {type(val).__name__}")
    return val


def _str_list(obj: dict, key: str, where: str, required: bool = True) -> list[str]:
    if key not in obj and not required:
        return []
    val = _req(obj, key, list, where)
    for i, item in enumerate(val):
        if not isinstance(item, str) or not item.strip():
            raise PolicyError(f"{where}: '{key}'[{i}] must be a non-empty string")
    return list(val)


def _threshold(obj: dict, defaults: dict, key: str, where: str) -> float:
    src = obj if key in obj else defaults
    if key not in src:
        raise PolicyError(f"{where}: missing required key '{key}' (and no default)")
    val = src[key]
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0.0 <= val <= _MAX_THRESHOLD:
        raise PolicyError(f"{where}: '{key}' must be a number in [0, {_MAX_THRESHOLD}], got {val!r}")
    return float(val)


def parse_policy(data: Any, source: str = "<policy>") -> tuple[str, list[Category], dict]:
    """Validate a decoded policy document; returns (version, categories, image section)."""
    if not isinstance(data, dict):
        raise PolicyError(f"{source}: the policy must be a JSON object")
    version = _req(data, "version", str, source)
    if not version.strip():
        raise PolicyError(f"{source}: 'version' must not be empty")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise PolicyError(f"{source}: 'defaults' must be an object")
    raw_cats = _req(data, "categories", list, source)
    if not raw_cats:
        raise PolicyError(f"{source}: 'categories' must not be empty")
    cats: list[Category] = []
    seen: set[str] = set()
    for i, rc in enumerate(raw_cats):
        where = f"{source}: categories[{i}]"
        if not isinstance(rc, dict):
            raise PolicyError(f"{where} must be an object")
        name = _req(rc, "name", str, where)
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise PolicyError(f"{where}: name {name!r} must be lower_snake_case")
        if name in seen:
            raise PolicyError(f"{where}: duplicate category name {name!r}")
        seen.add(name)
        where = f"{source}: category '{name}'"
        description = _req(rc, "description", str, where)
        decision = rc.get("rule_decision", defaults.get("rule_decision"))
        if decision not in (BLOCK, REVIEW):
            raise PolicyError(f"{where}: 'rule_decision' must be 'block' or 'review', got {decision!r}")
        review = _threshold(rc, defaults, "semantic_review", where)
        block = _threshold(rc, defaults, "semantic_block", where)
        if review > block:
            raise PolicyError(f"{where}: semantic_review ({review}) must be <= semantic_block ({block})")
        patterns = _str_list(rc, "patterns", where, required=False)
        for j, p in enumerate(patterns):
            try:
                re.compile(p)
            except re.error as exc:
                raise PolicyError(f"{where}: patterns[{j}] is not a valid regex: {exc}") from exc
        terms = _str_list(rc, "terms", where)
        examples = _str_list(rc, "examples", where, required=False)
        if not terms and not patterns and not examples:
            raise PolicyError(f"{where}: needs at least one of terms, patterns, examples")
        cats.append(
            Category(
                name=name,
                description=description,
                terms=terms,
                patterns=patterns,
                examples=examples,
                semantic_review=review,
                semantic_block=block,
                rule_decision=decision,
                exceptions=_str_list(rc, "exceptions", where, required=False),
                negative_prompt_terms=_str_list(rc, "negative_prompt_terms", where, required=False),
            )
        )
    image = data.get("image", {"labels": {}})
    if not isinstance(image, dict) or not isinstance(image.get("labels", {}), dict):
        raise PolicyError(f"{source}: 'image' must be an object with a 'labels' object")
    for label, spec in image.get("labels", {}).items():
        where = f"{source}: image.labels['{label}']"
        if not isinstance(spec, dict):
            raise PolicyError(f"{where} must be an object")
        cat = _req(spec, "category", str, where)
        if cat not in seen:
            raise PolicyError(f"{where}: unknown category {cat!r}")
        lo = _threshold(spec, {}, "review", where)
        hi = _threshold(spec, {}, "block", where)
        if lo > hi:
            raise PolicyError(f"{where}: review ({lo}) must be <= block ({hi})")
    return version, cats, image


# --- embeddings cache ----------------------------------------------------------------
_EXAMPLE_CACHE: dict[str, Any] = {}  # example text -> embedding row (per process)
_EXAMPLE_LOCK = threading.Lock()


def _embed_examples(embedder, texts: list[str]):
    import torch

    with _EXAMPLE_LOCK:
        missing = [t for t in dict.fromkeys(texts) if t not in _EXAMPLE_CACHE]
        if missing:
            for t, row in zip(missing, embedder.encode(missing)):
                _EXAMPLE_CACHE[t] = row
        return torch.stack([_EXAMPLE_CACHE[t] for t in texts])


_CLAUSE_SPLIT_RE = re.compile(r"[.;!?\n]+|,\s*(?:and\s+)?")


def semantic_texts(prompt_primary: str, max_clauses: int = 8) -> list[str]:
    """The texts embedded for one prompt: the whole prompt, plus its clauses when the
    prompt is long enough for a bad clause to be diluted by benign ones."""
    texts = [prompt_primary[:2000]]
    if len(prompt_primary.split()) > 12:
        parts = [p.strip() for p in _CLAUSE_SPLIT_RE.split(prompt_primary)]
        parts = [p for p in parts if len(p.split()) >= 3]
        # merge neighbours pairwise so tag lists become 2-tag phrases with some context
        clauses = [" ".join(parts[i : i + 2]) for i in range(0, len(parts), 2)] if len(parts) > 1 else []
        texts += clauses[:max_clauses]
    return texts


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


class PromptFilter:
    """Prompt classifier; construct with ``PromptFilter.load()``."""

    def __init__(self, version: str, categories: list[Category], image: dict, embedder=None, source: str = ""):
        self.version = version
        self.categories = categories
        self._image = image
        self.source = source
        self.embedder = embedder
        self._example_matrix = None
        self._example_owner: list[tuple[int, str]] = []  # row -> (category index, example)
        if embedder is not None:
            rows = [(ci, ex) for ci, c in enumerate(categories) for ex in c.examples]
            self._example_owner = rows
            if rows:
                self._example_matrix = _embed_examples(embedder, [ex for _, ex in rows])

    @classmethod
    def load(cls, policy_path: str | os.PathLike | None = None, use_embeddings: bool = True) -> "PromptFilter":
        """Load and validate a policy file (default: $IMAGEGEN_SAFETY_POLICY or safety/policy.json).

        Raises PolicyError on a missing/malformed file, and EmbeddingModelError when
        ``use_embeddings`` is set but the MiniLM model cannot be loaded.
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
        embedder = None
        if use_embeddings:
            from .embeddings import get_embedder

            embedder = get_embedder()
        return cls(version, cats, image, embedder=embedder, source=str(path))

    def image_thresholds(self) -> dict:
        """The policy's "image" section: {"labels": {label: {"category", "review", "block"}}}."""
        return copy.deepcopy(self._image)

    def category(self, name: str) -> Category:
        for c in self.categories:
            if c.name == name:
                return c
        raise KeyError(name)

    # -- checks --------------------------------------------------------------------
    def _rule_hits(self, variants: list[str]) -> list[_Hit]:
        hits = []
        for ci, cat in enumerate(self.categories):
            hit = None
            for v in variants:
                text = cat.strip_exceptions(v)
                m = cat.term_re.search(text) if cat.term_re else None
                if m:
                    term = cat.term_by_key.get(_term_key(m.group(0)), _term_key(m.group(0)))
                    reason = f"The prompt asks for {cat.description} (matched the term '{term}')."
                    hit = _Hit(cat.rule_decision, cat.name, 1.0, reason, term, ci, True)
                    break
                for pi, pat in enumerate(cat.pattern_res):
                    pm = pat.search(text)
                    if pm:
                        reason = f"The prompt asks for {cat.description} (matched a rule of the content policy)."
                        matched = f"pattern[{pi}] {cat.patterns[pi]} on '{pm.group(0)[:80]}'"
                        hit = _Hit(cat.rule_decision, cat.name, 1.0, reason, matched, ci, True)
                        break
                if hit:
                    break
            if hit:
                hits.append(hit)
        return hits

    def _negative_hits(self, negative_prompt: str) -> list[_Hit]:
        if not negative_prompt.strip():
            return []
        variants = normalize.variants(negative_prompt)
        hits = []
        for ci, cat in enumerate(self.categories):
            if not cat.negative_re:
                continue
            for v in variants:
                m = cat.negative_re.search(v)
                if m:
                    term = cat.negative_by_key.get(_term_key(m.group(0)), _term_key(m.group(0)))
                    reason = (
                        f"The negative prompt excludes '{term}', which steers the image towards "
                        f"{cat.description}."
                    )
                    hits.append(_Hit(REVIEW, cat.name, 1.0, reason, f"negative prompt: {term}", ci, True))
                    break
        return hits

    def similarities(self, prompt: str) -> dict[str, tuple[float, str]]:
        """Per category: (max cosine similarity, the example that gave it). Empty without embeddings."""
        if self.embedder is None or self._example_matrix is None:
            return {}
        texts = semantic_texts(normalize.primary(prompt))
        q = self.embedder.encode(texts)
        sims = (q @ self._example_matrix.T).max(dim=0).values.tolist()  # per example
        best: dict[str, tuple[float, str]] = {}
        for (ci, ex), s in zip(self._example_owner, sims):
            name = self.categories[ci].name
            if name not in best or s > best[name][0]:
                best[name] = (float(s), ex)
        return best

    def _semantic_hits(self, prompt: str) -> tuple[list[_Hit], float]:
        best = self.similarities(prompt)
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
            reason = f"The prompt looks like a request for {cat.description} (similarity {s:.2f})."
            hits.append(_Hit(decision, cat.name, round(s, 4), reason, f"example: {ex}", ci, False))
        return hits, max_sim

    def check(self, prompt: str, negative_prompt: str = "") -> PromptVerdict:
        if not isinstance(prompt, str) or not isinstance(negative_prompt, str):
            raise TypeError("prompt and negative_prompt must be str")
        hits = self._rule_hits(normalize.variants(prompt))
        hits += self._negative_hits(negative_prompt)
        max_sim = 0.0
        if not any(h.decision == BLOCK for h in hits) and prompt.strip():
            sem, max_sim = self._semantic_hits(prompt)
            hits += sem
        if not hits:
            return PromptVerdict(ALLOW, "", round(max_sim, 4), "The prompt is allowed.", self.version)
        top = min(hits, key=lambda h: (-_SEVERITY[h.decision], not h.rule, -h.score, h.rank))
        return PromptVerdict(top.decision, top.category, top.score, top.reason, self.version, top.matched)


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
    return _INSTANCE


def reset_prompt_filter() -> None:
    """Drop the cached instance (tests, or after editing the policy file)."""
    global _INSTANCE
    with _INSTANCE_LOCK:
        _INSTANCE = None
