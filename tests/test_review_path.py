"""A review case shows the job's whole path (issue 43, item 5): the prompt as written, each
check's verdict, the rewrite, each moderator's decision with their notes, in order."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from safety.models import SafetyVerdict
from tests.test_security import make_job

pytestmark = pytest.mark.django_db


def test_a_held_rewrite_case_shows_the_prompt_each_verdict_the_rewrite_and_the_decision(alice, moderator):
    from django.test import Client

    now = timezone.now()
    job = make_job(alice, status="review", blocked_stage="image", reason="held", rewrite=True,
                   revised_prompt="a red heart on a white background", rewritten_at=now + timedelta(seconds=2))
    type(job).objects.filter(id=job.id).update(prompt="a crimson heart on snow", created_at=now)
    for seconds, fields in ((1, {"stage": "prompt", "decision": "review", "category": "demo_borderline"}),
                            (1.5, {"stage": "human", "decision": "allow", "reviewer": moderator, "notes": "a heart is fine"}),
                            (3, {"stage": "rewrite", "decision": "review", "category": "demo_borderline"}),
                            (4, {"stage": "image", "decision": "review", "category": "heart", "image_index": 0})):
        verdict = SafetyVerdict.objects.create(job=job, **fields)
        SafetyVerdict.objects.filter(id=verdict.id).update(created_at=now + timedelta(seconds=seconds))
    client = Client()
    client.force_login(moderator)
    page = client.get(f"/admin/safety/reviewcase/{job.id}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    order = ["a crimson heart on snow", "prompt check: review", "moderator mod: allow", "a heart is fine",
             "rewritten", "a red heart on a white background", "rewrite check: review", "image check (image 1): review"]
    at = [html.find(words) for words in order]
    assert -1 not in at and at == sorted(at), list(zip(order, at, strict=True))
