"""The rewriter says what it did (issue 45, item 11): a colour or a shape the image model cannot
draw is drawn as its nearest drawable one and said so, never silently swapped for an unrelated
one ("a pink heart on a white background" became "a black heart on a white background"); a thing
with no sensible nearest is reported, not swapped; the job records the note and shows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_tasks import nearest
from gpu_tasks.rewriter import Rewriter

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "models" / "rewriter-v2"
PINK = "a pink heart on a white background"


@pytest.fixture(scope="module")
def rewriter():
    return Rewriter(SHIPPED, threads=1)


def test_a_pink_heart_on_white_is_drawn_red_not_black_and_says_so(rewriter):
    [out] = rewriter.rewrite([PINK])
    assert out.prompt == "a red heart on a white background" and out.changed
    assert out.notes == ("pink is drawn as red (the nearest colour this model draws)",)


def test_a_rewrite_that_swaps_the_nearest_colour_for_another_is_not_taken(rewriter, monkeypatch):
    """The learned model, asked about "a pink heart" (no background: the mapping alone does not
    reach the grammar), answers black: that answer is refused and red kept."""
    monkeypatch.setattr(rewriter, "_generate", lambda batch: ["a black heart on a white background"] * len(batch))
    [out] = rewriter.rewrite(["a pink heart"])
    assert "black" not in out.prompt and "red heart" in out.prompt, out
    assert out.notes == ("pink is drawn as red (the nearest colour this model draws)",)


def test_a_shape_outside_the_grammar_is_drawn_as_its_nearest_kind(rewriter):
    out = rewriter.rewrite(["a teal pentagon on a black background", "a rhombus in orange against a navy backdrop"])
    assert [r.prompt for r in out] == ["a green circle on a black background", "a yellow square on a blue background"]
    assert "a pentagon is drawn as a circle (the nearest shape this model draws)" in out[0].notes
    assert "teal is drawn as green (the nearest colour this model draws)" in out[0].notes
    assert set(out[1].notes) >= {"a rhombus is drawn as a square (the nearest shape this model draws)",
                                 "orange is drawn as yellow (the nearest colour this model draws)"}


def test_a_thing_the_model_cannot_draw_is_reported_not_swapped(rewriter, monkeypatch):
    out = rewriter.rewrite(["a cat", "a pink cat on a white background"])
    assert [(r.prompt, r.changed) for r in out] == [("a cat", False), ("a pink cat on a white background", False)]
    assert all('cannot draw "cat"' in r.notes[0] for r in out), out
    # A rewrite that draws the cat as one more shape is refused.
    monkeypatch.setattr(rewriter, "_generate", lambda batch: ["a red star and a white circle on a blue background"])
    [out] = rewriter.rewrite(["a red star and a cat on a blue background"])
    assert "circle" not in out.prompt and 'cannot draw "cat"' in out.notes[-1], out


def test_a_nearest_colour_already_in_the_picture_gives_way_to_the_next_and_says_why():
    plan = nearest.plan("a grey star on a white background")
    assert plan.text == "a black star on a white background"
    assert [m.note() for m in plan.mentions] == [
        "grey is drawn as black (white, nearer, is already another colour in this picture)"]


def test_the_colour_rule_reads_hues_and_lightness():
    drawn = {w: nearest.ranked(nearest.colour_lab(w))[0] for w in (
        "pink", "navy blue", "teal", "beige", "violet", "maroon", "turquoise", "orange", "purple", "brown", "grey",
        "silver", "lavender", "coral", "khaki", "mint")}
    assert drawn == {"pink": "red", "navy blue": "blue", "teal": "green", "beige": "white", "violet": "blue",
                     "maroon": "red", "turquoise": "green", "orange": "yellow", "purple": "blue", "brown": "red",
                     "grey": "white", "silver": "white", "lavender": "white", "coral": "red", "khaki": "yellow",
                     "mint": "green"}
    assert nearest.ranked(nearest.colour_lab("grey", "dark"))[0] == "black"
    assert nearest.ranked(nearest.colour_lab("blue", "light"))[0] == "blue"
    # CIEDE2000 against Sharma, Wu and Dalal's published pairs.
    assert nearest.ciede2000((50.0, 2.6772, -79.7751), (50.0, 0.0, -82.7485)) == pytest.approx(2.0425, abs=1e-4)
    assert nearest.ciede2000((50.0, 2.5, 0.0), (73.0, 25.0, -18.0)) == pytest.approx(27.1492, abs=1e-4)


def test_the_tables_agree_with_what_the_models_were_trained_on():
    from training import rewriter_data, shapes_data

    assert nearest.PALETTE == shapes_data.COLOURS and nearest.SHAPE_KINDS == tuple(shapes_data.SHAPES)
    trained = {w: c for c, ws in rewriter_data.COLOUR_WORDS.items() for w in ws if w != c}
    assert nearest.TRAINED_COLOURS == trained
    for kind, ws in rewriter_data.SHAPE_WORDS.items():
        for w in ws:
            words = tuple(w.replace("-", " ").split())
            if words == (kind,):
                continue
            got = nearest.TRAINED_SHAPE_PHRASES.get(words) if len(words) > 1 else nearest.TRAINED_KINDS.get(w)
            assert got == kind or len(words) > 1 and words[-1] == kind, (w, got)
    # No trained synonym is also a word the mapping would replace or report.
    for w in [*trained, *nearest.TRAINED_KINDS]:
        assert w not in nearest.NAMED_COLOURS and w not in nearest.OFF_GRAMMAR_KINDS and w not in nearest.NOT_DRAWABLE


def test_held_out_prompts_in_the_grammars_words_are_rewritten_as_before(rewriter):
    """The mapping leaves what the rewriter was trained on to it: the held-out exact match stays."""
    from training import rewriter_data

    held = [s for s in rewriter_data.samples("heldout2", 556, 200) if s.lang != "ood"]
    out = rewriter.rewrite([s.source for s in held])
    exact = sum(r.prompt == s.target for r, s in zip(out, held, strict=True)) / len(held)
    assert exact >= 0.95, exact


@pytest.mark.django_db(transaction=True)
def test_the_job_records_and_reports_what_the_rewriter_substituted(workers, alice_api):
    from jobs.models import GenerationJob
    from tests.conftest import wait_for_status

    # (a circle: the default policy holds hearts for review)
    body = {"prompt": "a pink oval on a white background", "width": 64, "height": 64, "steps": 2, "seed": 4501,
            "rewrite": "on"}
    response = alice_api.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 202, response.content
    job_id = response.json()["id"]
    wait_for_status(job_id, ("done",))
    job = GenerationJob.objects.get(id=job_id)
    notes = ["pink is drawn as red (the nearest colour this model draws)",
             "an oval is drawn as a circle (the nearest shape this model draws)"]
    assert job.drawn_prompt == "a red circle on a white background"
    assert job.rewrite_notes == notes
    got = alice_api.get(f"/api/v1/jobs/{job_id}").json()
    assert got["revised_prompt"] == "a red circle on a white background" and got["rewrite_notes"] == notes

    off = alice_api.post("/api/v1/jobs", {**body, "seed": 4502, "rewrite": "off"}, format="json").json()
    assert off["rewrite_notes"] == []  # not rewritten: nothing to say


def test_the_rewriter_identity_names_the_mapping_version():
    """The request-hash cache key carries the rewriter's identity: a change of the mapping
    (gpu_tasks/nearest.py VERSION) must change it, or an image drawn under the old mapping is reused."""
    from gpu_tasks import nearest
    from jobs.pipeline import rewrite

    assert rewrite.NEAREST_VERSION == nearest.VERSION
    assert f"nearest={nearest.VERSION}" in rewrite.DECODING
