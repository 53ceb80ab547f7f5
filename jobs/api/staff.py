"""Staff-only access to any image's bytes, public or quarantined, local or on S3.

``GET /staff/images/<uuid>`` streams the bytes through the app (works on every backend; the
admin's review queue links here). ``?redirect=1`` answers a short-lived presigned URL redirect
instead when the image lives on S3, so large reviews do not stream through the web process.
Anyone who is not an active staff member with the review permission gets 404 (existence does
not leak), like any other image they do not own. A moderator's tool (the moderation API,
jobs/api/review.py, lists these URLs) sends its full-scope token, `Authorization: Token ...` or
`Bearer ...`, instead of a session.
"""

from __future__ import annotations

from django.http import FileResponse, Http404, HttpResponseRedirect
from django.views.decorators.http import require_GET

from jobs.access import tokens
from jobs.media.storage import is_s3, storage_for_tier
from jobs.models import GeneratedImage

REVIEW_PERM = "safety.review_content"


def can_see_private_images(user) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff and user.has_perm(REVIEW_PERM))


def _user_of(request):
    """The session's user, or a full-scope token's (a token of scope jobs reaches no staff route)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() not in ("token", "bearer") or not token.strip():
        return request.user
    row = tokens.find(token.strip())
    return row.user if row is not None and row.scope == "full" else None


@require_GET
def staff_image(request, image_id):
    if not can_see_private_images(_user_of(request)):
        raise Http404("no such image")
    image = GeneratedImage.objects.filter(id=image_id).first()
    if image is None or image.bytes_dropped:
        raise Http404("no such image")
    storage = storage_for_tier(image.tier)
    if storage is None:
        raise Http404("no such image")
    if request.GET.get("redirect") and is_s3(storage):
        from django.conf import settings

        url = storage.url(image.storage_key, expire=settings.IMAGEGEN_S3_PRESIGN_SECONDS) if image.tier != "public" \
            else storage.url(image.storage_key)
        response = HttpResponseRedirect(url)
    else:
        try:
            handle = storage.open(image.storage_key, "rb")
        except (FileNotFoundError, OSError):
            raise Http404("no such image") from None
        except Exception as exc:  # botocore ClientError 404 / NoSuchKey
            if "404" in str(exc) or "NoSuchKey" in str(exc) or "Not Found" in str(exc):
                raise Http404("no such image") from exc
            raise
        response = FileResponse(handle, content_type=image.content_type or "image/png")
    response["Cache-Control"] = "private, no-store"
    response["X-Content-Type-Options"] = "nosniff"
    response["Referrer-Policy"] = "no-referrer"
    return response
