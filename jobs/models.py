from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone


class JobStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    REVIEW = "review"
    DONE = "done"
    BLOCKED = "blocked"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Priority(models.TextChoices):
    INTERACTIVE = "interactive"  # the default: served first
    BATCH = "batch"  # fills passes and idle GPUs; its own wait limit and quota


class OutputFormat(models.TextChoices):
    PNG = "png"
    JPEG = "jpeg"
    WEBP = "webp"


TERMINAL_STATUSES = frozenset({JobStatus.DONE, JobStatus.BLOCKED, JobStatus.FAILED, JobStatus.CANCELLED})


class JobStage(models.TextChoices):
    """Where a job is in the pipeline: one field, the only one any stage claims by. Every move is
    a compare-and-set from the stage (and run) the mover holds to the next (jobs/actions), and the
    status users see is derived from it (`status_of`)."""

    PROMPT = "prompt", "prompt check"  # waiting for (or in) the prompt check of the prompt the user wrote
    REWRITE = "rewrite", "rewrite"  # its own prompt allowed (or approved); waiting for (or in) the rewriter
    REWRITE_CHECK = "rewrite_check", "rewrite check"  # the rewriter changed the prompt: its second check
    WAITING_GPU = "waiting_gpu", "waiting for a GPU"  # admitted: in its shape's bucket until a GPU worker takes it
    REVEAL = "reveal", "cached, to be revealed"  # a cross-user cache hit, done when a fresh job of its shape would be
    GENERATE = "generate", "generate"  # claimed by a GPU worker (its lease, its attempt)
    CLASSIFY = "classify", "image check"  # its images in quarantine, its batch in the image gate
    PUBLISH = "publish", "publish"  # judged, its batch in the publish stage
    REVIEW = "review", "held for review"  # held for a moderator; blocked_stage names the stage that held it
    DONE = "done", "done"
    BLOCKED = "blocked", "blocked"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


QUEUED_STAGES = (JobStage.PROMPT, JobStage.REWRITE, JobStage.REWRITE_CHECK, JobStage.WAITING_GPU, JobStage.REVEAL)
RUNNING_STAGES = (JobStage.GENERATE, JobStage.CLASSIFY, JobStage.PUBLISH)
ACTIVE_STAGES = QUEUED_STAGES + RUNNING_STAGES + (JobStage.REVIEW,)
# A job an identical request may join (jobs/media/cache.py in_flight), and its joiners wait for:
# queued for its own pass, or in it.
JOINABLE_STAGES = (JobStage.PROMPT, JobStage.REWRITE, JobStage.REWRITE_CHECK, JobStage.WAITING_GPU) + RUNNING_STAGES
STATUS_OF: dict[str, str] = {
    **{stage: JobStatus.QUEUED for stage in QUEUED_STAGES},
    **{stage: JobStatus.RUNNING for stage in RUNNING_STAGES},
    JobStage.REVIEW: JobStatus.REVIEW,
    **{status: status for status in TERMINAL_STATUSES},
}


# The first stage of each status: where a row made with only a status (a data migration, a test
# fixture) stands.
FIRST_STAGE: dict[str, str] = {str(status): str(stage) for stage, status in reversed(list(STATUS_OF.items()))}


def status_of(stage: str) -> str:
    """The one place a status comes from: what users, the API, the events and the admin see."""
    return str(STATUS_OF[stage])


def at(stage: str) -> dict:
    """The fields a move to `stage` writes (the stage and the status derived from it)."""
    return {"stage": stage, "status": status_of(stage)}


def _stage_matches_status() -> models.Q:
    """Each row's status is its stage's (a CHECK constraint: nothing can store two states)."""
    by_status: dict[str, list[str]] = {}
    for stage, status in STATUS_OF.items():
        by_status.setdefault(str(status), []).append(str(stage))
    q = models.Q()
    for status, stages in sorted(by_status.items()):
        q |= models.Q(status=status, stage__in=sorted(stages))
    return q


class BatchStage(models.TextChoices):
    """The shipped batch stages, by name for the code that moves a batch; the field's choices are
    `batch_stages` (the stage table's leased rows), so a batch stage added as a row needs no
    value here and no migration."""

    GENERATE = "generate"  # taken and claimed; denoising on a GPU worker
    CLASSIFY = "classify"  # images in quarantine; waiting for / in the image gate
    PUBLISH = "publish"  # verdicts recorded; waiting for / in the publish stage
    DONE = "done"


