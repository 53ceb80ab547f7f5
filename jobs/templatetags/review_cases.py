"""`{% review_summary as review %}` for the admin index (templates/admin/index.html): for a
moderator, how many review cases are open and the appeals they overturned that a check blocked
again (jobs.actions.review.overturned_then_blocked); None for anyone else."""

from __future__ import annotations

from django import template

from jobs.actions import review

register = template.Library()

REVIEW_PERM = "safety.review_content"
BLOCKED_AGAIN_SHOWN = 20


@register.simple_tag(takes_context=True)
def review_summary(context) -> dict | None:
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not (user.is_active and user.is_staff and user.has_perm(REVIEW_PERM)):
        return None
    return {
        "open": review.review_queue().count(),
        "blocked_again": list(review.overturned_then_blocked(user).select_related("owner")[:BLOCKED_AGAIN_SHOWN]),
    }
