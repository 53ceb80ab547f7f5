"""The learned semantic check of the prompt filter: clause selection and the classifier head.

Two heads, both trained by ``training/train_prompt_head.py`` on a generated corpus
(``training/prompt_corpus.py``) and shipped as ``models/prompt-head-v2`` (v1: the same without the
hidden layer):

* the **ranker** reads a bag of MiniLM's static word-piece embeddings (no encoder pass; v2: one
  hidden layer of 128 GELU units): it scores every clause of the prompt, however many, in well under
  a millisecond;
* the **head** reads the MiniLM sentence embedding (one hidden layer of 256 GELU units shared by
  the categories, then one output per category) and gives, per category, a probability calibrated
  on the tune split (Platt scaling); the policy's ``semantic_review`` and ``semantic_block``
  thresholds apply to it.

A prompt is embedded as a whole when it is short, and its clauses (and neighbouring pairs) are
ranked; the highest-ranked ones are embedded too, up to ``MAX_SEGMENTS`` of at most
``SEGMENT_WORDS`` words, but only those the ranker scores at or above the head's ``rank_gate``
(calibrated by the trainer so that the best clause of 99.5% of the tune split's disallowed prompts
passes it); a long prompt whose clauses all stay below the gate still has its top clause embedded.
A disallowed clause is scored on its own whatever surrounds it, so filler cannot dilute it, and the
encoder's cost is bounded (at most ``WHOLE_MAX_TOKENS`` + ``MAX_SEGMENTS`` x ~``SEGMENT_WORDS``
word pieces, all in one batched encoder call) whatever the prompt's length; ordinary prompts,
whose clauses stay below the gate, cost one or two short texts.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_HEAD_NAME = "prompt-head-v2"
MODELS_DIR = Path(__file__).resolve().parents[1] / "models"
DEFAULT_HEAD_DIR = MODELS_DIR / DEFAULT_HEAD_NAME
WHOLE_MAX_TOKENS = 40  # a prompt up to this many word pieces is also embedded whole
SEGMENT_WORDS = 12  # words per segment; longer clauses are cut into overlapping windows
SEGMENT_STRIDE = 8
MAX_SEGMENTS = 3  # segments embedded per prompt besides the whole (v1: 4)
MAX_CANDIDATES = 400  # clauses ranked per prompt (a 2,000-character prompt has ~100)

_CLAUSE_RE = re.compile(r"[.;!?\n|]+|,|\s[-–—]+\s|\s+(?:and then|while|but)\s+")


class HeadError(RuntimeError):
    """The head files are missing or do not fit the embedder."""


def clauses(text: str) -> list[str]:
    """Clauses of a prompt (split on sentence and list punctuation); long ones cut into windows."""
    out: list[str] = []
    for part in _CLAUSE_RE.split(text):
        words = part.split()
        if not words:
            continue
        if len(words) <= SEGMENT_WORDS:
            out.append(" ".join(words))
            continue
        for s in range(0, max(1, len(words) - SEGMENT_WORDS + SEGMENT_STRIDE), SEGMENT_STRIDE):
            out.append(" ".join(words[s : s + SEGMENT_WORDS]))
    return out


def candidates(text: str) -> list[str]:
    """Clauses plus neighbouring pairs of short clauses (a meaning can straddle a comma:
    "a woman, no clothes"), deduplicated, in order."""
    cs = clauses(text)
    out = list(cs)
    for a, b in zip(cs, cs[1:], strict=False):
        if len(a.split()) + len(b.split()) <= SEGMENT_WORDS:
            out.append(f"{a}, {b}")
    return list(dict.fromkeys(out))[:MAX_CANDIDATES]


@dataclass
class SemanticHead:
    categories: list[str]
    head_w: object  # torch (C, H): H = 384 (linear, v1) or the hidden layer's width
    head_b: object  # (C,)
    calib_a: object  # (C,) Platt slope
    calib_b: object  # (C,) Platt intercept
    rank_w: object  # (C, 384)
    rank_b: object  # (C,)
    meta: dict
    hid_w: object = None  # (H, 384): one hidden layer (GELU) shared by the categories (v2), or None
    hid_b: object = None  # (H,)
    rank_hid_w: object = None  # (Hr, 384): the ranker's hidden layer (v2), or None (linear, v1)
    rank_hid_b: object = None  # (Hr,)

    @property
    def name(self) -> str:
        """The head's identity (``config.json`` "name", e.g. ``prompt-head-v2``)."""
        return str(self.meta.get("name") or "prompt-head-v1")

    @property
    def rank_gate(self) -> float:
        """Ranker logit a clause needs to be embedded besides the top one (-inf: the top
        ``MAX_SEGMENTS`` always, as prompt-head-v1 did)."""
        g = self.meta.get("rank_gate")
        return float(g) if isinstance(g, (int, float)) and not isinstance(g, bool) else float("-inf")

    @classmethod
    def load(cls, head_dir: str | Path | None = None) -> SemanticHead:
        from safetensors.torch import load_file

        d = Path(head_dir) if head_dir else DEFAULT_HEAD_DIR
        try:
            meta = json.loads((d / "config.json").read_text())
            t = load_file(str(d / "head.safetensors"))
        except (OSError, ValueError) as exc:
            raise HeadError(f"cannot load the prompt classifier head from {d}: {exc}") from exc
        cats = meta.get("categories")
        need = ("head_w", "head_b", "calib_a", "calib_b", "rank_w", "rank_b")
        if not isinstance(cats, list) or any(k not in t for k in need):
            raise HeadError(f"{d}: config.json needs 'categories' and head.safetensors {', '.join(need)}")
        hid_w, hid_b = t.get("hid_w"), t.get("hid_b")
        width = 384 if hid_w is None else hid_w.shape[0]
        if hid_w is not None and (hid_w.shape != (width, 384) or hid_b is None or hid_b.shape != (width,)):
            raise HeadError(f"{d}: hidden layer shapes {tuple(hid_w.shape)} do not fit (H, 384) and (H,)")
        rhid_w, rhid_b = t.get("rank_hid_w"), t.get("rank_hid_b")
        rwidth = 384 if rhid_w is None else rhid_w.shape[0]
        if rhid_w is not None and (rhid_w.shape != (rwidth, 384) or rhid_b is None or rhid_b.shape != (rwidth,)):
            raise HeadError(f"{d}: ranker hidden layer shapes {tuple(rhid_w.shape)} do not fit (Hr, 384) and (Hr,)")
        if t["head_w"].shape != (len(cats), width) or t["rank_w"].shape != (len(cats), rwidth):
            raise HeadError(f"{d}: head shapes {tuple(t['head_w'].shape)}, {tuple(t['rank_w'].shape)} do not fit "
                            f"{len(cats)} categories x {width}, {rwidth}")
        return cls(cats, t["head_w"], t["head_b"], t["calib_a"], t["calib_b"], t["rank_w"], t["rank_b"], meta,
                   hid_w, hid_b, rhid_w, rhid_b)

    def logits(self, emb):
        """(n, 384) unit sentence embeddings -> (n, C) uncalibrated logits."""
        import torch

        x = emb if self.hid_w is None else torch.nn.functional.gelu(emb @ self.hid_w.T + self.hid_b)
        return x @ self.head_w.T + self.head_b

    def probabilities(self, emb):
        """(n, 384) unit sentence embeddings -> (n, C) calibrated probabilities."""
        import torch

        return torch.sigmoid(self.calib_a * self.logits(emb) + self.calib_b)

    def rank(self, bags):
        """(n, 384) bags of word pieces -> (n,) the highest ranker logit over categories."""
        import torch

        x = bags if self.rank_hid_w is None else torch.nn.functional.gelu(bags @ self.rank_hid_w.T + self.rank_hid_b)
        return (x @ self.rank_w.T + self.rank_b).max(dim=1).values


