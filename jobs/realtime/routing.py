from django.urls import path

from jobs.realtime.consumers import JobEventsConsumer

websocket_urlpatterns = [path("ws/jobs/<uuid:job_id>/", JobEventsConsumer.as_asgi())]