def batch_stages() -> list[tuple[str, str]]:
    """Batch.stage's choices: generate, each leased stage of the stage table in its order, done
    (a callable: migrations keep the reference, not the list)."""
    from imagegen.stage_table import STAGES

    leased = [(row.name, row.name) for row in STAGES.values() if row.leased]
    return [(BatchStage.GENERATE.value, BatchStage.GENERATE.label), *leased, (BatchStage.DONE.value, BatchStage.DONE.label)]


class Batch(models.Model):
    """One pass of the pipeline: the images of one shape that ran together, and the stage it
    has reached. Past generation the batch holds the lease (its jobs' leases are cleared at the
    hand-off), so the reaper re-runs a stuck batch from its stage instead of generating again."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    model_version = models.CharField(max_length=100)
    width = models.PositiveIntegerField()
    height = models.PositiveIntegerField()
    steps = models.PositiveIntegerField()
    guidance_scale = models.FloatField()
    scheduler = models.CharField(max_length=60, blank=True, default="")
    size = models.PositiveIntegerField(help_text="images in the pass")
    cap = models.PositiveIntegerField(help_text="the shape's batch cap when it ran")
    worker = models.CharField(max_length=200, blank=True, default="")
    lane = models.CharField(max_length=200, blank=True, default="")
    gpu_seconds = models.FloatField(null=True, blank=True)
    started_at = models.DateTimeField(auto_now_add=True, help_text="taken from the scheduler")
    pass_started_at = models.DateTimeField(null=True, blank=True, help_text="the pipeline call began")
    finished_at = models.DateTimeField(null=True, blank=True, help_text="the pipeline call ended")
    stage = models.CharField(max_length=16, choices=batch_stages, default=BatchStage.GENERATE, db_index=True)
    stage_attempts = models.PositiveSmallIntegerField(default=0, help_text="runs of this stage whose worker was lost")
    # The stage's lease (jobs/pipeline/stages.py): a batch waiting in its stage's queue holds
    # none (stage_started_at and lease_expires_at empty); a worker that starts the stage takes it
    # under a run token of its own and renews it while it runs.
    stage_since = models.DateTimeField(null=True, blank=True, help_text="entered its current stage")
    stage_sent_at = models.DateTimeField(null=True, blank=True, help_text="its stage's message was (last) sent")
    stage_started_at = models.DateTimeField(null=True, blank=True, help_text="a worker started its stage")
    stage_run = models.CharField(max_length=32, blank=True, default="", help_text="the run holding the stage")
    stage_error = models.TextField(blank=True, default="", help_text="the last error of a run of this stage")
    lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    gate_error = models.TextField(blank=True, default="")

    class Meta:
        verbose_name_plural = "batches"
        ordering = ["-started_at"]

    @property
    def fill(self) -> float:
        return self.size / self.cap if self.cap else 0.0

    def __str__(self) -> str:
        return f"batch {self.id} {self.width}x{self.height}x{self.steps} ({self.size}/{self.cap})"


class JobQuerySet(models.QuerySet):
    def visible(self) -> JobQuerySet:
        """What owners see: not deleted. (A deleted job's safety record stays for
        IMAGEGEN_SAFETY_RECORD_DAYS, for moderators and appeals.)"""
        return self.filter(deleted_at=None)


class GenerationJob(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs")
    prompt = models.TextField()
    negative_prompt = models.TextField(blank=True, default="")
    # The safety policy's steering the model was given before the user's negative prompt
    # (safety/image_policy.py "steer"; gpu_tasks/generate.py records it when the job's pass is
    # made): None until then, and for jobs made before steering existed. A regeneration carries
    # its original's (jobs/pipeline/regenerate.py), "" where that is None, so it draws the same.
    steering = models.TextField(null=True, blank=True)
    # The prompt rewriter (the `rewrite` stage, between the prompt check and generation): whether
    # this job goes through it, the rewriter's identity (its version and settings: part of the
    # request-hash cache key), what it wrote (the prompt drawn; the user's own when it kept it)
    # and the stage's lease (per job: a worker rewrites the waiting jobs of every user at once).
    rewrite = models.BooleanField(default=False)
    rewriter_version = models.CharField(max_length=100, blank=True, default="")
    revised_prompt = models.TextField(blank=True, default="")
    # What the rewriter substituted, in words for the user ("pink is drawn as red ..."; issue 45 item 11).
    rewrite_notes = models.JSONField(default=list, blank=True)
    rewritten_at = models.DateTimeField(null=True, blank=True)
    rewrite_lease_expires_at = models.DateTimeField(null=True, blank=True)
    rewrite_attempts = models.PositiveSmallIntegerField(default=0, help_text="runs of the rewrite stage started")
    width = models.PositiveIntegerField()
    height = models.PositiveIntegerField()
    steps = models.PositiveIntegerField()
    guidance_scale = models.FloatField()
    seed = models.BigIntegerField()
    count = models.PositiveSmallIntegerField(default=1)
    # A video job (a video model's, scheduling/catalogue.py): frames per clip and their rate; each
    # of its `count` outputs is a clip (an image row whose files are an MP4, a poster, sprites and
    # HLS: docs/video.md). 1 and 0 for an image job.
    frames = models.PositiveSmallIntegerField(default=1)
    fps = models.PositiveSmallIntegerField(default=0)
    model_version = models.CharField(max_length=100)
    scheduler = models.CharField(max_length=60, blank=True, default="")
    # The image files: encoded once, at the GPU worker's hand-off (jobs/media/encoding.py).
    output_format = models.CharField(max_length=8, choices=OutputFormat.choices, default=OutputFormat.PNG)
    output_compression = models.PositiveSmallIntegerField(null=True, blank=True, help_text="jpeg/webp quality 0-100")
    # A regeneration of a dropped image names the job it regenerates: its files carry that job's
    # id, so they come out byte for byte the same (jobs/pipeline/regenerate.py compares sha256).
    regenerates = models.UUIDField(null=True, blank=True)
    # Scheduling tier (scheduling/policy.py): interactive, or batch work that fills what is left.
    priority = models.CharField(max_length=12, choices=Priority.choices, default=Priority.INTERACTIVE)
    # Not claimed by deadline_at (created_at + the asked-for cancel_after): cancelled, not charged.
    cancel_after = models.PositiveIntegerField(null=True, blank=True, help_text="seconds, as asked for")
    deadline_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # A signed POST on each terminal status (jobs/webhooks/delivery.py), from the WebhookDelivery outbox.
    webhook_url = models.URLField(max_length=2000, blank=True, default="")
    # The stage is the job's place in the pipeline; the status is derived from it (status_of),
    # stored beside it for the queries that filter by it, and kept equal by a CHECK constraint.
    stage = models.CharField(max_length=16, choices=JobStage.choices, default=JobStage.PROMPT, db_index=True)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED, db_index=True)
    reason = models.TextField(blank=True, default="")
    blocked_stage = models.CharField(max_length=16, blank=True, default="")
    progress_step = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    attempts = models.PositiveSmallIntegerField(default=0)
    # Admission under load: steps lowered to the degrade preset, the asked-for steps kept.
    degraded = models.BooleanField(default=False)
    requested_steps = models.PositiveIntegerField(null=True, blank=True)
    # Appeals of a blocked job: one per job, decided by a moderator.
    appeal_note = models.TextField(blank=True, default="")
    appealed_at = models.DateTimeField(null=True, blank=True)
    appeal_outcome = models.CharField(max_length=16, blank=True, default="")  # "", upheld, overturned
    batch = models.ForeignKey(Batch, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs")
    # The daily quota (jobs/access/usage.py): images this job makes on the GPU (count less the
    # request-hash cache hits), reserved while it waits, charged (UsageCharge) when first claimed.
    billable_images = models.PositiveSmallIntegerField(default=0)
    charged_at = models.DateTimeField(null=True, blank=True)
    # Set when the prompt gate admitted the job to the scheduler; the reaper rebuilds the
    # scheduler's Redis state from rows that have it and are still queued.
    scheduled_at = models.DateTimeField(null=True, blank=True)
    # When its prompt's verdict was recorded (jobs.actions.record_prompt_verdict; from migration
    # 0013 on). The cpu worker's drain finds the prompts still to check by it, through the partial
    # index below, whatever the backlog of checked jobs waiting for a GPU (jobs/pipeline/prompt_batch.py).
    prompt_checked_at = models.DateTimeField(null=True, blank=True)
    # A cross-user cache hit (IMAGEGEN_CACHE_SCOPE=k-anonymous) is queued like a fresh job and
    # done at this time, no sooner than a fresh job of its shape would be (jobs.actions.reveal_cached).
    cache_reveal_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # An identical request in flight (the same request-hash key) joined: this job makes no pass of
    # its own and takes its own copies of that job's images when it delivers (jobs.actions.lifecycle
    # reveal_start); cleared when it falls back to being generated (the leader did not deliver).
    joins = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="joiners")
    lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The owner deleted it: gone from their view, public bytes purged; the safety record (verdicts,
    # quarantined evidence, an appeal) stays until retention purges it.
    deleted_at = models.DateTimeField(null=True, blank=True, db_index=True)

    objects = JobQuerySet.as_manager()

    # Not stored: the admission estimate jobs.pipeline.submit leaves on a job it has just accepted.
    estimate: Any = None

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["owner", "-created_at"]),
            models.Index(fields=["created_at"], name="job_awaiting_prompt_check",
                         condition=models.Q(stage="prompt", prompt_checked_at=None)),
        ]
        constraints = [models.CheckConstraint(condition=_stage_matches_status(), name="job_status_of_its_stage")]

    def save(self, *args, **kwargs):
        self.status = status_of(self.stage)
        fields = kwargs.get("update_fields")
        if fields is not None and "stage" in fields:
            kwargs["update_fields"] = {*fields, "status"}
        super().save(*args, **kwargs)

    def __str__(self) -> str:
        return f"job {self.id} ({self.status}, {self.stage})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def queue_wait_seconds(self) -> float | None:
        """Seconds from admission to the scheduler until a GPU worker took the job."""
        if self.scheduled_at is None or self.started_at is None:
            return None
        return max(0.0, (self.started_at - self.scheduled_at).total_seconds())

    @property
    def drawn_prompt(self) -> str:
        """What the image model is given: the rewriter's prompt once it has run, else the user's."""
        return self.revised_prompt if self.rewrite and self.rewritten_at is not None and self.revised_prompt else self.prompt

    @property
    def shape(self) -> tuple:
        return (self.model_version, self.width, self.height, self.steps, self.guidance_scale, self.scheduler)


class GeneratedImage(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.ForeignKey(GenerationJob, on_delete=models.CASCADE, related_name="images")
    # The pass that made it (None for a request-hash cache hit, which shares another job's object).
    batch = models.ForeignKey(Batch, null=True, blank=True, on_delete=models.SET_NULL, related_name="images")
    index = models.PositiveSmallIntegerField()
    seed = models.BigIntegerField()
    # Not unique: a request-hash cache hit shares the stored object of an identical earlier
    # request; bytes are deleted only when no row points at them any more.
    storage_key = models.CharField(max_length=300, db_index=True)
    # A cache hit converted to another output format: the key of the object whose pixels it has
    # (a moderator's take-down of either reaches the other). Empty for an original.
    source_key = models.CharField(max_length=300, blank=True, default="", db_index=True)
    width = models.PositiveIntegerField()
    height = models.PositiveIntegerField()
    byte_size = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)
    # The sha256 of the file before its content credentials were signed in (jobs/media/credentials.py):
    # a regeneration reproduces these bytes, not the signature's. Empty for older files (no credentials).
    content_sha256 = models.CharField(max_length=64, blank=True, default="")
    content_type = models.CharField(max_length=60, default="image/png")
    # A video's other files (its storage_key is the MP4): {"poster": key, "sprites": key, "playlist":
    # key, "files": [every key, the MP4's first]}; {} for an image. Until publish, storage_key is the
    # clip's frames side by side in one PNG (quarantine), which the image gate judges frame by frame.
    media = models.JSONField(default=dict, blank=True)
    # public: delivered, served by URL; quarantine: held or blocked, private storage, staff only.
    tier = models.CharField(max_length=16, default="public", db_index=True)
    # Retention: view count (flushed from Redis), cold tier, bytes dropped (regenerable from
    # the inputs while the model version is served), lost (regeneration did not match sha256).
    views = models.PositiveIntegerField(default=0)
    cold = models.BooleanField(default=False)
    bytes_dropped = models.BooleanField(default=False)
    lost = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "index"]
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="one_image_per_job_index")]

    def __str__(self) -> str:
        return f"image {self.index} of {self.job_id}"


class UsageCharge(models.Model):
    """GPU work charged to a user when a GPU worker first claimed it (the daily quota counts
    these). Not a foreign key to the job: deleting the job keeps what it cost."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_charges")
    job_id = models.UUIDField(db_index=True)
    images = models.PositiveIntegerField()
    image_steps = models.PositiveIntegerField(help_text="images x steps: the GPU work, for accounting")
    priority = models.CharField(max_length=12, default="interactive", help_text="the job's tier: each has its own quota")
    charged_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["user", "charged_at"])]

    def __str__(self) -> str:
        return f"{self.images} images for {self.user_id} ({self.job_id})"


