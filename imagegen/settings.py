"""Settings for imagegen. Every knob is read from the environment into one typed object
(imagegen/config/: each setting's type, default and help, grouped by concern); this module takes
its names from it and builds Django's structures. docs/configuration.md's reference is generated
from the object."""

from __future__ import annotations

import dj_database_url

from imagegen import signing_credentials
from imagegen.config import BASE_DIR, load
from imagegen.secret_key import installation_secret_key

_c = load()

# --- the settings object's values under their Django names (tests/test_settings_object.py checks
# this list against the object: `python -m imagegen.config --assignments` prints it) ---
# Installation
VAR_DIR = _c.installation.var_dir
EMBEDDED = _c.installation.embedded
DEBUG = _c.installation.debug
ALLOWED_HOSTS = _c.installation.allowed_hosts
CSRF_TRUSTED_ORIGINS = _c.installation.csrf_trusted_origins
# HTTPS
SECURE_SSL_REDIRECT = _c.https.secure_ssl_redirect
SECURE_HSTS_SECONDS = _c.https.secure_hsts_seconds
SECURE_HSTS_INCLUDE_SUBDOMAINS = _c.https.secure_hsts_include_subdomains
SECURE_HSTS_PRELOAD = _c.https.secure_hsts_preload
SECURE_PROXY_SSL_HEADER = _c.https.secure_proxy_ssl_header
# Database, Redis, broker
REDIS_URL = _c.services.redis_url
CELERY_BROKER_URL = _c.services.celery_broker_url
CELERY_TASK_TIME_LIMIT = _c.services.celery_task_time_limit
CELERY_TASK_SOFT_TIME_LIMIT = _c.services.celery_task_soft_time_limit
# Web tier
IMAGEGEN_WEB_PROCESSES = _c.web.web_processes
IMAGEGEN_WEB_THREADS = _c.web.web_threads
IMAGEGEN_WEB_BACKLOG = _c.web.web_backlog
IMAGEGEN_WEB_QUEUE_TIMEOUT = _c.web.web_queue_timeout
IMAGEGEN_REDIS_POOL_SIZE = _c.web.redis_pool_size
IMAGEGEN_REDIS_POOL_TIMEOUT = _c.web.redis_pool_timeout
IMAGEGEN_SUMMARY_MAX_AGE = _c.web.summary_max_age
IMAGEGEN_SERVER_TIMING = _c.web.server_timing
# Served models and the rewriter
IMAGEGEN_MODEL_PATH = _c.models.model_path
IMAGEGEN_MODEL_NAME = _c.models.model_name
IMAGEGEN_MODEL_VERSION = _c.models.model_version
IMAGEGEN_EXTRA_MODELS = _c.models.extra_models
IMAGEGEN_QUALITY_MODELS = _c.models.quality_models
IMAGEGEN_CANARY_VERSION = _c.models.canary_version
IMAGEGEN_CANARY_SHARE = _c.models.canary_share
IMAGEGEN_REWRITER_PATH = _c.models.rewriter_path
IMAGEGEN_REWRITE_DEFAULT = _c.models.rewrite_default
IMAGEGEN_REWRITE_BATCH = _c.models.rewrite_batch
IMAGEGEN_PRIOR_REWRITE_SECONDS = _c.models.prior_rewrite_seconds
# Runtime levers
IMAGEGEN_MODEL_FAMILY = _c.levers.model_family
IMAGEGEN_DTYPE = _c.levers.dtype
IMAGEGEN_ATTENTION = _c.levers.attention
IMAGEGEN_CHANNELS_LAST = _c.levers.channels_last
IMAGEGEN_COMPILE = _c.levers.compile
IMAGEGEN_COMPILE_MODE = _c.levers.compile_mode
IMAGEGEN_WARM_UP = _c.levers.warm_up
IMAGEGEN_CFG_CUTOFF = _c.levers.cfg_cutoff
IMAGEGEN_STEP_CACHE = _c.levers.step_cache
IMAGEGEN_STEP_CACHE_THRESHOLD = _c.levers.step_cache_threshold
IMAGEGEN_TRUE_CFG_SCALE = _c.levers.true_cfg_scale
IMAGEGEN_TEXT_CACHE_SIZE = _c.levers.text_cache_size
IMAGEGEN_PREVIEW_SOURCE = _c.levers.preview_source
IMAGEGEN_PREVIEW_DECODER = _c.levers.preview_decoder
# GPU worker
IMAGEGEN_DEVICE = _c.worker.device
IMAGEGEN_TORCH_THREADS = _c.worker.torch_threads
IMAGEGEN_ACCELERATOR = _c.worker.accelerator
IMAGEGEN_SIM_STEP_MS = _c.worker.sim_step_ms
IMAGEGEN_SIM_BATCH_MARGINAL = _c.worker.sim_batch_marginal
IMAGEGEN_PRIOR_SECONDS_PER_MPX_STEP = _c.worker.prior_seconds_per_mpx_step
IMAGEGEN_PREVIEW_EVERY = _c.worker.preview_every
IMAGEGEN_PREVIEW_MIN_INTERVAL = _c.worker.preview_min_interval
IMAGEGEN_ENCODE_THREADS = _c.worker.encode_threads
IMAGEGEN_ENCODE_PROCESSES = _c.worker.encode_processes
IMAGEGEN_HANDOFF_DEPTH = _c.worker.handoff_depth
IMAGEGEN_PNG_COMPRESS_LEVEL = _c.worker.png_compress_level
# Request limits and defaults
IMAGEGEN_SIZE_MENU = _c.requests.size_menu
IMAGEGEN_MAX_STEPS = _c.requests.max_steps
IMAGEGEN_DEFAULT_STEPS = _c.requests.default_steps
IMAGEGEN_MAX_COUNT = _c.requests.max_count
IMAGEGEN_DEFAULT_GUIDANCE = _c.requests.default_guidance
IMAGEGEN_QUALITY_STEPS = _c.requests.quality_steps
IMAGEGEN_QUALITY_LEVERS = _c.requests.quality_levers
IMAGEGEN_MAX_CANCEL_AFTER = _c.requests.max_cancel_after
IMAGEGEN_OPENAI_WAIT_SECONDS = _c.requests.openai_wait_seconds
IMAGEGEN_OPENAI_CANCEL_ON_DISCONNECT = _c.requests.openai_cancel_on_disconnect
# Batch scheduler and recovery
IMAGEGEN_BATCH_CAP = _c.scheduler.batch_cap
IMAGEGEN_BATCH_CAPS = _c.scheduler.batch_caps
IMAGEGEN_FILL_WAIT = _c.scheduler.fill_wait
IMAGEGEN_STARVATION_SECONDS = _c.scheduler.starvation_seconds
IMAGEGEN_FAIR_SHARE = _c.scheduler.fair_share
IMAGEGEN_PREEMPTION = _c.scheduler.preemption
IMAGEGEN_USER_WEIGHTS = _c.scheduler.user_weights
IMAGEGEN_LEASE_SECONDS = _c.scheduler.lease_seconds
IMAGEGEN_MAX_ATTEMPTS = _c.scheduler.max_attempts
IMAGEGEN_REAPER_INTERVAL = _c.scheduler.reaper_interval
IMAGEGEN_PROMPT_CHECK_RESEND_SECONDS = _c.scheduler.prompt_check_resend_seconds
IMAGEGEN_PROMPT_BATCH = _c.scheduler.prompt_batch
IMAGEGEN_PRELOAD_PROMPT_FILTER = _c.scheduler.preload_prompt_filter
IMAGEGEN_STAGE_RESEND_SECONDS = _c.scheduler.stage_resend_seconds
IMAGEGEN_STAGE_RETRY_MAX_BACKOFF = _c.scheduler.stage_retry_max_backoff
IMAGEGEN_CLASSIFY_RETRY_SECONDS = _c.scheduler.classify_retry_seconds
IMAGEGEN_PUBLISH_RETRY_SECONDS = _c.scheduler.publish_retry_seconds
# Cache, admission and per-user limits
IMAGEGEN_CACHE_ENABLED = _c.admission.cache_enabled
IMAGEGEN_CACHE_SCOPE = _c.admission.cache_scope
IMAGEGEN_CACHE_SHARE_K = _c.admission.cache_share_k
IMAGEGEN_SEED_POLICY = _c.admission.seed_policy
IMAGEGEN_FIXED_SEED = _c.admission.fixed_seed
IMAGEGEN_MAX_QUEUE_WAIT = _c.admission.max_queue_wait
IMAGEGEN_DEGRADE_STEPS = _c.admission.degrade_steps
IMAGEGEN_MAX_QUEUED_IMAGES = _c.admission.max_queued_images
IMAGEGEN_USER_MAX_IN_FLIGHT = _c.admission.user_max_in_flight
IMAGEGEN_USER_MAX_IMAGES_PER_DAY = _c.admission.user_max_images_per_day
IMAGEGEN_BATCH_MAX_QUEUE_WAIT = _c.admission.batch_max_queue_wait
IMAGEGEN_USER_MAX_BATCH_IN_FLIGHT = _c.admission.user_max_batch_in_flight
IMAGEGEN_USER_MAX_BATCH_IMAGES_PER_DAY = _c.admission.user_max_batch_images_per_day
IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE = _c.admission.user_prompt_checks_per_minute
IMAGEGEN_USER_MAX_IN_REVIEW = _c.admission.user_max_in_review
IMAGEGEN_USER_MAX_TOKENS = _c.admission.user_max_tokens
IMAGEGEN_USER_MAX_STREAMS = _c.admission.user_max_streams
IMAGEGEN_WATCH_REREAD_SECONDS = _c.admission.watch_reread_seconds
# Request rates, sign-in, metrics access
IMAGEGEN_THROTTLE_SUBMIT = _c.access.throttle_submit
IMAGEGEN_THROTTLE_READ = _c.access.throttle_read
IMAGEGEN_THROTTLE_STREAM = _c.access.throttle_stream
IMAGEGEN_THROTTLE_IP = _c.access.throttle_ip
IMAGEGEN_NUM_PROXIES = _c.access.num_proxies
IMAGEGEN_SIGNIN_MAX_FAILURES = _c.access.signin_max_failures
IMAGEGEN_SIGNIN_WINDOW_SECONDS = _c.access.signin_window_seconds
IMAGEGEN_SIGNIN_MAX_DELAY = _c.access.signin_max_delay
IMAGEGEN_SIGNIN_KNOWN_DAYS = _c.access.signin_known_days
IMAGEGEN_METRICS_TOKEN = _c.access.metrics_token
IMAGEGEN_METRICS_ALLOW = _c.access.metrics_allow
IMAGEGEN_METRICS_CACHE_SECONDS = _c.access.metrics_cache_seconds
# Safety
IMAGEGEN_IMAGE_CLASSIFIER = _c.safety.image_classifier
IMAGEGEN_ALLOW_UNCHECKED_DELIVERY = _c.safety.allow_unchecked_delivery
IMAGEGEN_CLASSIFIER_TIMEOUT = _c.safety.classifier_timeout
IMAGEGEN_SAFETY_POLICY = _c.safety.safety_policy
IMAGEGEN_SAFETY_RECORD_DAYS = _c.safety.safety_record_days
# Queues
QUEUE_CPU = _c.queues.queue_cpu
QUEUE_IO = _c.queues.queue_io
QUEUE_GPU_PREFIX = _c.queues.queue_gpu_prefix
QUEUE_CLASSIFY = _c.queues.queue_classify
QUEUE_WEBHOOKS = _c.queues.queue_webhooks
QUEUE_REWRITE = _c.queues.queue_rewrite
# Idempotency, Prefer: wait, webhooks
IMAGEGEN_IDEMPOTENCY_HOURS = _c.integration.idempotency_hours
IMAGEGEN_IDEMPOTENCY_TAKEOVER_SECONDS = _c.integration.idempotency_takeover_seconds
IMAGEGEN_PREFER_WAIT_MAX = _c.integration.prefer_wait_max
IMAGEGEN_PREFER_WAIT_PER_USER = _c.integration.prefer_wait_per_user
IMAGEGEN_WEBHOOK_TIMEOUT = _c.integration.webhook_timeout
IMAGEGEN_WEBHOOK_RESOLVE_TIMEOUT = _c.integration.webhook_resolve_timeout
IMAGEGEN_WEBHOOK_LOOKUPS_PER_USER = _c.integration.webhook_lookups_per_user
IMAGEGEN_WEBHOOK_LEASE_SLACK = _c.integration.webhook_lease_slack
IMAGEGEN_WEBHOOK_BACKOFF = _c.integration.webhook_backoff
IMAGEGEN_WEBHOOK_RETRY_HOURS = _c.integration.webhook_retry_hours
# Object storage
MEDIA_ROOT = _c.storage.media_root
MEDIA_URL = _c.storage.media_url
IMAGEGEN_CDN_PURGE_HOOK = _c.storage.cdn_purge_hook
IMAGEGEN_S3_BUCKET = _c.storage.s3_bucket
IMAGEGEN_S3_ENDPOINT_URL = _c.storage.s3_endpoint_url
IMAGEGEN_S3_REGION = _c.storage.s3_region
IMAGEGEN_S3_ACCESS_KEY_ID = _c.storage.s3_access_key_id
IMAGEGEN_S3_SECRET_ACCESS_KEY = _c.storage.s3_secret_access_key
IMAGEGEN_S3_CUSTOM_DOMAIN = _c.storage.s3_custom_domain
IMAGEGEN_S3_URL_PROTOCOL = _c.storage.s3_url_protocol
IMAGEGEN_S3_ADDRESSING_STYLE = _c.storage.s3_addressing_style
IMAGEGEN_S3_PUBLIC_ACL = _c.storage.s3_public_acl
IMAGEGEN_S3_QUARANTINE_BUCKET = _c.storage.s3_quarantine_bucket
IMAGEGEN_S3_QUARANTINE_PREFIX = _c.storage.s3_quarantine_prefix
IMAGEGEN_S3_PRESIGN_SECONDS = _c.storage.s3_presign_seconds
IMAGEGEN_S3_COLD_STORAGE_CLASS = _c.storage.s3_cold_storage_class
IMAGEGEN_UPLOAD_ATTEMPTS = _c.storage.upload_attempts
# Content credentials
IMAGEGEN_C2PA_KEY = _c.credentials.c2pa_key
IMAGEGEN_C2PA_CERT = _c.credentials.c2pa_cert
IMAGEGEN_C2PA_TRUST_ANCHORS = _c.credentials.c2pa_trust_anchors
IMAGEGEN_C2PA_TSA_URL = _c.credentials.c2pa_tsa_url
# Retention and take-downs
IMAGEGEN_HOT_DAYS = _c.retention.hot_days
IMAGEGEN_COLD_MAX_VIEWS = _c.retention.cold_max_views
IMAGEGEN_DROP_COLD_BYTES = _c.retention.drop_cold_bytes
IMAGEGEN_DROP_AFTER_DAYS = _c.retention.drop_after_days
IMAGEGEN_RETENTION_INTERVAL = _c.retention.retention_interval
IMAGEGEN_RETENTION_BATCH = _c.retention.retention_batch
IMAGEGEN_UNPUBLISH_INTERVAL = _c.retention.unpublish_interval
IMAGEGEN_UNPUBLISH_RETRY_BACKOFF = _c.retention.unpublish_retry_backoff
IMAGEGEN_UNPUBLISH_RECONCILE_INTERVAL = _c.retention.unpublish_reconcile_interval
IMAGEGEN_UNPUBLISH_RECONCILE_GRACE_SECONDS = _c.retention.unpublish_reconcile_grace_seconds

