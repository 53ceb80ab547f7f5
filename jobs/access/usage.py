"""What a user has used, for the per-user limits (jobs/admission/control.py checks them).

The daily quota counts GPU work: images are charged (a UsageCharge row) when a GPU worker first
claims them (jobs.actions.claim_batch), and until then the images of the user's unfinished,
never-claimed jobs are reserved. So a job cancelled mid-run stays charged, a job that never
started (blocked by the prompt gate, cancelled or deleted while queued) costs nothing, and
deleting delivered jobs gives nothing back (the charge outlives the job row).

Checks and inserts are made atomic per user by `lock_user` inside the caller's transaction: a
row lock on the user on PostgreSQL; on SQLite every transaction already holds the database's
write lock from its start (transaction_mode IMMEDIATE in settings), which serialises them.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db.models import Count, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from imagegen.precompiled import Precompiled
from jobs.models import GenerationJob, JobStatus, UsageCharge

QUOTA_WINDOW = timedelta(days=1)
UNFINISHED = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.REVIEW)


def lock_user(user_id) -> None:
    """Serialise this user's limit checks with their writes until the transaction ends."""
    list(get_user_model().objects.select_for_update().filter(pk=user_id).values_list("pk", flat=True))


def lock_and_count(user_id, priority: str = "interactive", now: datetime | None = None) -> tuple[int, int, int]:
    """lock_user, then (jobs in flight, images reserved, images charged in the last 24 h) of the
    tier in one more statement, as scalar subqueries on the user's row: two round trips
    instead of four. The counts must be a statement of their own AFTER the lock: PostgreSQL
    (READ COMMITTED) evaluates a statement's subqueries on the snapshot it took before it waited
    for a row lock, so `SELECT ... FOR UPDATE` with the counts in it would count what was there
    before the previous holder committed, and forty concurrent submits passed the limits
    (tests/test_limits.py)."""
    lock_user(user_id)
    since = (now or timezone.now()) - QUOTA_WINDOW
    row = _COUNTS.first(user=user_id, priority=priority, since=since)
    if row is None:
        return 0, 0, 0
    return row[0] or 0, row[1] or 0, row[2] or 0


def _counts_query(user, priority: str, since: datetime):
    mine = GenerationJob.objects.filter(owner_id=OuterRef("pk"), priority=priority).order_by().values("owner_id")
    in_flight = mine.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).annotate(n=Count("id")).values("n")
    reserved = mine.filter(status__in=UNFINISHED, charged_at=None).annotate(n=Sum("billable_images")).values("n")
    charged = (UsageCharge.objects.filter(user_id=OuterRef("pk"), charged_at__gte=since, priority=priority)
               .order_by().values("user_id").annotate(n=Sum("images")).values("n"))
    return (get_user_model().objects.filter(pk=user)
            .annotate(in_flight=Subquery(in_flight), reserved=Subquery(reserved), charged=Subquery(charged))
            .order_by("pk").values_list("in_flight", "reserved", "charged")[:1])


# Building and compiling these statements through the ORM cost more CPU per submit than the
# database spends running them (~5 ms for the three subqueries above): each is compiled once
# per database and thread and filled in per call (imagegen/precompiled.py).
_COUNTS = Precompiled(_counts_query, user=get_user_model()._meta.pk,
                      priority=GenerationJob._meta.get_field("priority"),
                      since=UsageCharge._meta.get_field("charged_at"))
_IN_FLIGHT = Precompiled(
    lambda user, priority: GenerationJob.objects.filter(owner_id=user, status__in=[JobStatus.QUEUED, JobStatus.RUNNING],
                                                        priority=priority)
    .order_by().values("owner_id").annotate(n=Count("id")).values_list("n"),
    user=GenerationJob._meta.get_field("owner"), priority=GenerationJob._meta.get_field("priority"))


def jobs_in_flight(user_id, priority: str = "interactive") -> int:
    row = _IN_FLIGHT.first(user=user_id, priority=priority)
    return row[0] if row else 0


def unfinished(user_id, priority: str = "interactive") -> tuple[int, int]:
    """(jobs in flight, images reserved by unfinished jobs not claimed yet) of the tier, in one
    query. Each priority tier has its own limits (batch: IMAGEGEN_USER_MAX_BATCH_*)."""
    row = GenerationJob.objects.filter(owner_id=user_id, status__in=UNFINISHED, priority=priority).aggregate(
        in_flight=Count("id", filter=Q(status__in=[JobStatus.QUEUED, JobStatus.RUNNING])),
        reserved=Sum("billable_images", filter=Q(charged_at=None)),
    )
    return row["in_flight"] or 0, row["reserved"] or 0


def review_cases(user_id) -> int:
    """The user's cases in the moderators' queue: jobs held for review and undecided appeals."""
    return GenerationJob.objects.filter(owner_id=user_id).filter(
        Q(status=JobStatus.REVIEW) | Q(status=JobStatus.BLOCKED, appealed_at__isnull=False, appeal_outcome="")
    ).count()


def images_charged(user_id, now: datetime | None = None, priority: str = "interactive") -> int:
    since = (now or timezone.now()) - QUOTA_WINDOW
    return UsageCharge.objects.filter(user_id=user_id, charged_at__gte=since, priority=priority).aggregate(
        n=Sum("images"))["n"] or 0


def images_reserved(user_id) -> int:
    return GenerationJob.objects.filter(owner_id=user_id, status__in=UNFINISHED, charged_at=None).aggregate(
        n=Sum("billable_images")
    )["n"] or 0


def seconds_until_charges_free(user_id, images: int, now: datetime | None = None, priority: str = "interactive") -> float:
    """When enough of the charges in the window have aged out for `images` more (an estimate:
    reservations may be charged meanwhile)."""
    now = now or timezone.now()
    freed = 0
    for charged_at, n in UsageCharge.objects.filter(user_id=user_id, charged_at__gte=now - QUOTA_WINDOW,
                                                    priority=priority).order_by(
        "charged_at"
    ).values_list("charged_at", "images"):
        freed += n
        if freed >= images:
            return max(1.0, (charged_at + QUOTA_WINDOW - now).total_seconds())
    return QUOTA_WINDOW.total_seconds()
