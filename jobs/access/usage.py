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

from datetime import UTC, datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count, OuterRef, Q, Subquery, Sum
from django.utils import timezone

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
    statement = _counts_statement(priority)
    if statement is None:
        row = _counts_query(user_id, priority, since).first()
    else:
        sql, standins, user_at, since_at = statement
        params = list(standins)
        params[user_at], params[since_at] = user_id, connection.ops.adapt_datetimefield_value(since)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
    if row is None:
        return 0, 0, 0
    return row[0] or 0, row[1] or 0, row[2] or 0


def _counts_query(user_id, priority: str, since: datetime):
    mine = GenerationJob.objects.filter(owner_id=OuterRef("pk"), priority=priority).order_by().values("owner_id")
    in_flight = mine.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).annotate(n=Count("id")).values("n")
    reserved = mine.filter(status__in=UNFINISHED, charged_at=None).annotate(n=Sum("billable_images")).values("n")
    charged = (UsageCharge.objects.filter(user_id=OuterRef("pk"), charged_at__gte=since, priority=priority)
               .order_by().values("user_id").annotate(n=Sum("images")).values("n"))
    return (get_user_model().objects.filter(pk=user_id)
            .annotate(in_flight=Subquery(in_flight), reserved=Subquery(reserved), charged=Subquery(charged))
            .order_by("pk").values_list("in_flight", "reserved", "charged"))


# Building and compiling that statement through the ORM cost ~5 ms of CPU per submit (three
# subqueries), several times what the database takes to run it: it is compiled once per
# database and tier, with stand-ins for the user and the window's start, whose places in the
# parameters are then filled per call.
_STANDIN_USER = -73_452_190
_STANDIN_SINCE = datetime(1999, 1, 2, 3, 4, 5, tzinfo=UTC)
_STATEMENTS: dict[tuple[str, str], tuple[str, tuple, int, int] | None] = {}


def _counts_statement(priority: str) -> tuple[str, tuple, int, int] | None:
    key = (connection.settings_dict["NAME"], priority)
    if key not in _STATEMENTS:
        sql, params = _counts_query(_STANDIN_USER, priority, _STANDIN_SINCE)[:1].query.sql_with_params()
        since = connection.ops.adapt_datetimefield_value(_STANDIN_SINCE)
        users = [i for i, p in enumerate(params) if p == _STANDIN_USER]
        sinces = [i for i, p in enumerate(params) if p == since]
        # None: the stand-ins are not found once each (a backend that inlines them): the ORM per call
        _STATEMENTS[key] = (sql, tuple(params), users[0], sinces[0]) if len(users) == len(sinces) == 1 else None
    return _STATEMENTS[key]


def jobs_in_flight(user_id, priority: str = "interactive") -> int:
    return GenerationJob.objects.filter(owner_id=user_id, status__in=[JobStatus.QUEUED, JobStatus.RUNNING],
                                        priority=priority).count()


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
