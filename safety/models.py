from __future__ import annotations

from django.conf import settings
from django.db import models


class Stage(models.TextChoices):
    PROMPT = "prompt"
    REWRITE = "rewrite"  # the prompt gate again, on the rewriter's prompt
    IMAGE = "image"
    HUMAN = "human"


class Decision(models.TextChoices):
    ALLOW = "allow"
    REVIEW = "review"
    BLOCK = "block"


class SafetyVerdict(models.Model):
    """Every safety decision, kept so that "why was this blocked?" is answerable later."""

    job = models.ForeignKey("jobs.GenerationJob", on_delete=models.CASCADE, related_name="verdicts")
    image = models.ForeignKey(
        "jobs.GeneratedImage", null=True, blank=True, on_delete=models.SET_NULL, related_name="verdicts"
    )
    image_index = models.PositiveSmallIntegerField(null=True, blank=True)
    stage = models.CharField(max_length=10, choices=Stage.choices)
    decision = models.CharField(max_length=10, choices=Decision.choices)
    category = models.CharField(max_length=60, blank=True, default="")
    score = models.FloatField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    policy_version = models.CharField(max_length=100, blank=True, default="")
    # Image verdicts: the gate that judged (safety.gate_identity); the request-hash cache serves
    # an image only to requests this same gate would judge.
    classifier = models.CharField(max_length=300, blank=True, default="")
    # Prompt verdicts: the language the prompt gate detected (safety.language; "und": no letters).
    language = models.CharField(max_length=16, blank=True, default="")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    notes = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        permissions = [("review_content", "Can review held prompts and images")]

    def __str__(self) -> str:
        return f"{self.stage} {self.decision} {self.category} for {self.job_id}"
