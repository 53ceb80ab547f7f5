"""Settings of the image gate, the queues, webhooks and idempotent submits, storage, content
credentials and retention."""

from __future__ import annotations

from pathlib import Path

from imagegen.config.fields import BASE_DIR, Derived, Group, setting


class Safety(Group):
    """The image gate and the safety policy (docs/safety_policy.md)."""

    image_classifier: str = setting(
        f"shapes:{BASE_DIR / 'models' / 'shapes-classifier-v3'}",
        "`shapes:<dir>`, `hf:<dir>`, `sd-safety:<dir>`, `nudenet[:<file.onnx>]`, `python:<mod>:<cls>`, several "
        "comma-separated (the worst decision wins), or `none` (verdicts say \"unchecked\"); broken or empty fails closed")
    allow_unchecked_delivery: bool = setting(False, "production refuses to start with `IMAGEGEN_IMAGE_CLASSIFIER=none` "
                                             "unless this is true too")
    classifier_timeout: float = setting(30.0, "seconds the image gate may take (tried once: a gate error fails the batch "
                                        "closed)")
    safety_policy: str = setting(str(BASE_DIR / "safety" / "policy.json"), "the policy file")
    safety_record_days: float = setting(90.0, "a job its owner deleted keeps its verdicts, quarantined images and an "
                                        "undecided appeal this long, then retention purges it")


class Queues(Group):
    """Queue names: the stage table (imagegen/stage_table.py) names every task's queue, and `make run` and deploy/
    run a pool for each."""

    queue_cpu: str = setting("cpu", "prompt checks and the other CPU stages", django="QUEUE_CPU")
    queue_io: str = setting("io", "publishing and other storage work", django="QUEUE_IO")
    queue_gpu_prefix: str = setting("gpu.", "a model's GPU queue is this + its name (+ `@<version>` for another version)",
                                    django="QUEUE_GPU_PREFIX")
    queue_classify: str = setting("classify", "the image gate: one queue for every lane (GPU-pinned in production, or a "
                                  "cheap fleet)", django="QUEUE_CLASSIFY")
    queue_webhooks: str = setting("webhooks", "webhook deliveries, with a pool of their own so a slow receiver delays "
                                  "nothing else", django="QUEUE_WEBHOOKS")
    queue_rewrite: str = setting("rewrite", "the prompt rewriter's stage (GPU-pinned in production)", django="QUEUE_REWRITE")


class Integration(Group):
    """Idempotent submits, `Prefer: wait` and signed webhooks (jobs/api/idempotency.py, jobs/webhooks/delivery.py)."""

    idempotency_hours: float = setting(24.0, "an `Idempotency-Key` answers with its job this long")
    idempotency_takeover_seconds: float = setting(30.0, "a key reserved this long with no job was left by a process that "
                                                  "died mid-submit: the next request with it takes it over")
    prefer_wait_max: float = setting(10.0, "the longest `Prefer: wait=N` a submit waits for its job to end (it holds a web "
                                     "thread: for few-step models)")
    prefer_wait_per_user: int = setting(2, "such waits one user may hold per web process (past it the usual 202 at once)")
    webhook_timeout: float = setting(10.0, "seconds one delivery attempt may take")
    webhook_resolve_timeout: float = setting(2.0, "seconds a `webhook_url`'s host may take to resolve (on a pool of its own, "
                                             "not the request thread); then 400 naming `webhook_url`")
    webhook_lookups_per_user: int = setting(2, "webhook host lookups not yet answered per user and web process (past it a "
                                            "400 at once)")
    webhook_lease_slack: float = setting(20.0, "seconds past the timeout after which the reaper re-sends an attempt whose "
                                         "worker died")
    webhook_backoff: float = setting(10.0, "seconds before the first retry; doubles, at most an hour apart")
    webhook_retry_hours: float = setting(24.0, "how long a delivery is retried, then given up")