class ApiToken(models.Model):
    """An API token, stored as the SHA-256 of the token: only a short prefix is kept in clear,
    to find the row (jobs/access/tokens.py). The token itself is shown once, when it is issued."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    prefix = models.CharField(max_length=16, db_index=True)
    digest = models.CharField(max_length=64, unique=True)
    name = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="refused from then on; empty: never expires")
    # full: everything the user may do; jobs: submit, read and manage jobs, and nothing of the
    # account's keys (tokens, the webhook secret): jobs/access/tokens.py FullScope.
    scope = models.CharField(max_length=8, choices=[("full", "full"), ("jobs", "jobs")], default="full")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"token {self.prefix}... of {self.user_id}"


class IdempotencyKey(models.Model):
    """An Idempotency-Key header seen on a submit: the same key and body within
    IMAGEGEN_IDEMPOTENCY_HOURS answer with the same job (jobs/api/idempotency.py)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="idempotency_keys")
    scope = models.CharField(max_length=16, help_text="the route: jobs or openai")
    key = models.CharField(max_length=255)
    body_sha256 = models.CharField(max_length=64)
    job = models.ForeignKey(GenerationJob, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "scope", "key"], name="one_idempotency_key")]

    def __str__(self) -> str:
        return f"idempotency key {self.key!r} of {self.user_id} ({self.scope})"