# --- derived from the values above ---
# The embedded default runs on loopback with a key generated for this installation and kept in
# the var folder (imagegen/secret_key.py); production must set its own (no default then).
SECRET_KEY = _c.installation.secret_key or installation_secret_key(VAR_DIR)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = _c.https.secure_cookies
# Probes and scrapes come over plain HTTP from inside the deployment.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "channels",
    "jobs",
    "safety",
    "gpu_tasks",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # 503 + Retry-After instead of 500 for plain views when the database or Redis is down.
    "jobs.api.errors.ServiceUnavailableMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # RateLimit-* headers, and the settling of conditional reads (jobs/access/throttles.py).
    "jobs.access.throttles.RateLimitMiddleware",
]
# A per-request breakdown in a Server-Timing header (wall, CPU, database, Redis, thread wait;
# jobs/api/timing.py), for bench/api_load.py --breakdown. Off by default.
if IMAGEGEN_SERVER_TIMING:
    MIDDLEWARE.insert(0, "jobs.api.timing.ServerTimingMiddleware")

ROOT_URLCONF = "imagegen.urls"
ASGI_APPLICATION = "imagegen.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database: SQLite file by default, DATABASE_URL (PostgreSQL) in CI and production ---
DATABASES = {"default": dj_database_url.parse(_c.services.database_url, conn_max_age=60)}
DATABASES["default"]["CONN_MAX_AGE"] = _c.services.db_conn_max_age
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Web and workers are separate processes writing one file: wait for the lock, don't fail.
    # WAL lets the web process read while a worker writes; synchronous=NORMAL keeps WAL durable
    # across process crashes (not power loss), which is the embedded default's promise.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # Tests share the database with worker processes, so the test database is a file too.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-db.sqlite3")}
