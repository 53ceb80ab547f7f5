"""The safety policy file is validated by typed models (safety/policy_base.py, pydantic): the
shipped file passes, and a malformed one is refused with a message that names the file, the
field and the reason, for the prompt and the image side alike."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from safety import policy_base
from safety.image_policy import ImagePolicyError, load_image_policy, parse_image_policy
from safety.prompt_filter import PolicyError, parse_policy

SHIPPED = Path(__file__).resolve().parent.parent / "safety" / "policy.json"
DOC = {
    "version": "t-1",
    "defaults": {"semantic_review": 0.6, "semantic_block": 0.8, "rule_decision": "block"},
    "categories": [{"name": "fruit", "description": "fruit", "terms": ["banana"],
                    "translations": {"es": ["plátano"]}}],
    "languages": {"declared": ["en", "es"], "undeclared": "review"},
    "image": {"labels": {"star": {"category": "fruit", "review": 0.3, "block": 0.6}},
              "classifiers": {"shapes": {"labels": {"heart": {"category": "fruit", "review": 0.2, "block": 0.5}}}},
              "categories": {"fruit": {"user_reason": {"block": "No fruit."}}}},
}


def changed(path: str, value):
    doc = copy.deepcopy(DOC)
    *parents, last = path.split("/")
    node = doc
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return doc


def test_the_shipped_policy_is_a_valid_policy_spec():
    data = json.loads(SHIPPED.read_text())
    spec = policy_base.validate(policy_base.PolicySpec, data, str(SHIPPED))
    assert spec.version == data["version"]
    assert [c.name for c in spec.categories] == [c["name"] for c in data["categories"]]
    # the defaults are applied to every category
    assert all(c.semantic_review is not None and c.rule_decision in ("block", "review") for c in spec.categories)
    assert load_image_policy(SHIPPED).version == data["version"]


def test_the_models_describe_the_file_as_a_json_schema():
    schema = policy_base.PolicySpec.model_json_schema()
    assert {"version", "categories"} <= set(schema["required"])
    assert "CategorySpec" in schema["$defs"] and "LabelRuleSpec" in schema["$defs"]


@pytest.mark.parametrize("path,value,message", [
    ("version", 3, "<t>: 'version' must be str, got int"),
    ("categories/0/terms", KeyError, "<t>: category 'fruit': missing required key 'terms'"),
    ("categories/0/semantic_block", 1.5, "<t>: category 'fruit': 'semantic_block' must be a number in [0, 1.01], got 1.5"),
    ("categories/0/semantic_review", True, "'semantic_review' must be a number in [0, 1.01], got True"),
    ("categories/0/extra", 1, "<t>: category 'fruit': unknown key(s) 'extra'"),
    ("categories/0/translations", {"xx": ["a"]}, "<t>: category 'fruit': translations: unknown language code 'xx'"),
    ("categories/0/benign_contexts", [{"terms": ["banana"], "words": ["split"], "window": 0}],
     "<t>: category 'fruit': benign_contexts[0]: 'window' must be an integer 1-5, got 0"),
    ("languages/undeclared", "maybe", "<t>: languages: 'undeclared' must be one of review, block, allow, got 'maybe'"),
    ("languages/declared", ["en", "fi"], "<t>: languages: declared: 'fi' has no words in any category"),
    ("image/classifiers", {"shapes": {"labels": {"heart": {"category": "veg", "review": 0.1, "block": 0.2}}}},
     "<t>: image.classifiers['shapes'].labels['heart']: unknown category 'veg'"),
])
def test_a_malformed_prompt_policy_names_the_field_and_the_reason(path, value, message):
    with pytest.raises(PolicyError) as exc:
        parse_policy(changed(path, value), "<t>")
        policy_base.validate(policy_base.PolicySpec, changed(path, value), "<t>")
    assert message in str(exc.value), str(exc.value)


@pytest.mark.parametrize("path,value,message", [
    ("version", "  ", "<t>: 'version' must not be empty"),
    ("image/labels", {"star": {"category": "fruit", "review": 0.7, "block": 0.6}},
     "<t>: image.labels['star']: review (0.7) must be <= block (0.6)"),
    ("image/labels", {"star": {"category": "fruit", "block": 0.6}}, "<t>: image.labels['star']: missing required key 'review'"),
    ("image/classifiers", {"shapes": {}}, "<t>: image.classifiers['shapes']: missing required key 'labels'"),
    ("image/categories", {"fruit": {"user_reason": {"maybe": "x"}}}, "image.categories['fruit']"),
    ("image/categories", {"veg": {"user_reason": {"block": "No veg."}}}, "<t>: image.categories['veg']: unknown category"),
])
def test_a_malformed_image_section_names_the_field_and_the_reason(path, value, message):
    with pytest.raises(ImagePolicyError) as exc:
        parse_image_policy(changed(path, value), "<t>")
    assert message in str(exc.value), str(exc.value)


def test_the_image_policy_reads_its_sections_and_fills_in_the_missing_sentences():
    policy = parse_image_policy(DOC, "<t>")
    assert policy.section_for(("shapes",))[1]["heart"].block == 0.5
    assert policy.default["star"].review == 0.3
    assert policy.user_reason("fruit", "block") == "No fruit."
    assert "held until a moderator" in policy.user_reason("fruit", "review")