class Storage(Group):
    """Object storage: local folders under the var folder by default, S3 (and a CDN) when IMAGEGEN_S3_BUCKET is set
    (docs/storage.md)."""

    media_root: Path = setting(Derived("`var/media`", lambda c: c.var_dir / "media"), "the local public images",
                               django="MEDIA_ROOT")
    media_url: str = setting("/media/", "the public images' URL prefix (with S3: the bucket's or the CDN's)",
                             django="MEDIA_URL")
    cdn_purge_hook: str = setting("jobs.media.cdn:log_purge", "called with the URLs of taken-down objects "
                                  "(`jobs.media.cdn:http_purge`, `jobs.media.cdn:cloudfront_invalidate` or your own)")
    s3_bucket: str = setting("", "the public images' bucket (empty: local folders)")
    s3_endpoint_url: str = setting("", "the S3 endpoint (empty: AWS itself)")
    s3_region: str = setting("us-east-1", "the bucket's region")
    s3_access_key_id: str = setting("", "empty: boto3's own chain (role, environment, profile)")
    s3_secret_access_key: str = setting("", "the access key's secret")
    s3_custom_domain: str = setting("", "the CDN's host (and path), e.g. `img.example.com`; needs a purge hook that purges")
    s3_url_protocol: str = setting("https:", "the protocol of custom-domain URLs")
    s3_addressing_style: str = setting("auto", "`auto`, `path` or `virtual`")
    s3_public_acl: str = setting("", "`public-read` puts an ACL on each public object; empty relies on a bucket policy "
                                 "that makes `i/` readable")
    s3_quarantine_bucket: str = setting("", "a private bucket for held and taken-down images (production refuses to start "
                                        "with a bucket and without this)")
    s3_quarantine_prefix: str = setting(Derived("`quarantine/` without a quarantine bucket, else none",
                                                lambda c: "" if c.s3_quarantine_bucket else "quarantine/"),
                                        "the private images' prefix")
    s3_presign_seconds: int = setting(300, "lifetime of staff links to private objects")
    s3_cold_storage_class: str = setting("STANDARD_IA", "the cold tier's storage class (or `GLACIER_IR`, ...)")
    upload_attempts: int = setting(4, "tries per S3 request on transient errors, in all (botocore's adaptive retries)")


class Credentials(Group):
    """Content credentials (C2PA) in every image file (jobs/media/credentials.py). The embedded default makes its own
    in `var/c2pa/` on first start; expired or mismatched ones refuse to start; missing ones refuse to start the
    processes that sign (web, GPU workers) and no other."""

    c2pa_key: str = setting("", "the PEM signing key (embedded: made in `var/c2pa/`)")
    c2pa_cert: str = setting("", "the PEM certificate chain, signing certificate first, issued by a CA (embedded: made in "
                             "`var/c2pa/`)")
    c2pa_trust_anchors: str = setting("", "PEM roots that verification trusts besides the embedded root (embedded: its own "
                                      "root)")
    c2pa_tsa_url: str = setting("", "an RFC 3161 time-stamp authority for the signatures, if any")


class Retention(Group):
    """Retention tiers and take-downs (docs/storage.md; docs/safety_policy.md, "Take-downs always happen")."""

    hot_days: float = setting(30.0, "images older than this with few views go to the cold tier")
    cold_max_views: int = setting(10, "views below which an old image goes cold")
    drop_cold_bytes: bool = setting(False, "cold images older than IMAGEGEN_DROP_AFTER_DAYS lose their bytes (regenerated "
                                    "on demand while their model version is served)")
    drop_after_days: float = setting(90.0, "the age at which cold images lose their bytes")
    retention_interval: float = setting(3600.0, "seconds between retention runs")
    retention_batch: int = setting(500, "objects per run and tier step")
    unpublish_interval: float = setting(30.0, "seconds between retries of the take-down outbox")
    unpublish_retry_backoff: float = setting(10.0, "the first wait after a failed delete (doubling, at most an hour)")
    unpublish_reconcile_interval: float = setting(3600.0, "seconds between reconciliations of public storage against the "
                                                  "rows")
    unpublish_reconcile_grace_seconds: float = setting(3600.0, "the age below which a public object without a public row "
                                                       "is left alone (a publish in flight)")