else:
    # One persistent connection per web thread (Django keeps connections per thread), checked
    # before reuse: the pool is the thread pool, so it can never run dry under load.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # A connection attempt that hangs must not hold a web thread for long.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("connect_timeout", _c.services.db_connect_timeout)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Django's validators: the admin's password forms and `changepassword` refuse short, common,
# all-digit passwords and ones close to the user's name.
AUTH_PASSWORD_VALIDATORS: list[dict] = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
     "OPTIONS": {"min_length": _c.access.password_min_length}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

STORAGES: dict[str, dict] = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
IMAGE_CACHE_CONTROL = "public, max-age=31536000, immutable"

# --- fixed request limits ---
IMAGEGEN_MIN_STEPS = 1
IMAGEGEN_MAX_PROMPT_CHARS = 2000

# --- Celery: one routing table, every queue named once ---
QUEUE_GPU = QUEUE_GPU_PREFIX + IMAGEGEN_MODEL_NAME
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_DEFAULT_QUEUE = QUEUE_CPU
# Every task's queue comes from the stage table (imagegen/stage_table.py: each stage's task,
# queue, next stage, lease and retry bound); `{lane}` queues take the lane from the task's
# first argument. Call sites never name a queue.
CELERY_TASK_ROUTES = ("imagegen.stage_table.route",)
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Every web thread may send a task at once: kombu's Redis pool does not wait past its
# max_connections (default 10) but raises "Too many connections", so size it to the threads.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600, "max_connections": 2 * IMAGEGEN_WEB_THREADS + 8}
CELERY_BROKER_POOL_LIMIT = IMAGEGEN_WEB_THREADS + 4
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    "reap": {"task": "jobs.pipeline.tasks.reap", "schedule": IMAGEGEN_REAPER_INTERVAL},
    "sample-figures": {"task": "imagegen.dashboard.sample_figures", "schedule": 60.0},
    "idempotency-keys": {"task": "jobs.api.idempotency.expire", "schedule": 300.0},
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # redis-py's default 5 s read timeout races channels_redis's 5 s blocking receive.
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}], "capacity": 1000, "expiry": 120},
    }
}