def texts_to_embed(text: str, embedder, head: SemanticHead | None) -> list[str]:
    """What the encoder sees for one (normalised) prompt: see the module docstring."""
    cands = candidates(text)
    whole_ids = embedder.token_ids([text])[0]
    out: list[str] = []
    if len(whole_ids) <= WHOLE_MAX_TOKENS:
        out.append(text)
    if len(cands) <= 1 and out:
        return out
    cands = [c for c in cands if c != text]
    if not cands:
        return out
    if head is not None:
        scores = head.rank(embedder.bag(embedder.token_ids(cands))).tolist()
        order = sorted(range(len(cands)), key=lambda i: -scores[i])
        gate = head.rank_gate
        keep = [i for i in order[:MAX_SEGMENTS] if scores[i] >= gate]
        if not keep and not out:
            keep = order[:1]
        cands = [cands[i] for i in sorted(keep)]
    elif len(cands) > MAX_SEGMENTS:  # no ranker: the longest clauses first (most content)
        order = sorted(range(len(cands)), key=lambda i: -len(cands[i]))
        cands = [cands[i] for i in sorted(order[:MAX_SEGMENTS])]
    return out + cands


class EmbeddingCache:
    """A bounded LRU of sentence embeddings by text: clauses repeat across prompts (style tags,
    "highly detailed, 8k", a user's retries), and one row costs ~1-2 ms of encoder per clause."""

    def __init__(self, size: int = 4096):
        import threading
        from collections import OrderedDict

        self.size = size
        self._rows: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()

    def warm(self, embedder, texts: list[str], per_call: int = 512) -> dict[str, Any]:
        """Encode the texts not cached in as few encoder calls as their tokens allow (about
        `per_call` tokens packed into each), keep them, and return every row by text: a batch of
        prompts' clauses costs one forward instead of one per prompt (the per-call overhead of a
        6-layer encoder on short inputs is most of a short prompt's check)."""
        with self._lock:
            rows: dict[str, Any] = {t: self._rows[t] for t in texts if t in self._rows}
        missing = [t for t in dict.fromkeys(texts) if t not in rows]
        if not missing:
            return rows
        lengths = [len(ids) + 2 for ids in embedder.token_ids(missing)]
        packed = getattr(embedder, "encode_packed", None)
        start = 0
        while start < len(missing):
            end, used = start, 0
            while end < len(missing) and (end == start or used + lengths[end] <= per_call):
                used += lengths[end]
                end += 1
            chunk = missing[start:end]
            fresh = packed(chunk, fast=True) if packed is not None else embedder.encode(chunk, fast=True)
            for t, row in zip(chunk, fresh, strict=True):
                rows[t] = row
            start = end
        with self._lock:
            for t in missing:
                if self.size:
                    self._rows[t] = rows[t]
                    self._rows.move_to_end(t)
            while len(self._rows) > self.size:
                self._rows.popitem(last=False)
        return rows

    def encode(self, embedder, texts: list[str]):
        """Rows for ``texts`` (n, 384); only the ones not cached go to the encoder, in one call."""
        import torch

        with self._lock:
            rows: dict[str, Any] = {t: self._rows[t] for t in texts if t in self._rows}
            for t in rows:
                self._rows.move_to_end(t)
        missing = [t for t in dict.fromkeys(texts) if t not in rows]
        if missing:
            packed = getattr(embedder, "encode_packed", None)
            fresh = packed(missing, fast=True) if packed is not None else embedder.encode(missing, fast=True)
            with self._lock:
                for t, row in zip(missing, fresh, strict=True):
                    rows[t] = row
                    if self.size:
                        self._rows[t] = row
                        self._rows.move_to_end(t)
                while len(self._rows) > self.size:
                    self._rows.popitem(last=False)
        return torch.stack([rows[t] for t in texts])
