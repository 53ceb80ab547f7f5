"""The prompt rewriter (issue 30), the model itself: the shipped models/rewriter-v2 loaded from
disk through transformers, its serving guarantees, and its training data. No database."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpu_tasks.rewriter import KEEP, Rewriter, model_version, parse_canonical
from training import rewriter_data

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "models" / "rewriter-v2"


@pytest.fixture(scope="module")
def rewriter():
    return Rewriter(SHIPPED, threads=1)


def test_a_prompt_already_in_the_grammar_is_left_exactly_as_written(rewriter, monkeypatch):
    prompts = ["a small red circle on a blue background", "a yellow star and a large white heart on a black background"]
    monkeypatch.setattr(rewriter, "_generate", lambda batch: pytest.fail(f"the model was asked about {batch}"))
    assert [(r.prompt, r.changed) for r in rewriter.rewrite(prompts)] == [(p, False) for p in prompts]


def test_free_form_prompts_in_one_batch_come_back_in_the_grammar(rewriter):
    cases = {
        "a vermilion pebble against a cerulean background": "a red circle on a blue background",
        "un cercle rouge sur fond bleu": "a red circle on a blue background",
        "a big golden star on a black background": "a large yellow star on a black background",
        "ein kleines grünes herz auf weißem hintergrund": "a small green heart on a white background",
    }
    out = rewriter.rewrite(list(cases))
    assert [r.prompt for r in out] == list(cases.values())
    assert all(r.changed for r in out)


def test_what_the_model_cannot_draw_keeps_the_users_prompt(rewriter, monkeypatch):
    prompts = ["a cat sleeping on a sofa", "a red star on a blue background, 4k"]
    answers = iter([[KEEP, "a red star on a red background"]])   # <keep>, and a rewrite outside the grammar
    monkeypatch.setattr(rewriter, "_generate", lambda batch: next(answers))
    assert [(r.prompt, r.changed) for r in rewriter.rewrite(prompts)] == [(p, False) for p in prompts]


@pytest.mark.parametrize("split", ["heldout", "heldout2"])
def test_held_out_phrasings_are_mostly_rewritten_exactly(rewriter, split):
    held = [s for s in rewriter_data.samples(split, 555, 300) if s.lang != "ood"]
    out = rewriter.rewrite([s.source for s in held])
    exact = sum(r.prompt == s.target for r, s in zip(out, held, strict=True)) / len(held)
    # The benchmark (bench/rewriter.py) reports the figures (98% and 99% here); this is a floor
    # (rewriter-v1 made 61% of the English held-out prompts exactly).
    assert exact >= 0.9, exact


def test_the_version_is_the_hash_of_the_model_files(tmp_path):
    copy = tmp_path / "rw"
    shutil.copytree(SHIPPED, copy)
    assert model_version(copy) == model_version(SHIPPED)
    (copy / "generation_config.json").write_text((copy / "generation_config.json").read_text() + "\n")
    assert model_version(copy) != model_version(SHIPPED)


def test_the_held_out_split_is_written_with_templates_the_training_split_never_uses():
    assert not set(rewriter_data.TRAIN_TEMPLATES) & set(rewriter_data.HELDOUT_TEMPLATES)
    assert not set(rewriter_data.ORDER_TRAIN) & set(rewriter_data.ORDER_HELDOUT)
    assert not set(rewriter_data.TRAIN_TEMPLATES) & set(rewriter_data.HELDOUT2_TEMPLATES)
    assert not set(rewriter_data.ORDER_TRAIN) & set(rewriter_data.ORDER_HELDOUT2)
    assert not set(rewriter_data.JOIN_TRAIN) & (set(rewriter_data.JOIN_HELDOUT) | set(rewriter_data.JOIN_HELDOUT2))
    for split in ("train", "heldout", "heldout2"):
        for s in rewriter_data.samples(split, 3, 500):
            assert s.target == KEEP or parse_canonical(s.target), s


def test_the_grammar_parser_refuses_what_the_model_was_never_trained_on():
    assert parse_canonical("a red circle on a blue background") == {
        "colours": ["red"], "kinds": ["circle"], "background": "blue"}
    for text in ("a red circle on a red background", "a red dog on a blue background",
                 "a red circle and a red star on a blue background", "red circle, blue background"):
        assert parse_canonical(text) is None