REST_FRAMEWORK = {
    # Token first, so a request without credentials gets 401 with WWW-Authenticate.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "jobs.access.tokens.HashedTokenAuthentication",
        "jobs.access.tokens.BearerTokenAuthentication",  # the same tokens, as OpenAI clients send them
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_THROTTLE_CLASSES": ["jobs.access.throttles.RequestRateThrottle"],
    "NUM_PROXIES": IMAGEGEN_NUM_PROXIES,
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "jobs.api.errors.exception_handler",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "imagegen.logs.JsonFormatter"},
    },
    # json (the default): one object a line with job_id / batch_id / stage; plain for reading.
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": _c.web.log_format}},
    "root": {"handlers": ["console"], "level": _c.web.log_level},
    "loggers": {"django.request": {"level": "ERROR"}},
}

# --- API schema and docs (drf-spectacular; Swagger UI served locally by the sidecar) ---
INSTALLED_APPS += ["drf_spectacular", "drf_spectacular_sidecar"]
REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"] = "jobs.api.schema.ImagegenAutoSchema"
SPECTACULAR_SETTINGS = {
    "TITLE": "imagegen API",
    "DESCRIPTION": (
        "Text-to-image jobs: submit a prompt (202 and the job at once), follow it by polling, server-sent "
        "events or a websocket, fetch the images by immutable URL. Auth: `Authorization: Token <token>` "
        "(or a session cookie) on the native API, `Authorization: Bearer <token>` on the OpenAI-compatible "
        "routes under /v1/. Errors: 400 `{field: [messages]}`; 401/403/404/409/429/503 `{\"detail\": ...}`; "
        "429 and 503 carry Retry-After. The OpenAI-compatible routes answer errors as `{\"error\": {message, "
        "type, param, code}}`. See docs/api.md."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PUBLIC": True,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],  # the schema and the docs need no auth, and a stale token does not 401 them
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None, "persistAuthorization": True},
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {"JobStatusEnum": "jobs.models.JobStatus", "OutputFormatEnum": "jobs.models.OutputFormat",
                            # The OpenAI shapes' `object` fields: one enum per value, named after it.
                            "ModelObjectEnum": ["model"], "ListObjectEnum": ["list"], "VideoObjectEnum": ["video"],
                            "VideoDeletedObjectEnum": ["video.deleted"]},
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "jobs.api.schema.document_plain_views"],
}

