"""The moderation API, for moderators' own tools (staff with `safety.review_content`, signed in
or with a full-scope token):

- ``GET /api/v1/review``: the open cases (held prompts and images, undecided appeals), oldest
  first, each with its job, its verdicts and its images' staff URLs (/staff/images/<id>, which
  take the same token);
- ``POST /api/v1/review/<job_id>/decision`` ``{"decision": "approve" | "reject", "note": ...}``.

A decision is jobs.actions.review.decide, the same door as the admin's buttons: the job moves
as the stage table says, and a case is decided once (a second decision is a 409).
"""

from __future__ import annotations

from django.db.models import Prefetch
from django.http import Http404
from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field, extend_schema_view
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.access.tokens import FullScope
from jobs.actions import review
from jobs.api.schema import ErrorDetailSerializer
from jobs.api.staff import can_see_private_images
from jobs.api.strict import StrictCharField, StrictChoiceField, StrictSerializer
from jobs.models import GeneratedImage, GenerationJob, JobStatus
from jobs.representation import JobSerializer
from safety.models import SafetyVerdict

NOTE_MAX = 1000
KINDS = ("held", "appeal", "reopened_appeal")
OUTCOMES = ("approved", "rejected", "overturned", "upheld")


class Moderators(BasePermission):
    message = "The moderation API is for staff with the review permission (safety.review_content)."

    def has_permission(self, request, view) -> bool:
        return can_see_private_images(request.user)


class FullScopeForReview(FullScope):
    message = ("This token's scope is 'jobs': the moderation API needs a full-scope token or a signed-in "
               "session.")


MODERATORS_ONLY = [IsAuthenticated, Moderators, FullScopeForReview]


# --- shapes -----------------------------------------------------------------------------------


class ReviewVerdictSerializer(serializers.ModelSerializer):
    # Plain strings: these choice sets share their field names with the decision's own enums.
    stage = serializers.CharField(help_text="prompt, rewrite, image or human (a moderator).")
    decision = serializers.CharField(help_text="allow, review or block.")
    reviewer = serializers.CharField(source="reviewer.username", read_only=True, allow_null=True,
                                     help_text="The moderator, for a human verdict; null for a check's.")

    class Meta:
        model = SafetyVerdict
        fields = ["id", "created_at", "stage", "decision", "category", "score", "reason", "image_index", "classifier",
                  "language", "policy_version", "reviewer", "notes"]
        read_only_fields = fields


class ReviewImageSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField(help_text=(
        "The image's bytes for staff (public or still private), at /staff/images/<id>: the same session or "
        "token; 404 for anyone else."))

    class Meta:
        model = GeneratedImage
        fields = ["id", "index", "seed", "width", "height", "tier", "content_type", "url"]
        read_only_fields = fields

    def get_url(self, image) -> str:
        path = reverse("staff-image", args=[image.id])
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request is not None else path


class ReviewCaseSerializer(serializers.Serializer):
    """One open case: a job waiting for a moderator."""

    id = serializers.UUIDField(source="pk", help_text="The job's id (the case is the job).")
    kind = serializers.SerializerMethodField(help_text=(
        "held: a check held the prompt or the images (see job.blocked_stage); appeal: the owner appealed a "
        "block; reopened_appeal: an appeal a moderator overturned, after which a check blocked the job again "
        "(the images the approval let be made, or the rewrite)."))
    owner = serializers.CharField(source="owner.username")
    job = JobSerializer(source="*", help_text="The job JSON, as its owner sees it (delivered images only).")
    verdicts = ReviewVerdictSerializer(many=True, help_text="Every verdict on the job, oldest first, moderators' too.")
    images = ReviewImageSerializer(many=True, help_text="Every image of the job, held or delivered.")
    decision_url = serializers.SerializerMethodField()

    @extend_schema_field({"type": "string", "enum": list(KINDS)})
    def get_kind(self, job) -> str:
        return review.case_kind(job)

    def get_decision_url(self, job) -> str:
        path = reverse("review-decision", args=[job.pk])
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request is not None else path


