"""An image's content credentials, verified on the server: the page's "verify" link.

GET /api/v1/images/<id>/credentials (owner only; 404 for anyone else, for an image not
delivered or whose bytes are no longer stored) reads the stored file and checks its C2PA
manifest with c2pa's reader (jobs/media/credentials.py: signature, hard binding to the file's
bytes, certificate chain against IMAGEGEN_C2PA_TRUST_ANCHORS). Read-only: nothing is written.
"""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.media import credentials
from jobs.media.storage import public_storage
from jobs.models import GeneratedImage, JobStatus


class CredentialsSerializer(serializers.Serializer):
    image = serializers.CharField()
    state = serializers.CharField(help_text="c2pa's validation state: Trusted, Valid, Invalid, or none (no manifest).")
    verified = serializers.BooleanField(help_text="Signature and binding to the file's bytes intact.")
    trusted = serializers.BooleanField(help_text="... and signed by a certificate chain ending at a trusted root.")
    signer = serializers.DictField(help_text="c2pa's signature_info: common_name, issuer, alg, time.")
    actions = serializers.ListField(child=serializers.DictField())
    parameters = serializers.DictField(allow_null=True, help_text="The request's parameters, model version and job id.")
    failures = serializers.ListField(child=serializers.DictField())


class ImageCredentials(APIView):
    @extend_schema(
        operation_id="images_credentials",
        summary="Verify an image's content credentials (C2PA)",
        description="Owner only. Reads the stored file and checks its manifest: who signed it, what it asserts "
        "(the c2pa.created action, the request's parameters) and whether it verifies.",
        request=None,
        responses={200: CredentialsSerializer, 404: OpenApiResponse(description="No such delivered image")},
    )
    def get(self, request, image_id):
        image = get_object_or_404(
            GeneratedImage.objects.select_related("job"), id=image_id, job__owner=request.user, job__deleted_at=None,
            tier="public", job__status=JobStatus.DONE,
        )
        storage = public_storage()
        if not storage.exists(image.storage_key):
            return Response({"detail": "The image's bytes are no longer stored (GET /api/v1/images/<id> regenerates them)."},
                            status=status.HTTP_404_NOT_FOUND)
        with storage.open(image.storage_key, "rb") as fh:
            data = fh.read()
        check = credentials.verify(data)
        return Response({
            "image": str(image.id),
            "state": check.state,
            "verified": check.ok,
            "trusted": check.trusted,
            "signer": check.manifest.get("signature_info", {}),
            "actions": check.actions,
            "parameters": check.parameters,
            "failures": check.failures,
        })