# --- content credentials (C2PA) ---
# The embedded default makes its own key and chain in VAR_DIR/c2pa on first start
# (imagegen/signing_credentials.py).
if EMBEDDED and not (IMAGEGEN_C2PA_KEY or IMAGEGEN_C2PA_CERT):
    _credentials = signing_credentials.embedded(VAR_DIR)
    IMAGEGEN_C2PA_KEY, IMAGEGEN_C2PA_CERT = str(_credentials.key), str(_credentials.chain)
    IMAGEGEN_C2PA_TRUST_ANCHORS = IMAGEGEN_C2PA_TRUST_ANCHORS or str(_credentials.trust_anchors)
# A key and chain that are named are checked in every process (a wrong one is a mistake wherever
# it is read). None named: only the processes that sign need them, and refuse to start without
# them (the web's ASGI app, a worker whose stage rows load "signing_key": signing_credentials.require).
if IMAGEGEN_C2PA_KEY or IMAGEGEN_C2PA_CERT:
    try:
        signing_credentials.check(IMAGEGEN_C2PA_KEY, IMAGEGEN_C2PA_CERT)
    except signing_credentials.CredentialsError as _exc:
        from django.core.exceptions import ImproperlyConfigured
        raise ImproperlyConfigured(f"content credentials: {_exc}") from None


