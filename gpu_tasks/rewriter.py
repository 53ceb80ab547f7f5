"""The prompt rewriter (issue 30): a small sequence-to-sequence model that turns a free-form
description ("a vermilion pebble against a cerulean sky") into the caption grammar the shipped
image model was trained on ("a red circle on a blue background").

Any causal or sequence-to-sequence model that transformers loads from disk can take the
shipped one's place (``IMAGEGEN_REWRITER_PATH``). What the serving code guarantees whatever the
model writes:

* a prompt already in the grammar is left exactly as it is (the model is not even asked);
* a rewrite that is not in the grammar, or the model's ``<keep>`` (nothing it can draw), keeps
  the user's prompt unchanged;
* one forward pass rewrites a batch of prompts (greedy decoding, a bounded output length);
* a colour or a shape outside the grammar is drawn as its nearest drawable one and said so
  (gpu_tasks/nearest.py, issue 45 item 11): the model reads the prompt with those words already
  replaced, and a rewrite that loses one of them (pink drawn as black) is not taken; a prompt
  naming only things the model cannot draw (a cat) is kept as written, with a note saying so.
  ``Rewrite.notes`` says, in words for the user, each substitution made.

The rewriter's identity (for the cache key and the job record: its folder name, the hash of its
files and its decoding settings) is jobs.pipeline.rewrite.identity, read once at load.
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from gpu_tasks import nearest
from gpu_tasks.nearest import COLOURS, SHAPE_KINDS
from jobs.pipeline.rewrite import MAX_NEW_TOKENS, identity, model_version

KEEP = "<keep>"
__all__ = ["COLOURS", "KEEP", "SHAPE_KINDS", "Rewrite", "Rewriter", "model_version", "parse_canonical"]

_CANON = re.compile(
    r"^a (?:(?:small|large) )?(?P<c1>\w+) (?P<k1>\w+)(?: and a (?:(?:small|large) )?(?P<c2>\w+) (?P<k2>\w+))?"
    r" on a (?P<bg>\w+) background$")


def parse_canonical(text: str) -> dict | None:
    """The scene of a caption in the model's grammar, or None where the text is not one."""
    m = _CANON.match(text.strip())
    if not m:
        return None
    d = m.groupdict()
    colours = [d["c1"]] + ([d["c2"]] if d["c2"] else [])
    kinds = [d["k1"]] + ([d["k2"]] if d["k2"] else [])
    if any(c not in COLOURS for c in [*colours, d["bg"]]) or any(k not in SHAPE_KINDS for k in kinds):
        return None
    if d["bg"] in colours or len(set(colours)) != len(colours):
        return None
    return {"colours": colours, "kinds": kinds, "background": d["bg"]}


@dataclass(frozen=True)
class Rewrite:
    prompt: str         # what the image model is given
    changed: bool       # False: the user's prompt, as written
    notes: tuple[str, ...] = ()  # what was substituted, or is not drawable, in words for the user


def _draws(scene: dict | None, m: nearest.Mention) -> bool:
    return scene is not None and m.drawn in (scene["kinds"] if m.kind else {*scene["colours"], scene["background"]})


def _kept(scene: dict, plan: nearest.Plan) -> bool:
    """Whether a rewrite keeps every nearest drawable the mapping chose, and draws no shape for a
    thing the model cannot draw."""
    if not all(_draws(scene, m) for m in plan.mentions if not m.trained):
        return False
    return not (plan.not_drawable and len(scene["kinds"]) > len(plan.shapes))


def _notes(plan: nearest.Plan, scene: dict | None) -> tuple[str, ...]:
    """The substitutions the rewrite made, in words: every mapped word, and each trained synonym
    the rewrite draws as its trained meaning."""
    notes = [m.note() for m in plan.mentions if not m.trained or _draws(scene, m)]
    if plan.not_drawable:
        notes.append(plan.not_drawable_note())
    return tuple(dict.fromkeys(notes))


def _settled(prompt: str, plan: nearest.Plan) -> Rewrite | None:
    """The rewrite where the model need not be asked, else None."""
    mapped = " ".join(plan.text.split()).lower()
    if parse_canonical(mapped):  # the mapping alone put the prompt in the grammar
        return Rewrite(mapped, True, _notes(plan, parse_canonical(mapped)))
    if plan.not_drawable and not plan.shapes:  # nothing here the model can draw: said, not swapped
        return Rewrite(prompt, False, (plan.not_drawable_note(),))
    return None


def _decide(prompt: str, plan: nearest.Plan, generated: str) -> Rewrite:
    """What the image model is given, from the mapping's plan and the model's rewrite of its text."""
    mapped = " ".join(plan.text.split())
    text = " ".join(generated.split())
    if text == KEEP:  # nothing the model can draw: kept as written, and said
        return Rewrite(prompt, False, (plan.not_drawable_note() if plan.not_drawable else nearest.NOTHING_DRAWABLE,))
    scene = parse_canonical(text)
    if scene is not None and _kept(scene, plan):
        return Rewrite(text, True, _notes(plan, scene))
    if any(not m.trained for m in plan.mentions):  # the model lost what the mapping chose (pink drawn as black)
        return Rewrite(mapped, True, _notes(plan, None))
    return Rewrite(prompt, False, _notes(plan, None))


class Rewriter:
    """A loaded rewriter model. ``rewrite`` is safe to call from several threads."""

    def __init__(self, path: str | Path, threads: int | None = None):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

        self.path = Path(path)
        config = AutoConfig.from_pretrained(self.path, local_files_only=True)
        self.seq2seq = bool(getattr(config, "is_encoder_decoder", False))
        cls = AutoModelForSeq2SeqLM if self.seq2seq else AutoModelForCausalLM
        self.model = cls.from_pretrained(self.path, local_files_only=True).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        if not self.seq2seq:
            self.tokenizer.padding_side = "left"
        self.version = identity(str(self.path))
        self.weights_version = model_version(self.path)
        info = self.path / "training_info.json"
        self.info = json.loads(info.read_text()) if info.exists() else {}
        self._lock = threading.Lock()
        self._torch = torch
        if threads:
            torch.set_num_threads(threads)

    def rewrite(self, prompts: list[str]) -> list[Rewrite]:
        out: list[Rewrite | None] = [Rewrite(p, False) if parse_canonical(p) else None for p in prompts]
        todo = [i for i, r in enumerate(out) if r is None]
        if todo:
            # Every prompt outside the grammar is in the one pass (its cost is the batch's), even
            # one the mapping alone settles: the model's answer is then not used.
            plans = [nearest.plan(prompts[i]) for i in todo]
            for i, plan, text in zip(todo, plans, self._generate([p.text for p in plans]), strict=True):
                out[i] = _settled(prompts[i], plan) or _decide(prompts[i], plan, text)
        return [r for r in out if r is not None]

    def _generate(self, prompts: list[str]) -> list[str]:
        torch = self._torch
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, truncation=True, max_length=64)
        with self._lock, torch.inference_mode():
            ids = self.model.generate(**enc, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, num_beams=1,
                                      pad_token_id=self.tokenizer.pad_token_id)
        if not self.seq2seq:
            ids = ids[:, enc["input_ids"].shape[1]:]
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)
