"""The caller's account: the webhook signing secret (jobs/webhooks/delivery.py) and the per-tier usage
against the limits (jobs/access/usage.py)."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.access import usage
from jobs.webhooks import delivery as webhooks


class TierUsageSerializer(serializers.Serializer):
    jobs_in_flight = serializers.IntegerField()
    max_jobs_in_flight = serializers.IntegerField()
    images_today = serializers.IntegerField(help_text="Images charged in the last 24 h plus those reserved by waiting jobs.")
    max_images_per_day = serializers.IntegerField()


class AccountSerializer(serializers.Serializer):
    username = serializers.CharField()
    webhook_secret = serializers.CharField(
        help_text="whsec_<base64>: the key (the base64-decoded bytes) of your webhooks' HMAC-SHA256 signatures."
    )
    fair_share_weight = serializers.FloatField(help_text="Your share of each pass against other users' (IMAGEGEN_USER_WEIGHTS).")
    interactive = TierUsageSerializer()
    batch = TierUsageSerializer()


class WebhookSecretSerializer(serializers.Serializer):
    webhook_secret = serializers.CharField()


def _tier(user, priority: str, max_in_flight: int, max_images: int) -> dict:
    in_flight, reserved = usage.unfinished(user.pk, priority)
    return {"jobs_in_flight": in_flight, "max_jobs_in_flight": max_in_flight,
            "images_today": usage.images_charged(user.pk, priority=priority) + reserved,
            "max_images_per_day": max_images}


@extend_schema_view(get=extend_schema(operation_id="account_retrieve", summary="Your account: webhook secret and usage",
                                      responses={200: AccountSerializer}))
class AccountView(APIView):
    def get(self, request):
        user = request.user
        return Response({
            "username": user.get_username(),
            "webhook_secret": webhooks.secret_for(user),
            "fair_share_weight": settings.IMAGEGEN_USER_WEIGHTS.get(user.get_username(), 1.0),
            "interactive": _tier(user, "interactive", settings.IMAGEGEN_USER_MAX_IN_FLIGHT,
                                 settings.IMAGEGEN_USER_MAX_IMAGES_PER_DAY),
            "batch": _tier(user, "batch", settings.IMAGEGEN_USER_MAX_BATCH_IN_FLIGHT,
                           settings.IMAGEGEN_USER_MAX_BATCH_IMAGES_PER_DAY),
        })


@extend_schema_view(post=extend_schema(
    operation_id="account_webhook_secret_rotate", summary="Rotate your webhook signing secret",
    description="A new whsec_ secret; deliveries from now on (retries included) are signed with it.",
    request=None, responses={200: WebhookSecretSerializer},
))
class WebhookSecretRotate(APIView):
    def post(self, request):
        return Response({"webhook_secret": webhooks.rotate_secret(request.user)})
