"""The moderators' review queue in the Django admin (/admin/safety/reviewcase/).

Moderators are staff with the `safety.review_content` permission. They see held prompts and
images (the images from private storage, staff only), the prompt, every verdict with its
scores, and decide: on a case's page with **Approve** and **Reject with note** (the image shown
at least 256 px, upscaled without smoothing), or in bulk with the list's actions. Every decision
is jobs.actions.review.decide, the same door as the moderation API (jobs/api/review.py), so a
case is decided once. A case's page has no Save: nothing on it is edited (a full-row save of a
job would also race the workers that write it). The case list is a proxy of GenerationJob that
keeps its place in the safety app (its admin URL, permission and migration predate this module).
The admin index shows how many cases are open, and tells a moderator of the appeals they
overturned that a check blocked again (templates/admin/index.html, jobs/templatetags/review_cases.py).
"""

from __future__ import annotations

import math

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Exists, OuterRef, Q
from django.http import Http404, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.timesince import timesince

from jobs.actions import review
from jobs.models import GenerationJob
from safety.admin import ModeratorOnly, VerdictInline
from safety.models import SafetyVerdict

NOTE_MAX = 1000
CASE_IMAGE_MIN_PX = 256  # the shorter side of an image on a case's page, at least
LIST_THUMBNAILS = 3  # images shown in a list row; the rest are counted


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
    # The thumbnail and the owner first: at 1280 px they are what a moderator scans for.
    list_display = ("thumbnails", "owner", "kind", "prompt_short", "scores", "waiting")
    list_display_links = ("kind",)
    list_filter = ("blocked_stage", "status")
    search_fields = ("prompt",)
    action_form = NotesActionForm
    actions = ["approve_selected", "reject_selected"]
    inlines = [VerdictInline]
    change_form_template = "admin/safety/reviewcase/change_form.html"
    readonly_fields = ("path", "prompt", "revised_prompt", "negative_prompt", "owner", "status", "blocked_stage",
                       "reason", "appeal_note", "appealed_at", "appeal_outcome", "width", "height", "steps", "seed",
                       "count", "model_version")
    fields = readonly_fields

    class Media:
        css = {"all": ("imagegen/review_admin.css",)}

    def get_queryset(self, request):
        return review.review_queue().select_related("owner").prefetch_related("verdicts", "images")

    def get_object(self, request, object_id, from_field=None):
        """An open case, or one a moderator decided (its page then shows the decision)."""
        decided = Exists(SafetyVerdict.objects.filter(job=OuterRef("pk"), stage="human"))
        queryset = ReviewCase.objects.annotate(reopened=review.overturned_before()).filter(
            review.OPEN_CASE | Q(appealed_at__isnull=False) | Q(decided))
        try:
            return queryset.select_related("owner").get(pk=object_id)
        except (ReviewCase.DoesNotExist, ValidationError, ValueError):
            return None

    @admin.display(description="case", ordering="blocked_stage")
    def kind(self, job):
        """What waits and at which stage: held (image), appeal (prompt), ..."""
        kind = {"held": "held", "appeal": "appeal", "reopened_appeal": "appeal, blocked again after an overturn"}[
            review.case_kind(job)]
        return f"{kind} ({job.blocked_stage})" if job.blocked_stage else kind

    @admin.display(description="waiting", ordering="created_at")
    def waiting(self, job):
        """How long since the job was submitted (the queue is oldest first); the time in full on hover."""
        return format_html('<span title="{}">{}</span>', job.created_at.strftime("%Y-%m-%d %H:%M:%S %Z"),
                           timesince(job.created_at, depth=1))

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
            notes = v.notes if v.stage == "human" and v.notes != v.reason else ""  # a rejection's reason is its note
            detail = "; ".join(x for x in (v.category, v.reason, notes) if x)
            steps.append((v.created_at, f"{who}{on}: {v.decision}", detail))
        steps.sort(key=lambda step: step[0])
        return format_html("<ol>{}</ol>", format_html_join(
            "", "<li>{} <b>{}</b> {}</li>", ((at.strftime("%Y-%m-%d %H:%M:%S"), what, detail) for at, what, detail in steps)))

    @admin.display(description="images")
    def thumbnails(self, job):
        images = sorted(job.images.all(), key=lambda im: im.index)
        shown = format_html_join(
            "", '<a href="{}"><img class="review-thumb" src="{}" width="64" height="64" alt="image {}"></a> ',
            ((self._case_url(job), reverse("staff-image", args=[im.id]), im.index + 1) for im in images[:LIST_THUMBNAILS]),
        )
        more = len(images) - LIST_THUMBNAILS
        return format_html("{}{}", shown, format_html('<span class="review-more">+{}</span>', more) if more > 0 else "")

    @staticmethod
    def _case_url(job) -> str:
        return reverse("admin:safety_reviewcase_change", args=[job.pk])

    # --- a case's page: the images large, Approve and Reject with note -----------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        if request.method == "POST":
            return self._decide_one(request, unquote(object_id))
        job = self.get_object(request, unquote(object_id))
        if job is None:
            return super().change_view(request, object_id, form_url, extra_context)  # the admin's "no such" page
        context = {
            **(extra_context or {}),
            "case_open": review.is_open(job),
            "case_kind": review.case_kind(job),
            "case_images": [self._large(job, image) for image in sorted(job.images.all(), key=lambda im: im.index)],
            "case_decisions": job.verdicts.filter(stage="human").select_related("reviewer").order_by("created_at"),
            "note_max": NOTE_MAX,
            "next_case": review.review_queue().exclude(pk=job.pk).values_list("pk", flat=True).first(),
            "title": f"Review case: {job.prompt[:60]}",
            "show_save": False, "show_save_and_continue": False, "show_save_and_add_another": False,
            "show_delete": False,
        }
        return super().change_view(request, object_id, form_url, context)

    @staticmethod
    def _large(job, image) -> dict:
        """The image at a whole multiple of its size with its shorter side >= CASE_IMAGE_MIN_PX."""
        scale = max(1, math.ceil(CASE_IMAGE_MIN_PX / max(1, min(image.width, image.height))))
        return {"id": image.id, "index": image.index + 1, "seed": image.seed, "tier": image.tier,
                "url": reverse("staff-image", args=[image.id]), "width": image.width * scale,
                "height": image.height * scale, "natural": f"{image.width}x{image.height}"}

    def _decide_one(self, request, object_id):
        if not self.has_change_permission(request):
            raise PermissionDenied
        back = HttpResponseRedirect(request.path)
        decision = "approve" if "_approve" in request.POST else "reject" if "_reject" in request.POST else ""
        note = request.POST.get("note", "").strip()
        if not decision:
            self.message_user(request, "Nothing was saved: a case is decided with Approve or Reject.", messages.ERROR)
            return back
        if len(note) > NOTE_MAX:
            self.message_user(request, f"The note is {len(note)} characters; at most {NOTE_MAX}.", messages.ERROR)
            return back
        if decision == "reject" and not note:
            self.message_user(request, "A rejection needs a note: the user reads it as the reason their job was "
                                       "blocked. Nothing was decided.", messages.ERROR)
            return back
        try:
            outcome = review.decide(object_id, decision, request.user, note)
        except review.NoSuchCase:
            raise Http404("no such case") from None
        except review.CaseNotOpen as exc:
            self.message_user(request, f"Nothing changed: {exc}.", messages.WARNING)
            return back
        self.message_user(request, f"{OUTCOME_WORDS[outcome]}" + (f" Your note: {note}" if note else ""),
                          messages.SUCCESS)
        return back

    # --- bulk -----------------------------------------------------------------------------

    def _decide(self, request, queryset, decision, verb):
        notes = request.POST.get("notes", "")
        done = failed = 0
        for job in queryset:
            try:
                review.decide(job.id, decision, request.user, notes)
                done += 1
            except review.ReviewError as exc:
                failed += 1
                self.message_user(request, f"{job.id}: {exc}", messages.WARNING)
        self.message_user(request, f"{verb} {done} case(s)" + (f", {failed} skipped" if failed else ""))

    @admin.action(description="Approve selected (deliver / continue / overturn appeal)")
    def approve_selected(self, request, queryset):
        self._decide(request, queryset, "approve", "approved")

    @admin.action(description="Reject selected (block / uphold appeal)")
    def reject_selected(self, request, queryset):
        self._decide(request, queryset, "reject", "rejected")


OUTCOME_WORDS = {
    "approved": "Approved: the job goes on (held images are delivered; a held prompt is generated).",
    "rejected": "Rejected: the job is blocked, its images stay private; the user sees your note as the reason.",
    "overturned": "Appeal overturned: the block is lifted (blocked images are delivered; a blocked prompt is "
                  "generated).",
    "upheld": "Appeal upheld: the job stays blocked; the user sees your note.",
}
