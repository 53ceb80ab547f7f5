"""The caller's account: the webhook signing secret (jobs/webhooks/delivery.py), the per-tier usage
against the limits (jobs/access/usage.py), and the caller's API tokens (list, issue with an
optional expiry, revoke one: jobs/access/tokens.py)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.http import Http404
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.access import tokens, usage
from jobs.api.strict import StrictCharField, StrictChoiceField, StrictIntegerField, StrictSerializer
from jobs.models import ApiToken
from jobs.webhooks import delivery as webhooks


class TierUsageSerializer(serializers.Serializer):
    jobs_in_flight = serializers.IntegerField()
    max_jobs_in_flight = serializers.IntegerField()
    images_today = serializers.IntegerField(help_text="Images charged in the last 24 h plus those reserved by waiting jobs.")
    max_images_per_day = serializers.IntegerField()


class AccountSerializer(serializers.Serializer):
    username = serializers.CharField()
    webhook_secret = serializers.CharField(
        allow_null=True,
        help_text="whsec_<base64>: the key (the base64-decoded bytes) of your webhooks' HMAC-SHA256 signatures; "
                  "null for a token of scope jobs (it needs a full-scope token or a session).",
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
            "webhook_secret": webhooks.secret_for(user) if tokens.scope_of(request) == "full" else None,
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
    permission_classes = [*APIView.permission_classes, tokens.FullScope]

    def post(self, request):
        return Response({"webhook_secret": webhooks.rotate_secret(request.user)})


class TokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "prefix", "name", "scope", "created_at", "last_used_at", "expires_at"]
        read_only_fields = fields


class TokenIssueSerializer(StrictSerializer):
    name = StrictCharField(max_length=100, required=False, allow_blank=True, default="")
    expires_in_days = StrictIntegerField(
        min_value=1, max_value=3650, required=False, allow_null=True,
        help_text="The token is refused after this many days; omit for none (a token issued by a token expires "
                  "with it at the latest).")
    scope = StrictChoiceField(
        choices=tokens.SCOPES, default="full",
        help_text="full: everything you may do; jobs: submit and read jobs, but not manage tokens or read the "
                  "webhook secret.")

    def validate_expires_in_days(self, days):
        bound = self.context.get("issuer_expires_at")
        if days and bound is not None and timezone.now() + timedelta(days=days) > bound:
            raise serializers.ValidationError(
                f"the token issuing this one expires at {bound.isoformat()}; a token it issues cannot outlive it")
        return days


class IssuedTokenSerializer(TokenSerializer):
    token = serializers.CharField(help_text="The token itself: shown once, stored only as a hash.")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


@extend_schema_view(
    get=extend_schema(operation_id="account_tokens_list", summary="Your API tokens (never the tokens themselves)",
                      responses={200: TokenSerializer(many=True)}),
    post=extend_schema(operation_id="account_tokens_issue", summary="Issue a new API token, optionally expiring",
                       request=TokenIssueSerializer, responses={201: IssuedTokenSerializer}),
)
class TokenList(APIView):
    permission_classes = [*APIView.permission_classes, tokens.FullScope]

    def get(self, request):
        rows = ApiToken.objects.filter(user=request.user).order_by("-created_at")
        return Response(TokenSerializer(rows, many=True).data)

    def post(self, request):
        bound = tokens.issuer_expiry(request)
        given = TokenIssueSerializer(data=request.data, context={"issuer_expires_at": bound})
        given.is_valid(raise_exception=True)
        days = given.validated_data.get("expires_in_days")
        expires_at = timezone.now() + timedelta(days=days) if days else bound
        with transaction.atomic():
            usage.lock_user(request.user.pk)
            limit = settings.IMAGEGEN_USER_MAX_TOKENS
            if ApiToken.objects.filter(user=request.user).count() >= limit:
                return Response({"detail": f"you have {limit} tokens, the most one account may hold: revoke one first",
                                 "code": "too_many_tokens"}, status=status.HTTP_409_CONFLICT)
            token, row = tokens.issue_row(request.user, given.validated_data["name"], expires_at,
                                          given.validated_data["scope"])
        return Response({**TokenSerializer(row).data, "token": token}, status=status.HTTP_201_CREATED)


@extend_schema_view(delete=extend_schema(operation_id="account_tokens_revoke", summary="Revoke one of your API tokens",
                                         responses={204: None}))
class TokenRevoke(APIView):
    permission_classes = [*APIView.permission_classes, tokens.FullScope]

    def delete(self, request, token_id: int):
        if not tokens.revoke(request.user, token_id):
            raise Http404  # not the caller's (or already revoked): the same answer either way
        return Response(status=status.HTTP_204_NO_CONTENT)
