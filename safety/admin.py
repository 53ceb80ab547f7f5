"""Safety records in the Django admin, for moderators (staff with `safety.review_content`).

The review queue itself (held prompts and images, appeals, approve / reject) is in
jobs/review_admin.py: its decisions are job state changes, which belong to jobs.actions.
"""

from __future__ import annotations

from django.contrib import admin

from safety.models import SafetyVerdict

REVIEW_PERM = "safety.review_content"


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


@admin.register(SafetyVerdict)
class SafetyVerdictAdmin(ModeratorOnly, admin.ModelAdmin):
    list_display = ("created_at", "job", "stage", "decision", "category", "score", "policy_version", "reviewer")
    list_filter = ("stage", "decision", "category")
    search_fields = ("job__id", "job__prompt", "reason")
    readonly_fields = [f.name for f in SafetyVerdict._meta.fields]
