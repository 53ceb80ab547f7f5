"""The moderators' review queue in the Django admin.

Moderators are staff with the `safety.review_content` permission. They see held prompts and
images (the images from private storage, staff only), the prompt, every verdict with its
scores, and decide with approve / reject actions (bulk too), with notes.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.utils.html import format_html, format_html_join

from jobs.models import GenerationJob
from safety import review
from safety.models import SafetyVerdict

REVIEW_PERM = "safety.review_content"


class ReviewCase(GenerationJob):
    class Meta:
        proxy = True
        verbose_name = "review case"
        verbose_name_plural = "review queue"


class NotesActionForm(ActionForm):
    notes = forms.CharField(required=False, label="Notes", widget=forms.TextInput(attrs={"size": 40}))


class VerdictInline(admin.TabularInline):
    model = SafetyVerdict
    fk_name = "job"
    extra = 0
    can_delete = False
    fields = ("created_at", "stage", "decision", "category", "score", "reason", "policy_version", "reviewer", "notes", "image_index")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


class ModeratorOnly:
    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_staff and request.user.has_perm(REVIEW_PERM)

    def has_view_permission(self, request, obj=None):
        return self.has_module_permission(request)

    def has_change_permission(self, request, obj=None):
        return self.has_module_permission(request)

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ReviewCase)
class ReviewCaseAdmin(ModeratorOnly, admin.ModelAdmin):
    list_display = ("created_at", "kind", "blocked_stage", "prompt_short", "scores", "thumbnails", "owner")
    list_filter = ("blocked_stage", "status")
    search_fields = ("prompt",)
    action_form = NotesActionForm
    actions = ["approve_selected", "reject_selected"]
    inlines = [VerdictInline]
    readonly_fields = ("prompt", "negative_prompt", "owner", "status", "blocked_stage", "reason", "appeal_note",
                       "appealed_at", "appeal_outcome", "width", "height", "steps", "seed", "count", "model_version",
                       "thumbnails")
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


@admin.register(SafetyVerdict)
class SafetyVerdictAdmin(ModeratorOnly, admin.ModelAdmin):
    list_display = ("created_at", "job", "stage", "decision", "category", "score", "policy_version", "reviewer")
    list_filter = ("stage", "decision", "category")
    search_fields = ("job__id", "job__prompt", "reason")
    readonly_fields = [f.name for f in SafetyVerdict._meta.fields]
