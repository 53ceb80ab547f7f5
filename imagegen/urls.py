from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from imagegen import dashboard, health
from imagegen.metrics_view import metrics_view
from jobs.access import signin
from jobs.api import account as account_views
from jobs.api import delete as delete_views
from jobs.api import errors, views
from jobs.api import page as web
from jobs.api import review as review_views
from jobs.api import staff as staff_views
from jobs.api import verify as verify_views
from jobs.api.openai import compat as openai_compat
from jobs.api.openai import videos as openai_videos
from jobs.api.openai import views as openai_api
from jobs.pipeline import regenerate
from jobs.realtime import sse

# Sign-in failures are throttled per account and per IP on both sign-in pages (jobs/access/signin.py).
admin.site.login_form = signin.AdminSigninForm

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("favicon.ico", web.favicon, name="favicon"),  # pages that link no icon (sign-in, admin) ask for it
    path("metrics", metrics_view, name="metrics"),
    path("staff/dashboard", dashboard.dashboard, name="dashboard"),
    path("api/v1/jobs", views.JobListCreate.as_view(), name="job-list"),
    path("api/v1/queue", views.QueueView.as_view(), name="queue"),
    path("api/v1/account", account_views.AccountView.as_view(), name="account"),
    path("api/v1/account/tokens", account_views.TokenList.as_view(), name="account-tokens"),
    path("api/v1/account/tokens/<int:token_id>", account_views.TokenRevoke.as_view(), name="account-token"),
    path("api/v1/account/webhook-secret", account_views.WebhookSecretRotate.as_view(), name="account-webhook-secret"),
    # GET as jobs.api.views.JobDetail, plus DELETE (owner; images purged).
    path("api/v1/jobs/<uuid:job_id>", delete_views.JobDetailDelete.as_view(), name="job-detail"),
    path("api/v1/jobs/<uuid:job_id>/cancel", views.JobCancel.as_view(), name="job-cancel"),
    path("api/v1/jobs/<uuid:job_id>/appeal", views.JobAppeal.as_view(), name="job-appeal"),
    path("api/v1/jobs/<uuid:job_id>/events", sse.job_events, name="job-events"),
    path("api/v1/review", review_views.ReviewQueue.as_view(), name="review-list"),
    path("api/v1/review/<uuid:job_id>/decision", review_views.ReviewDecision.as_view(), name="review-decision"),
    path("api/v1/images/<uuid:image_id>", regenerate.ImageDetail.as_view(), name="image-detail"),
    path("api/v1/images/<uuid:image_id>/credentials", verify_views.ImageCredentials.as_view(), name="image-credentials"),
    path("staff/images/<uuid:image_id>", staff_views.staff_image, name="staff-image"),
    re_path(r"^media/i/(?P<key>[0-9a-f]{32}\.[a-z]{3,4})$", views.serve_image, name="image"),
    re_path(r"^media/v/(?P<clip>[0-9a-f]{32})/(?P<name>[a-z0-9_/]{1,40}\.[a-z0-9]{3,4})$", views.serve_clip_file,
            name="clip-file"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("v1/images/generations", openai_api.ImageGenerations.as_view(), name="openai-images-generations"),
    path("v1/models", openai_api.ModelList.as_view(), name="openai-models"),
    path("v1/models/<str:model_id>", openai_api.ModelDetail.as_view(), name="openai-model"),
    path("v1/videos", openai_videos.VideoListCreate.as_view(), name="openai-videos"),
    path("v1/videos/<str:video_id>", openai_videos.VideoDetail.as_view(), name="openai-video"),
    path("v1/videos/<str:video_id>/content", openai_videos.VideoContent.as_view(), name="openai-video-content"),
    re_path(r"^v1/(?P<path>.*)$", openai_compat.unknown_route, name="openai-unknown"),  # JSON 404s, never HTML
    re_path(r"^api/(?P<path>.*)$", errors.unknown_route, name="api-unknown"),  # JSON 404s, never HTML
    path("accounts/login/", signin.LoginView.as_view(), name="login"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("", web.index, name="index"),
]