class ReviewDecisionSerializer(StrictSerializer):
    decision = StrictChoiceField(choices=list(review.DECISIONS), help_text=(
        "approve: a held prompt goes on to be generated, held images are delivered, an appeal is overturned; "
        "reject: the job is blocked (its images stay private), an appeal is upheld."))
    note = StrictCharField(required=False, allow_blank=True, max_length=NOTE_MAX, default="", help_text=(
        "For the record, and for a rejection what the user reads as the reason (required with reject)."))

    def validate(self, attrs):
        if attrs["decision"] == "reject" and not attrs.get("note"):
            raise serializers.ValidationError(
                {"note": ["a rejection needs a note: the user reads it as the reason their job was blocked"]})
        return attrs


class ReviewDecisionResultSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    decision = serializers.ChoiceField(choices=list(review.DECISIONS))
    outcome = serializers.ChoiceField(choices=list(OUTCOMES), help_text=(
        "approved or rejected (a held case), overturned or upheld (an appeal)."))
    job = JobSerializer(help_text="The job after the decision.")


class CaseNotOpenSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="Why there is nothing to decide (decided already, or never a case).")
    status = serializers.ChoiceField(choices=JobStatus.choices, help_text="The job's status now.")


# --- views ------------------------------------------------------------------------------------


class OldestFirst(CursorPagination):
    ordering = "created_at"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200


FORBIDDEN = OpenApiResponse(ErrorDetailSerializer, description=(
    "Not staff with the review permission, a token of scope jobs, or (a POST with a session) no CSRF token."))


@extend_schema_view(get=extend_schema(
    operation_id="review_list", summary="The open review cases, oldest first", tags=["review"],
    description="Held prompts and images and undecided appeals, oldest first, each with its job, verdicts and "
                "images (staff URLs). Moderators only.",
    responses={200: ReviewCaseSerializer(many=True), 403: FORBIDDEN},
))
class ReviewQueue(ListAPIView):
    permission_classes = MODERATORS_ONLY
    serializer_class = ReviewCaseSerializer
    pagination_class = OldestFirst

    def get_queryset(self):
        return review.review_queue().select_related("owner", "batch").prefetch_related(
            Prefetch("verdicts", SafetyVerdict.objects.select_related("reviewer").order_by("created_at", "id")),
            Prefetch("images", GeneratedImage.objects.order_by("index")),
        )


@extend_schema_view(post=extend_schema(
    operation_id="review_decide", summary="Decide a review case", tags=["review"],
    description="Approve or reject one open case, with a note. The same decision as the admin's buttons; a "
                "case is decided once. Moderators only.",
    request=ReviewDecisionSerializer,
    responses={
        200: ReviewDecisionResultSerializer,
        403: FORBIDDEN,
        404: OpenApiResponse(ErrorDetailSerializer, description="No such job."),
        409: OpenApiResponse(CaseNotOpenSerializer, description="Not an open case: decided already, or never a case."),
    },
))
class ReviewDecision(APIView):
    permission_classes = MODERATORS_ONLY

    def post(self, request, job_id):
        body = ReviewDecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        decision, note = body.validated_data["decision"], body.validated_data["note"]
        try:
            outcome = review.decide(job_id, decision, request.user, note)
        except review.NoSuchCase:
            raise Http404 from None
        except review.CaseNotOpen as exc:
            job_status = GenerationJob.objects.filter(id=job_id).values_list("status", flat=True).first()
            return Response({"detail": str(exc), "status": job_status}, status=status.HTTP_409_CONFLICT)
        job = GenerationJob.objects.select_related("batch").get(id=job_id)
        return Response({"id": str(job.id), "decision": decision, "outcome": outcome, "job": JobSerializer(job).data})