def s3_storages(
    bucket: str,
    *,
    endpoint_url: str = "",
    region: str = "us-east-1",
    access_key: str = "",
    secret_key: str = "",
    custom_domain: str = "",
    url_protocol: str = "https:",
    addressing_style: str = "auto",
    public_acl: str = "",
    quarantine_bucket: str = "",
    quarantine_prefix: str = "quarantine/",
    presign_seconds: int = 300,
    cache_control: str = IMAGE_CACHE_CONTROL,
    attempts: int = 4,
) -> dict:
    """The "default" (public images) and "quarantine" (private) entries of STORAGES for a bucket.
    A function so the tests build exactly what a deployment gets."""
    from botocore.config import Config

    def config():
        # botocore's retries are the only ones at this level (adaptive: it also slows down when
        # the store throttles); `attempts` counts the first try.
        return Config(
            s3={"addressing_style": addressing_style},
            retries={"total_max_attempts": max(1, attempts), "mode": "adaptive"},
            connect_timeout=5,
            read_timeout=30,
        )

    common = {
        "endpoint_url": endpoint_url or None,
        "region_name": region or None,
        "access_key": access_key or None,
        "secret_key": secret_key or None,
        "file_overwrite": True,  # keys are random and never reused: no HEAD before each upload
    }
    public = {
        **common,
        "bucket_name": bucket,
        "client_config": config(),
        "querystring_auth": False,  # plain, cacheable URLs: no per-request signature
        "custom_domain": custom_domain or None,
        "url_protocol": url_protocol,
        "object_parameters": {"CacheControl": cache_control},  # ContentType from the key's extension
        "default_acl": public_acl or None,
    }
    private = {
        **common,
        "bucket_name": quarantine_bucket or bucket,
        "location": quarantine_prefix.strip("/"),
        "client_config": config(),
        "querystring_auth": True,  # staff links are presigned and short-lived
        "querystring_expire": presign_seconds,
        "object_parameters": {"CacheControl": "private, no-store"},
        "default_acl": "private" if public_acl else None,
    }
    return {
        "default": {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": public},
        "quarantine": {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": private},
    }


# Local default: quarantine is a folder outside MEDIA_ROOT, never served by any URL.
STORAGES["quarantine"] = {
    "BACKEND": "django.core.files.storage.FileSystemStorage",
    "OPTIONS": {"location": str(VAR_DIR / "quarantine")},
}
if IMAGEGEN_S3_BUCKET:
    STORAGES.update(
        s3_storages(
            IMAGEGEN_S3_BUCKET,
            endpoint_url=IMAGEGEN_S3_ENDPOINT_URL,
            region=IMAGEGEN_S3_REGION,
            access_key=IMAGEGEN_S3_ACCESS_KEY_ID,
            secret_key=IMAGEGEN_S3_SECRET_ACCESS_KEY,
            custom_domain=IMAGEGEN_S3_CUSTOM_DOMAIN,
            url_protocol=IMAGEGEN_S3_URL_PROTOCOL,
            addressing_style=IMAGEGEN_S3_ADDRESSING_STYLE,
            public_acl=IMAGEGEN_S3_PUBLIC_ACL,
            quarantine_bucket=IMAGEGEN_S3_QUARANTINE_BUCKET,
            quarantine_prefix=IMAGEGEN_S3_QUARANTINE_PREFIX,
            presign_seconds=IMAGEGEN_S3_PRESIGN_SECONDS,
            attempts=IMAGEGEN_UPLOAD_ATTEMPTS,
        )
    )
    MEDIA_URL = (
        f"{IMAGEGEN_S3_URL_PROTOCOL}//{IMAGEGEN_S3_CUSTOM_DOMAIN}/"
        if IMAGEGEN_S3_CUSTOM_DOMAIN
        else f"{(IMAGEGEN_S3_ENDPOINT_URL or 'https://s3.amazonaws.com').rstrip('/')}/{IMAGEGEN_S3_BUCKET}/"
    )

# Retention and take-downs run on the cpu workers' beat.
CELERY_IMPORTS = [*globals().get("CELERY_IMPORTS", []), "jobs.pipeline.tasks", "jobs.api.idempotency", "jobs.pipeline.retention", "jobs.media.cdn", "imagegen.dashboard",
                  "jobs.admission.summary"]  # its refresher thread starts on the cpu workers
CELERY_BEAT_SCHEDULE["retention"] = {"task": "jobs.pipeline.retention.run_retention", "schedule": IMAGEGEN_RETENTION_INTERVAL}
CELERY_BEAT_SCHEDULE["unpublish"] = {"task": "jobs.pipeline.retention.run_unpublish", "schedule": IMAGEGEN_UNPUBLISH_INTERVAL}