class WebhookSecret(models.Model):
    """A user's webhook signing secret (whsec_<base64>), shown by GET /api/v1/account."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhook_secret")
    secret = models.CharField(max_length=100)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"webhook secret of {self.user_id}"


class WebhookDelivery(models.Model):
    """The outbox: one row per terminal status a job with a webhook_url reaches (in order: a job
    blocked, its appeal overturned and then blocked again announces blocked twice), written in the same
    transaction as the status change; delivered by a task on the io queue, re-sent by the reaper
    until delivered or IMAGEGEN_WEBHOOK_RETRY_HOURS have passed (jobs/webhooks/delivery.py)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.ForeignKey(GenerationJob, on_delete=models.CASCADE, related_name="webhook_deliveries")
    status = models.CharField(max_length=16, help_text="the job's terminal status it announces")
    announcement = models.PositiveSmallIntegerField(default=0, help_text="the job's nth terminal status (0 the first)")
    url = models.URLField(max_length=2000)
    body = models.TextField(blank=True, default="", help_text="the signed JSON, fixed at the first attempt")
    created_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(default=timezone.now, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    delivered_at = models.DateTimeField(null=True, blank=True, db_index=True)
    gave_up_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    log = models.JSONField(default=list, blank=True, help_text="each attempt: time, HTTP status or error, seconds")

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "webhook deliveries"
        constraints = [models.UniqueConstraint(fields=["job", "announcement"], name="one_webhook_per_job_announcement")]

    @property
    def message_id(self) -> str:
        return f"msg_{self.id.hex}"

    def __str__(self) -> str:
        return f"webhook {self.status} of {self.job_id} to {self.url}"


class PendingUnpublish(models.Model):
    """The outbox of take-downs: written in the take-down's transaction, deleted once the public
    object is gone (and its URLs purged from the CDN). Retried with backoff until then
    (jobs.pipeline.retention.run_unpublish), so a storage error never leaves a taken-down image
    public."""

    storage_key = models.CharField(max_length=300, db_index=True)
    keep_private_copy = models.BooleanField(default=True)
    urls = models.JSONField(default=list, blank=True, help_text="the public URLs to purge from the CDN once gone")
    created_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(default=timezone.now, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"unpublish {self.storage_key}"
