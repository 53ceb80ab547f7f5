from django.contrib import admin, messages
from django.utils.html import format_html

from jobs.models import ApiToken, Batch, GeneratedImage, GenerationJob, WebhookDelivery


@admin.register(GenerationJob)
class GenerationJobAdmin(admin.ModelAdmin):
    list_display = ("created_at", "owner", "status", "stage", "blocked_stage", "width", "height", "steps", "count", "attempts", "batch")
    list_filter = ("status", "stage", "blocked_stage", "degraded", "model_version")
    search_fields = ("id", "prompt", "owner__username")
    readonly_fields = [f.name for f in GenerationJob._meta.fields]

    actions = ["delete_through_the_service"]

    def has_add_permission(self, request):
        return False

    # The admin's own delete (one row or the bulk action) removes rows and leaves their public
    # bytes on storage and the CDN: jobs go through jobs.actions.delete_job, as the owner's do.
    def has_delete_permission(self, request, obj=None):
        return False

    def has_delete_through_the_service_permission(self, request):
        return request.user.has_perm("jobs.delete_generationjob")

    @admin.action(description="Delete selected jobs (cancel, take the public images down; the safety record stays)",
                  permissions=["delete_through_the_service"])
    def delete_through_the_service(self, request, queryset):
        from jobs.actions import delete_job

        jobs = list(queryset)
        for job in jobs:
            delete_job(job)
        self.message_user(request, f"deleted {len(jobs)} job(s)", messages.SUCCESS)


@admin.register(GeneratedImage)
class GeneratedImageAdmin(admin.ModelAdmin):
    list_display = ("created_at", "job", "index", "tier", "byte_size", "views", "preview")
    list_filter = ("tier", "cold", "bytes_dropped")
    readonly_fields = [f.name for f in GeneratedImage._meta.fields]
    actions = ["reject_delivered"]

    @admin.display(description="image")
    def preview(self, image):
        return format_html('<img src="/staff/images/{}" width="64" alt="">', image.id)

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # an image goes with its job (jobs.actions.delete_job) or is taken down (below)

    @admin.action(description="Reject delivered image(s): take down and purge from the CDN", permissions=["review"])
    def reject_delivered(self, request, queryset):
        from jobs.actions import reject_delivered

        count = sum(reject_delivered(image, request.user, request.POST.get("notes", "")) for image in queryset)
        self.message_user(request, f"took down {count} public object(s)", messages.SUCCESS)

    def has_review_permission(self, request):
        return request.user.has_perm("safety.review_content")

    def has_view_permission(self, request, obj=None):
        # Moderators reach delivered images to take them down.
        return self.has_review_permission(request) or super().has_view_permission(request, obj)

    def has_module_permission(self, request):
        return self.has_review_permission(request) or super().has_module_permission(request)


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    list_display = ("started_at", "width", "height", "steps", "size", "cap", "gpu_seconds", "worker")
    readonly_fields = [f.name for f in Batch._meta.fields]

    def has_delete_permission(self, request, obj=None):
        return False  # its jobs and images point at it: they go through the actions, not a row delete

@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    """The webhook outbox: each delivery's attempts (time, HTTP status or error, seconds)."""

    list_display = ("created_at", "job", "status", "url", "attempts", "last_status_code", "delivered_at", "gave_up_at")
    list_filter = ("status", ("delivered_at", admin.EmptyFieldListFilter), ("gave_up_at", admin.EmptyFieldListFilter))
    search_fields = ("job__id", "url")
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]

    def has_add_permission(self, request):
        return False


from jobs import review_admin  # noqa: E402,F401  (the moderators' review queue)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """API tokens with their last use; deleting one revokes it at once. New tokens come from
    `manage.py issue_token` or POST /api/v1/account/tokens (the token is shown once, there)."""

    list_display = ("prefix", "user", "name", "scope", "created_at", "last_used_at", "expires_at")
    list_filter = ("created_at", "last_used_at")
    search_fields = ("prefix", "name", "user__username")
    readonly_fields = ("user", "prefix", "digest", "scope", "created_at", "last_used_at")
    fields = ("user", "name", "prefix", "digest", "scope", "created_at", "last_used_at", "expires_at")
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        count = queryset.delete()[0]
        self.message_user(request, f"{count} token(s) revoked.", messages.SUCCESS)
