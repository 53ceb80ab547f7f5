from django.conf import settings
from django.contrib import admin
from django.urls import include, path, re_path

from jobs import sse, views, web

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("api/v1/jobs", views.JobListCreate.as_view(), name="job-list"),
    path("api/v1/jobs/<uuid:job_id>", views.JobDetail.as_view(), name="job-detail"),
    path("api/v1/jobs/<uuid:job_id>/cancel", views.JobCancel.as_view(), name="job-cancel"),
    path("api/v1/jobs/<uuid:job_id>/events", sse.job_events, name="job-events"),
    re_path(r"^media/i/(?P<key>[0-9a-f]{32}\.png)$", views.serve_image, name="image"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("", web.index, name="index"),
]
