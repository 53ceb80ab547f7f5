"""The moderators' review queue in the Django admin (/admin/safety/reviewcase/).

Moderators are staff with the `safety.review_content` permission. They see held prompts and
images (the images from private storage, staff only), the prompt, every verdict with its
scores, and decide with approve / reject actions (bulk too), with notes. The decisions are
jobs.actions.review's; the case list is a proxy of GenerationJob that keeps its place in the
safety app (its admin URL, permission and migration predate this module).
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.utils.html import format_html, format_html_join

from jobs.actions import review
from jobs.models import GenerationJob
from safety.admin import ModeratorOnly, VerdictInline


class ReviewCase(GenerationJob):
    class Meta:
        proxy = True
        app_label = "safety"
        verbose_name = "review case"
        verbose_name_plural = "review queue"


class NotesActionForm(ActionForm):
    notes = forms.CharField(required=False, label="Notes", widget=forms.TextInput(attrs={"size": 40}))


@admin.register(ReviewCase)
class ReviewCaseAdmin(ModeratorOnly, admin.ModelAdmin):
    list_display = ("created_at", "kind", "blocked_stage", "prompt_short", "scores", "thumbnails", "owner")
    list_filter = ("blocked_stage", "status")
    search_fields = ("prompt",)
    action_form = NotesActionForm
    actions = ["approve_selected", "reject_selected"]
    inlines = [VerdictInline]
    readonly_fields = ("path", "prompt", "revised_prompt", "negative_prompt", "owner", "status", "blocked_stage",
                       "reason", "appeal_note", "appealed_at", "appeal_outcome", "width", "height", "steps", "seed",
                       "count", "model_version", "thumbnails")
    fields = readonly_fields

    def get_queryset(self, request):
        return review.review_queue().select_related("owner").prefetch_related("verdicts", "images")

    @admin.display(description="case")
    def kind(self, job):
        return "appeal" if job.status == "blocked" else "held"

    @admin.display(description="prompt")
    def prompt_short(self, job):
        return job.prompt[:120]

    @admin.display(description="scores")
    def scores(self, job):
        rows = [(v.stage, v.decision, v.category or "-", f"{v.score:.2f}" if v.score is not None else "-")
                for v in job.verdicts.all() if v.stage != "human"]
        return format_html_join(format_html("<br>"), "{} {} {} {}", rows)

    @admin.display(description="path")
    def path(self, job):
        """The job's whole way so far, oldest first: the prompt as written, each check's verdict,
        the rewrite, each moderator's decision (with their notes), the images' verdicts."""
        steps = [(job.created_at, "submitted", job.prompt)]
        if job.rewritten_at is not None:
            kept = not job.revised_prompt or job.revised_prompt == job.prompt
            steps.append((job.rewritten_at, "rewritten", "kept as written" if kept else job.revised_prompt))
        for v in job.verdicts.all():
            who = f"moderator {v.reviewer}" if v.stage == "human" else f"{v.stage} check"
            on = f" (image {v.image_index + 1})" if v.image_index is not None else ""
            detail = "; ".join(x for x in (v.category, v.reason, v.notes if v.stage == "human" else "") if x)
            steps.append((v.created_at, f"{who}{on}: {v.decision}", detail))
        steps.sort(key=lambda step: step[0])
        return format_html("<ol>{}</ol>", format_html_join(
            "", "<li>{} <b>{}</b> {}</li>", ((at.strftime("%Y-%m-%d %H:%M:%S"), what, detail) for at, what, detail in steps)))

    @admin.display(description="images")
    def thumbnails(self, job):
        return format_html_join(
            "", '<a href="/staff/images/{}"><img src="/staff/images/{}" width="96" alt="image {}"></a> ',
            ((im.id, im.id, im.index) for im in job.images.all()),
        )

    def _decide(self, request, queryset, decide, verb):
        notes = request.POST.get("notes", "")
        done = failed = 0
        for job in queryset:
            try:
                decide(job, request.user, notes)
                done += 1
            except review.ReviewError as exc:
                failed += 1
                self.message_user(request, f"{job.id}: {exc}", messages.WARNING)
        self.message_user(request, f"{verb} {done} case(s)" + (f", {failed} skipped" if failed else ""))

    @admin.action(description="Approve selected (deliver / continue / overturn appeal)")
    def approve_selected(self, request, queryset):
        self._decide(request, queryset, review.approve, "approved")

    @admin.action(description="Reject selected (block / uphold appeal)")
    def reject_selected(self, request, queryset):
        self._decide(request, queryset, review.reject, "rejected")
