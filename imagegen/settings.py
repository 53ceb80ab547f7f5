"""Settings for imagegen. Every knob is read from the environment; see docs/configuration.md."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import dj_database_url

from imagegen import signing_credentials
from imagegen.env import (
    ImproperlyConfiguredEnv,
    env_bool,
    env_caps,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_models,
    env_rate,
    env_sizes,
    env_str,
    env_weights,
)
from imagegen.secret_key import installation_secret_key

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("IMAGEGEN_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DJANGO_DEBUG", False)
EMBEDDED = env_bool("IMAGEGEN_EMBEDDED", True)
# The embedded default runs on loopback with a key generated for this installation and kept in
# the var folder (imagegen/secret_key.py); production must set its own (no default then).
SECRET_KEY = env_str("DJANGO_SECRET_KEY", "") if EMBEDDED else env_str("DJANGO_SECRET_KEY")
SECRET_KEY = SECRET_KEY or installation_secret_key(VAR_DIR)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

# --- HTTPS (production): `manage.py check --deploy` passes with IMAGEGEN_EMBEDDED=false, a
# secret key and the allowed hosts; the embedded default serves plain HTTP on loopback. ---
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", not EMBEDDED)
# Probes and scrapes come over plain HTTP from inside the deployment.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 0 if EMBEDDED else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", not EMBEDDED)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", not EMBEDDED)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", not EMBEDDED)
# Behind a TLS-terminating proxy that sets it (and strips it from clients): e.g.
# "HTTP_X_FORWARDED_PROTO,https". Without it, SSL redirect behind such a proxy loops.
_proxy_header = env_list("DJANGO_SECURE_PROXY_SSL_HEADER", [])
SECURE_PROXY_SSL_HEADER = (_proxy_header[0], _proxy_header[1]) if len(_proxy_header) == 2 else None

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
IMAGEGEN_SERVER_TIMING = env_bool("IMAGEGEN_SERVER_TIMING", False)
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
_sqlite_path = VAR_DIR / "db.sqlite3"
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{_sqlite_path}"), conn_max_age=60
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Web and workers are separate processes writing one file: wait for the lock, don't fail.
    # WAL lets the web process read while a worker writes; synchronous=NORMAL keeps WAL durable
    # across process crashes (not power loss), which is the embedded default's promise.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = env_int("IMAGEGEN_DB_CONN_MAX_AGE", 0)
    # Tests share the database with worker processes, so the test database is a file too.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-db.sqlite3")}
else:
    # One persistent connection per web thread (Django keeps connections per thread), checked
    # before reuse: the pool is the thread pool, so it can never run dry under load.
    DATABASES["default"]["CONN_MAX_AGE"] = env_int("IMAGEGEN_DB_CONN_MAX_AGE", 60)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # A connection attempt that hangs must not hold a web thread for long.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("connect_timeout", env_int("IMAGEGEN_DB_CONNECT_TIMEOUT", 5))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Django's validators: the admin's password forms and `changepassword` refuse short, common,
# all-digit passwords and ones close to the user's name.
AUTH_PASSWORD_VALIDATORS: list[dict] = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
     "OPTIONS": {"min_length": env_int("IMAGEGEN_PASSWORD_MIN_LENGTH", 10)}},
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

# --- Redis: broker, channel layer, scheduler state ---
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")

# --- the web tier (imagegen/asgi.py, scripts/run.py, docs/operations.md "Running the API tier") ---
# Processes that serve HTTP and websockets on one port (0: one per CPU core, at most 8); sync
# views run on WEB_THREADS threads in each. A request that finds every thread busy waits with
# at most WEB_BACKLOG others, and at most WEB_QUEUE_TIMEOUT seconds; past either it is
# answered 429 + Retry-After (busy), never queued without bound.
IMAGEGEN_WEB_PROCESSES = env_int("IMAGEGEN_WEB_PROCESSES", 0)
IMAGEGEN_WEB_THREADS = env_int("IMAGEGEN_WEB_THREADS", 8)
IMAGEGEN_WEB_BACKLOG = env_int("IMAGEGEN_WEB_BACKLOG", 64)
IMAGEGEN_WEB_QUEUE_TIMEOUT = env_float("IMAGEGEN_WEB_QUEUE_TIMEOUT", 2.0)
# Connection pools, sized to the threads and blocking: a thread waits this long for a free
# connection, then the answer is 429 (busy), never "Too many connections".
IMAGEGEN_REDIS_POOL_SIZE = env_int("IMAGEGEN_REDIS_POOL_SIZE", IMAGEGEN_WEB_THREADS + 8)
IMAGEGEN_REDIS_POOL_TIMEOUT = env_float("IMAGEGEN_REDIS_POOL_TIMEOUT", 2.0)
# The wait-estimate summary (jobs/admission/summary.py): an entry is refreshed when older than 20
# times its own compute time (at most 1/20 of a core per entry), and never used older than this.
IMAGEGEN_SUMMARY_MAX_AGE = env_float("IMAGEGEN_SUMMARY_MAX_AGE", 30.0)

# --- object storage ---
MEDIA_ROOT = Path(env_str("IMAGEGEN_MEDIA_ROOT", str(VAR_DIR / "media")))
MEDIA_URL = env_str("IMAGEGEN_MEDIA_URL", "/media/")
STORAGES: dict[str, dict] = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
IMAGE_CACHE_CONTROL = "public, max-age=31536000, immutable"
IMAGEGEN_CDN_PURGE_HOOK = env_str("IMAGEGEN_CDN_PURGE_HOOK", "jobs.media.cdn:log_purge")

# --- the served model ---
# The shipped models: shapes-v2 (issue 34: every kind drawn right) is the default; shapes-v1 stays
# served, selectable, so its old jobs keep regenerating (a version no longer served answers 410);
# the distilled students (shapes-v2-lcm where it is shipped, else shapes-v1-lcm) serve the
# OpenAI "low" tier. IMAGEGEN_MODEL_PATH=models/shapes-v1 rolls back (docs/model.md).
_shipped_v1 = BASE_DIR / "models" / "shapes-v1"
_shipped_v2 = BASE_DIR / "models" / "shapes-v2"
_shipped_students = [BASE_DIR / "models" / "shapes-v2-lcm", BASE_DIR / "models" / "shapes-v1-lcm"]
_shipped = [m for m in (_shipped_v2, _shipped_v1, *_shipped_students) if (m / "model_index.json").exists()]
_shipped_model = next((m for m in (_shipped_v2, _shipped_v1) if m in _shipped), None)
_default_model = _shipped_model or VAR_DIR / "models" / "tiny-random"
IMAGEGEN_MODEL_PATH = Path(env_str("IMAGEGEN_MODEL_PATH", str(_default_model)))
_serving_shipped = IMAGEGEN_MODEL_PATH in _shipped
# The model's name picks its GPU queue (gpu.<name>); the version is recorded on every job.
IMAGEGEN_MODEL_NAME = env_str("IMAGEGEN_MODEL_NAME", "shapes")
IMAGEGEN_MODEL_VERSION = env_str("IMAGEGEN_MODEL_VERSION", IMAGEGEN_MODEL_PATH.name)
# More versions a job may choose with its `model` field, each on its own lane
# (gpu.<name>@<version>): "version=path,...", or "none". Default: every other shipped model
# beside a shipped default (scheduling/catalogue.py); none beside any other model.
IMAGEGEN_EXTRA_MODELS = {
    version: str(Path(path) if Path(path).is_absolute() else BASE_DIR / path)
    for version, path in env_models(
        "IMAGEGEN_EXTRA_MODELS",
        {m.name: str(m) for m in _shipped if m != IMAGEGEN_MODEL_PATH} if _serving_shipped else {},
    ).items()
}
# OpenAI quality tiers sent to another served model when a request names none: "low=VERSION,...".
_student = next((m.name for m in _shipped_students if m.name in IMAGEGEN_EXTRA_MODELS), None)
IMAGEGEN_QUALITY_MODELS = {
    tier: version for tier, version in env_models(
        "IMAGEGEN_QUALITY_MODELS", {"low": _student} if _student else {}
    ).items() if version in IMAGEGEN_EXTRA_MODELS or version == IMAGEGEN_MODEL_VERSION
}
# Canary rollout: a share of new jobs goes to another version of the model, served by workers
# started with that version's path on the queue gpu.<name>@<version>. `manage.py rollout`
# compares the versions and moves queued jobs between them (promote / roll back).
IMAGEGEN_CANARY_VERSION = env_str("IMAGEGEN_CANARY_VERSION", "")
IMAGEGEN_CANARY_SHARE = env_float("IMAGEGEN_CANARY_SHARE", 0.0)
IMAGEGEN_DEVICE = env_str("IMAGEGEN_DEVICE", "cpu")
# The prompt rewriter (a stage of its own, `rewrite`, between the prompt check and generation;
# docs/rewriter.md): a small language model that turns free-form descriptions into the served
# model's caption grammar. Default: the shipped rewriter when the shipped model is served.
_shipped_rewriter = BASE_DIR / "models" / "rewriter-v2"
IMAGEGEN_REWRITER_PATH = env_str(
    "IMAGEGEN_REWRITER_PATH",
    str(_shipped_rewriter) if _serving_shipped and (_shipped_rewriter / "config.json").exists() else "",
)
# What a request's `rewrite: auto` (and every OpenAI-route request) means: on or off. On by
# default wherever a rewriter is configured.
IMAGEGEN_REWRITE_DEFAULT = env_str("IMAGEGEN_REWRITE_DEFAULT", "on" if IMAGEGEN_REWRITER_PATH else "off")
if IMAGEGEN_REWRITE_DEFAULT not in ("on", "off"):
    raise ImproperlyConfiguredEnv(f"IMAGEGEN_REWRITE_DEFAULT must be on or off, not {IMAGEGEN_REWRITE_DEFAULT!r}")
# Prompts one forward pass of the rewriter takes at most (the waiting ones of every user).
IMAGEGEN_REWRITE_BATCH = env_int("IMAGEGEN_REWRITE_BATCH", 16)
# Seconds one rewriter pass is assumed to take before the first is measured (the shipped one:
# ~11 ms at batch 1 and ~28 ms at batch 16 on one CPU thread; bench/rewriter.py).
IMAGEGEN_PRIOR_REWRITE_SECONDS = env_float("IMAGEGEN_PRIOR_REWRITE_SECONDS", 0.03)
# Runtime levers for the per-step cost (bench/runtime_levers.py measures each on and off).
IMAGEGEN_DTYPE = env_str("IMAGEGEN_DTYPE", "float32")  # float32 | bfloat16 | float16 (GPU)
IMAGEGEN_ATTENTION = env_str("IMAGEGEN_ATTENTION", "sdpa")  # sdpa | classic
IMAGEGEN_CHANNELS_LAST = env_bool("IMAGEGEN_CHANNELS_LAST", False)
IMAGEGEN_COMPILE = env_bool("IMAGEGEN_COMPILE", False)
IMAGEGEN_COMPILE_MODE = env_str("IMAGEGEN_COMPILE_MODE", "default")  # or max-autotune, reduce-overhead
# The family the operator expects at IMAGEGEN_MODEL_PATH (sd15, sdxl, sd3, flux, pixart; empty:
# any). Every setting below is checked against the family at load (gpu_tasks/families.py): one
# it cannot honour stops the worker at start, named in its log and in /readyz.
IMAGEGEN_MODEL_FAMILY = env_str("IMAGEGEN_MODEL_FAMILY", "")
# Stop classifier-free guidance after this fraction of the steps (0: off). sd15, sdxl, sd3.
IMAGEGEN_CFG_CUTOFF = env_float("IMAGEGEN_CFG_CUTOFF", 0.0)
# Step caching: off | first-block (diffusers' first-block cache; flux), and its threshold.
IMAGEGEN_STEP_CACHE = env_str("IMAGEGEN_STEP_CACHE", "off")
IMAGEGEN_STEP_CACHE_THRESHOLD = env_float("IMAGEGEN_STEP_CACHE_THRESHOLD", 0.05)
# Flux: > 1 honours negative prompts by true CFG (a second pass per step); 1: negative prompts refused.
IMAGEGEN_TRUE_CFG_SCALE = env_float("IMAGEGEN_TRUE_CFG_SCALE", 1.0)
# Text-encoder outputs kept per (model version, prompt, negative prompt); 0: off.
IMAGEGEN_TEXT_CACHE_SIZE = env_int("IMAGEGEN_TEXT_CACHE_SIZE", 0)
# Previews decode the model's clean-image estimate (x0) or the noisy latents (latents).
IMAGEGEN_PREVIEW_SOURCE = env_choice("IMAGEGEN_PREVIEW_SOURCE", "x0", ("x0", "latents"))
# Previews through the tiny decoder a model ships (preview_decoder.safetensors); off: the linear map.
IMAGEGEN_PREVIEW_DECODER = env_bool("IMAGEGEN_PREVIEW_DECODER", True)
# Run each menu shape once at worker start (needed with torch.compile; cheap without).
IMAGEGEN_WARM_UP = env_bool("IMAGEGEN_WARM_UP", IMAGEGEN_COMPILE)
# "real" runs the diffusers pipeline; "simulated" sleeps by a cost model (gpu_tasks/simulated.py).
IMAGEGEN_ACCELERATOR = env_str("IMAGEGEN_ACCELERATOR", "real")
IMAGEGEN_SIM_STEP_MS = env_float("IMAGEGEN_SIM_STEP_MS", 40.0)
IMAGEGEN_SIM_BATCH_MARGINAL = env_float("IMAGEGEN_SIM_BATCH_MARGINAL", 0.15)
# Threads per worker process for torch on CPU; 0 leaves torch's default. One thread per
# process measured 60x faster than the default when two processes share two cores.
IMAGEGEN_TORCH_THREADS = env_int("IMAGEGEN_TORCH_THREADS", 1)

# --- request limits ---
IMAGEGEN_SIZE_MENU = env_sizes("IMAGEGEN_SIZE_MENU", [(64, 64), (96, 64), (64, 96), (96, 96)])
IMAGEGEN_MIN_STEPS = 1
IMAGEGEN_MAX_STEPS = env_int("IMAGEGEN_MAX_STEPS", 150)
IMAGEGEN_DEFAULT_STEPS = env_int("IMAGEGEN_DEFAULT_STEPS", 20)
IMAGEGEN_MAX_COUNT = env_int("IMAGEGEN_MAX_COUNT", 8)
IMAGEGEN_DEFAULT_GUIDANCE = env_float("IMAGEGEN_DEFAULT_GUIDANCE", 5.0)
# The OpenAI route's quality tiers as steps, per served model ("low:8,medium:20,high:40");
# docs/families.md has each tier's GPU-seconds and accuracy on the shipped model.
IMAGEGEN_QUALITY_STEPS = {"low": 8, "medium": 20, "high": 40} | {
    tier.strip(): int(steps) for tier, steps in (item.split(":") for item in env_list("IMAGEGEN_QUALITY_STEPS", []))
}
# The levers a tier bundles on the default model, "low:cfg-cutoff=0.5" (gpu_tasks/levers.py
# `variant`): a job of that tier runs its pass with them, in batches of its own, and its cache
# entries are its own. Other served models take theirs from serving.json (`quality_levers`).
# Measured (bench/quality_tiers.py, docs/benchmarks.md "Quality tiers of the shipped model"): at low's 8 steps the cutoff lifts colour
# accuracy from 66% to 100% and is faster; at 20 and 40 steps it costs 14-16 points of shape
# accuracy, so only low bundles it. "none" bundles nothing.
IMAGEGEN_QUALITY_LEVERS = {
    tier.strip(): variant.strip()
    for tier, variant in (
        item.split(":", 1) for item in env_list("IMAGEGEN_QUALITY_LEVERS", ["low:cfg-cutoff=0.5"]) if item != "none"
    )
}
IMAGEGEN_MAX_PROMPT_CHARS = 2000

# --- batch scheduler ---
IMAGEGEN_BATCH_CAP = env_int("IMAGEGEN_BATCH_CAP", 8)  # images per pass, any shape
# Per-shape caps as "WxH:cap,..."; a measured table from `manage.py measure_batch_caps`.
IMAGEGEN_BATCH_CAPS = env_caps("IMAGEGEN_BATCH_CAPS")
IMAGEGEN_FILL_WAIT = env_float("IMAGEGEN_FILL_WAIT", 0.3)  # seconds a partial batch waits for more
IMAGEGEN_STARVATION_SECONDS = env_float("IMAGEGEN_STARVATION_SECONDS", 10.0)
# Fair share inside a shape: deficit round robin by images across owners (scheduling/policy.py);
# false takes each shape first-in first-out (the scheduler before fair share, for comparison).
IMAGEGEN_FAIR_SHARE = env_bool("IMAGEGEN_FAIR_SHARE", True)
# Per-user fair-share weights, "username=weight,..." (default 1): a weight of 2 gets twice the images per round.
IMAGEGEN_USER_WEIGHTS = env_weights("IMAGEGEN_USER_WEIGHTS")
# A lease means a worker holds the work: taken when a worker starts a stage, renewed every third
# of this while it runs. Work waiting in a queue holds none and is never declared stuck.
IMAGEGEN_LEASE_SECONDS = env_float("IMAGEGEN_LEASE_SECONDS", 30.0)
IMAGEGEN_MAX_ATTEMPTS = env_int("IMAGEGEN_MAX_ATTEMPTS", 3)
IMAGEGEN_REAPER_INTERVAL = env_float("IMAGEGEN_REAPER_INTERVAL", 5.0)
# A job still waiting for its prompt check this long had the check's message lost (a broker
# that restarted empty drops what is sent before the workers declare their queues again): the
# reaper sends it again, at most once per this many seconds per job.
IMAGEGEN_PROMPT_CHECK_RESEND_SECONDS = env_float("IMAGEGEN_PROMPT_CHECK_RESEND_SECONDS", 60.0)
# A cpu worker's prompt check also checks up to this many - 1 other prompts still waiting for
# theirs, with one encoder pass for all (jobs/pipeline/prompt_batch.py; bench/prompt_batch.py
# measured the CPU per prompt at batch 1 and 32). 1: each prompt alone.
IMAGEGEN_PROMPT_BATCH = env_int("IMAGEGEN_PROMPT_BATCH", 16)
# A worker consuming the prompt-check queue loads the prompt filter before its pool forks, so its
# pool processes share one load instead of each loading on its first check (jobs/pipeline/tasks.py).
IMAGEGEN_PRELOAD_PROMPT_FILTER = env_bool("IMAGEGEN_PRELOAD_PROMPT_FILTER", True)
# A batch stage that no worker started this long after it was sent had its message lost: the
# reaper sends it again (not an attempt). The bound grows by twice the stage's measured run time
# for every batch queued ahead of it, so a stage that merely waits behind a backlog is left alone.
IMAGEGEN_STAGE_RESEND_SECONDS = env_float("IMAGEGEN_STAGE_RESEND_SECONDS", 120.0)
# Storage away in a batch stage: Celery retries it, doubling from 1 s up to this many seconds
# apart (with jitter), for at most the stage's retry bound of real time; then its jobs fail.
IMAGEGEN_STAGE_RETRY_MAX_BACKOFF = env_float("IMAGEGEN_STAGE_RETRY_MAX_BACKOFF", 60.0)
IMAGEGEN_CLASSIFY_RETRY_SECONDS = env_float("IMAGEGEN_CLASSIFY_RETRY_SECONDS", 3600.0)
IMAGEGEN_PUBLISH_RETRY_SECONDS = env_float("IMAGEGEN_PUBLISH_RETRY_SECONDS", 3600.0)
IMAGEGEN_PREVIEW_EVERY = env_int("IMAGEGEN_PREVIEW_EVERY", 4)  # steps between previews
IMAGEGEN_PREVIEW_MIN_INTERVAL = env_float("IMAGEGEN_PREVIEW_MIN_INTERVAL", 0.25)  # seconds

# --- request-hash cache and admission control ---
IMAGEGEN_CACHE_ENABLED = env_bool("IMAGEGEN_CACHE_ENABLED", True)
# k-anonymous (default): an entry serves its owner at once and other users once
# IMAGEGEN_CACHE_SHARE_K distinct users asked for it, answered no sooner than a fresh job of its
# shape would finish; user: an entry serves only its owner; global-unseeded: requests without a
# seed are shared; global: all are. A plain shared cache tells anyone whether someone asked for
# the same thing (jobs/media/cache.py, docs/limits.md "Limits and abuse").
IMAGEGEN_CACHE_SCOPE = env_choice("IMAGEGEN_CACHE_SCOPE", "k-anonymous", ("k-anonymous", "user", "global-unseeded", "global"))
IMAGEGEN_CACHE_SHARE_K = env_int("IMAGEGEN_CACHE_SHARE_K", 3)
IMAGEGEN_SEED_POLICY = env_str("IMAGEGEN_SEED_POLICY", "random")  # random | fixed
IMAGEGEN_FIXED_SEED = env_int("IMAGEGEN_FIXED_SEED", 0)
IMAGEGEN_MAX_QUEUE_WAIT = env_float("IMAGEGEN_MAX_QUEUE_WAIT", 120.0)  # seconds; past it: 429 or degrade
IMAGEGEN_DEGRADE_STEPS = env_int("IMAGEGEN_DEGRADE_STEPS", 8)
IMAGEGEN_MAX_QUEUED_IMAGES = env_int("IMAGEGEN_MAX_QUEUED_IMAGES", 2000)
IMAGEGEN_USER_MAX_IN_FLIGHT = env_int("IMAGEGEN_USER_MAX_IN_FLIGHT", 16)
IMAGEGEN_USER_MAX_IMAGES_PER_DAY = env_int("IMAGEGEN_USER_MAX_IMAGES_PER_DAY", 1000)  # GPU images claimed in 24 h
# priority=batch jobs: their own wait limit (they wait behind interactive work) and limits.
IMAGEGEN_BATCH_MAX_QUEUE_WAIT = env_float("IMAGEGEN_BATCH_MAX_QUEUE_WAIT", 6 * 3600.0)
IMAGEGEN_USER_MAX_BATCH_IN_FLIGHT = env_int("IMAGEGEN_USER_MAX_BATCH_IN_FLIGHT", 64)
IMAGEGEN_USER_MAX_BATCH_IMAGES_PER_DAY = env_int("IMAGEGEN_USER_MAX_BATCH_IMAGES_PER_DAY", 5000)
# Every prompt check counts, whatever it decides (blocked prompts cost the cpu queue too).
IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE = env_int("IMAGEGEN_USER_PROMPT_CHECKS_PER_MINUTE", 60)
# Cases one user may have in the moderators' queue (held jobs and undecided appeals).
IMAGEGEN_USER_MAX_IN_REVIEW = env_int("IMAGEGEN_USER_MAX_IN_REVIEW", 5)
IMAGEGEN_USER_MAX_TOKENS = env_int("IMAGEGEN_USER_MAX_TOKENS", 50)  # API tokens one account may hold
# Open websockets and SSE streams per user, together (across web processes, in Redis).
IMAGEGEN_USER_MAX_STREAMS = env_int("IMAGEGEN_USER_MAX_STREAMS", 32)
# Watchers re-read their job's row this often (a final event lost with Redis still arrives),
# and each web process re-joins the job's channel-layer group (a restarted Redis forgot it).
IMAGEGEN_WATCH_REREAD_SECONDS = env_float("IMAGEGEN_WATCH_REREAD_SECONDS", 5.0)
# API request rates (a DRF throttle counted in the shared Redis, jobs/access/throttles.py): per
# signed-in user (all their tokens and sessions), one rate per scope: submits (requests that
# change something), reads (a conditional read answered 304 costs a tenth), streams opened;
# and per client IP for everything; "off" disables one. A client polling two jobs twice a
# second (240/min) stays well inside the read rate.
IMAGEGEN_THROTTLE_SUBMIT = env_rate("IMAGEGEN_THROTTLE_SUBMIT", "120/min")
IMAGEGEN_THROTTLE_READ = env_rate("IMAGEGEN_THROTTLE_READ", "600/min")
IMAGEGEN_THROTTLE_STREAM = env_rate("IMAGEGEN_THROTTLE_STREAM", "60/min")
IMAGEGEN_THROTTLE_IP = env_rate("IMAGEGEN_THROTTLE_IP", "600/min")
# /metrics (and /readyz's details): a bearer token, and/or peer addresses (CIDRs) let in without
# it; the embedded default is open on loopback only. The database gauges are cached per process.
IMAGEGEN_METRICS_TOKEN = env_str("IMAGEGEN_METRICS_TOKEN", "")
IMAGEGEN_METRICS_ALLOW = env_list("IMAGEGEN_METRICS_ALLOW", ["127.0.0.0/8", "::1/128"] if EMBEDDED else [])
for _net in IMAGEGEN_METRICS_ALLOW:
    try:
        ipaddress.ip_network(_net, strict=False)
    except ValueError as _exc:
        raise ImproperlyConfiguredEnv(f"IMAGEGEN_METRICS_ALLOW: {_net!r} is not an address or CIDR") from _exc
IMAGEGEN_METRICS_CACHE_SECONDS = env_float("IMAGEGEN_METRICS_CACHE_SECONDS", 5.0)
# Proxies in front of the web processes that append to X-Forwarded-For (0: use the peer address).
IMAGEGEN_NUM_PROXIES = env_int("IMAGEGEN_NUM_PROXIES", 0)
# Sign-in (jobs/access/signin.py): failures per (account, address) and per address within the
# window, then locked until it slides; past as many failures on an account from anywhere, each
# attempt on it waits a doubling delay of at most IMAGEGEN_SIGNIN_MAX_DELAY seconds.
IMAGEGEN_SIGNIN_MAX_FAILURES = env_int("IMAGEGEN_SIGNIN_MAX_FAILURES", 10)
IMAGEGEN_SIGNIN_WINDOW_SECONDS = env_float("IMAGEGEN_SIGNIN_WINDOW_SECONDS", 900.0)
IMAGEGEN_SIGNIN_MAX_DELAY = env_float("IMAGEGEN_SIGNIN_MAX_DELAY", 30.0)
IMAGEGEN_SIGNIN_KNOWN_DAYS = env_float("IMAGEGEN_SIGNIN_KNOWN_DAYS", 90.0)  # an address that signed in passes the account-wide delay this long
# Used until the first batch of a model is measured: GPU-seconds per image-megapixel-step.
IMAGEGEN_PRIOR_SECONDS_PER_MPX_STEP = env_float("IMAGEGEN_PRIOR_SECONDS_PER_MPX_STEP", 2.0)

# --- safety ---
# "shapes" (the shipped classifier), "hf:<path>" (transformers image classifier),
# "sd-safety:<path>" (diffusers' StableDiffusionSafetyChecker), or "none" (explicit opt-out,
# every verdict then says "unchecked"). Unset or broken: the image gate fails closed.
IMAGEGEN_IMAGE_CLASSIFIER = env_str("IMAGEGEN_IMAGE_CLASSIFIER", f"shapes:{BASE_DIR / 'models' / 'shapes-classifier-v2'}")
# Delivering images no classifier has judged is an explicit choice twice over in production:
# IMAGEGEN_IMAGE_CLASSIFIER=none alone refuses to start unless this is set too.
IMAGEGEN_ALLOW_UNCHECKED_DELIVERY = env_bool("IMAGEGEN_ALLOW_UNCHECKED_DELIVERY", False)
if (not env_bool("IMAGEGEN_EMBEDDED", True) and IMAGEGEN_IMAGE_CLASSIFIER.strip() == "none"
        and not IMAGEGEN_ALLOW_UNCHECKED_DELIVERY):
    from django.core.exceptions import ImproperlyConfigured
    raise ImproperlyConfigured(
        "IMAGEGEN_IMAGE_CLASSIFIER=none would deliver images no classifier has judged; in production "
        "(IMAGEGEN_EMBEDDED=false) also set IMAGEGEN_ALLOW_UNCHECKED_DELIVERY=true to accept that"
    )
IMAGEGEN_CLASSIFIER_TIMEOUT = env_float("IMAGEGEN_CLASSIFIER_TIMEOUT", 30.0)
IMAGEGEN_SAFETY_POLICY = env_str("IMAGEGEN_SAFETY_POLICY", str(BASE_DIR / "safety" / "policy.json"))

# --- Celery: one routing table, every queue named once ---
QUEUE_CPU = env_str("IMAGEGEN_QUEUE_CPU", "cpu")
QUEUE_IO = env_str("IMAGEGEN_QUEUE_IO", "io")
QUEUE_GPU_PREFIX = env_str("IMAGEGEN_QUEUE_GPU_PREFIX", "gpu.")
# The image gate does not depend on the model: one classify queue serves every lane (its
# workers are pinned to a GPU in production, or run on a cheap fleet).
QUEUE_CLASSIFY = env_str("IMAGEGEN_QUEUE_CLASSIFY", "classify")
# Webhook deliveries wait on other people's servers: a queue and a pool of their own, so a slow
# receiver never delays a prompt check or a publish.
QUEUE_WEBHOOKS = env_str("IMAGEGEN_QUEUE_WEBHOOKS", "webhooks")
# The prompt rewriter's stage: GPU-pinned in production (the gpu process type consumes it too).
QUEUE_REWRITE = env_str("IMAGEGEN_QUEUE_REWRITE", "rewrite")
QUEUE_GPU = QUEUE_GPU_PREFIX + IMAGEGEN_MODEL_NAME

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
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
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 900)
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 840)
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
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": env_str("IMAGEGEN_LOG_FORMAT", "json")}},
    "root": {"handlers": ["console"], "level": env_str("IMAGEGEN_LOG_LEVEL", "INFO")},
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
    "ENUM_NAME_OVERRIDES": {"JobStatusEnum": "jobs.models.JobStatus", "OutputFormatEnum": "jobs.models.OutputFormat"},
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "jobs.api.schema.document_plain_views"],
}

# --- OpenAI-compatible API: how long POST /v1/images/generations waits for its job ---
IMAGEGEN_OPENAI_WAIT_SECONDS = env_float("IMAGEGEN_OPENAI_WAIT_SECONDS", 120.0)

# --- integration: idempotent submits, signed webhooks (jobs/api/idempotency.py, jobs/webhooks/delivery.py) ---
IMAGEGEN_IDEMPOTENCY_HOURS = env_float("IMAGEGEN_IDEMPOTENCY_HOURS", 24.0)  # a key answers with its job this long
# a key reserved this long without a job was left by a process that died mid-submit: taken over
IMAGEGEN_IDEMPOTENCY_TAKEOVER_SECONDS = env_float("IMAGEGEN_IDEMPOTENCY_TAKEOVER_SECONDS", 30.0)
# `Prefer: wait=N` on a submit waits at most this long for the job to end (jobs/api/prefer.py): the
# wait holds a web thread, so it suits few-step models whose jobs end in about a second.
IMAGEGEN_PREFER_WAIT_MAX = env_float("IMAGEGEN_PREFER_WAIT_MAX", 10.0)
IMAGEGEN_PREFER_WAIT_PER_USER = env_int("IMAGEGEN_PREFER_WAIT_PER_USER", 2)  # held waits per user and web process
IMAGEGEN_WEBHOOK_TIMEOUT = env_float("IMAGEGEN_WEBHOOK_TIMEOUT", 10.0)  # seconds one attempt may take
# seconds a webhook_url's host may take to resolve (on a pool of its own, not the request thread)
IMAGEGEN_WEBHOOK_RESOLVE_TIMEOUT = env_float("IMAGEGEN_WEBHOOK_RESOLVE_TIMEOUT", 2.0)
IMAGEGEN_WEBHOOK_LOOKUPS_PER_USER = env_int("IMAGEGEN_WEBHOOK_LOOKUPS_PER_USER", 2)  # webhook host lookups not yet answered, per user and web process
IMAGEGEN_WEBHOOK_LEASE_SLACK = env_float("IMAGEGEN_WEBHOOK_LEASE_SLACK", 20.0)  # past the timeout: a killed attempt is re-sent
IMAGEGEN_WEBHOOK_BACKOFF = env_float("IMAGEGEN_WEBHOOK_BACKOFF", 10.0)  # seconds before the first retry; doubles, at most 1 h
IMAGEGEN_WEBHOOK_RETRY_HOURS = env_float("IMAGEGEN_WEBHOOK_RETRY_HOURS", 24.0)  # then a delivery is given up
IMAGEGEN_MAX_CANCEL_AFTER = env_int("IMAGEGEN_MAX_CANCEL_AFTER", 7 * 86400)  # the largest cancel_after, seconds
# A client that hangs up before its job finishes never gets the images: cancel the job.
IMAGEGEN_OPENAI_CANCEL_ON_DISCONNECT = env_bool("IMAGEGEN_OPENAI_CANCEL_ON_DISCONNECT", True)

# --- object storage on S3, retention tiers, regeneration (issue 7; docs/storage.md) ---
# Unset IMAGEGEN_S3_BUCKET keeps the embedded default: local folders under VAR_DIR.
IMAGEGEN_S3_BUCKET = env_str("IMAGEGEN_S3_BUCKET", "")
IMAGEGEN_S3_ENDPOINT_URL = env_str("IMAGEGEN_S3_ENDPOINT_URL", "")  # empty: AWS itself
IMAGEGEN_S3_REGION = env_str("IMAGEGEN_S3_REGION", "us-east-1")
IMAGEGEN_S3_ACCESS_KEY_ID = env_str("IMAGEGEN_S3_ACCESS_KEY_ID", "")  # empty: boto3's own chain (role, env, profile)
IMAGEGEN_S3_SECRET_ACCESS_KEY = env_str("IMAGEGEN_S3_SECRET_ACCESS_KEY", "")
IMAGEGEN_S3_CUSTOM_DOMAIN = env_str("IMAGEGEN_S3_CUSTOM_DOMAIN", "")  # the CDN's host (and path), e.g. img.example.com
IMAGEGEN_S3_URL_PROTOCOL = env_str("IMAGEGEN_S3_URL_PROTOCOL", "https:")  # for custom-domain URLs
# A CDN in front of the bucket caches public objects for a year (immutable): a take-down must
# purge it, so the log-only hook with a CDN domain is a configuration that cannot take down.
if IMAGEGEN_S3_CUSTOM_DOMAIN and IMAGEGEN_CDN_PURGE_HOOK.strip() == "jobs.media.cdn:log_purge":
    from django.core.exceptions import ImproperlyConfigured
    raise ImproperlyConfigured(
        "IMAGEGEN_S3_CUSTOM_DOMAIN puts a CDN in front of the public images, but IMAGEGEN_CDN_PURGE_HOOK is the "
        "log-only jobs.media.cdn:log_purge, so a take-down would stay cached at the edge for a year: set "
        "IMAGEGEN_CDN_PURGE_HOOK to jobs.media.cdn:http_purge, jobs.media.cdn:cloudfront_invalidate or your own hook"
    )
IMAGEGEN_S3_ADDRESSING_STYLE = env_str("IMAGEGEN_S3_ADDRESSING_STYLE", "auto")  # auto | path | virtual
# "public-read" puts an ACL on each public object; empty relies on a bucket policy that makes
# the public prefix (i/) readable (buckets with ACLs disabled refuse ACL headers).
IMAGEGEN_S3_PUBLIC_ACL = env_str("IMAGEGEN_S3_PUBLIC_ACL", "")
# Held and blocked images: a separate private bucket (recommended), or a prefix of the public
# bucket that the bucket policy does not expose.
IMAGEGEN_S3_QUARANTINE_BUCKET = env_str("IMAGEGEN_S3_QUARANTINE_BUCKET", "")
IMAGEGEN_S3_QUARANTINE_PREFIX = env_str("IMAGEGEN_S3_QUARANTINE_PREFIX", "" if IMAGEGEN_S3_QUARANTINE_BUCKET else "quarantine/")
# A prefix of the public bucket is private only while nothing that can read the bucket serves it
# (a CDN with read access to the bucket, a policy widened later): production keeps held and
# taken-down images in a bucket of their own, and refuses to start without one.
if IMAGEGEN_S3_BUCKET and not IMAGEGEN_S3_QUARANTINE_BUCKET and not EMBEDDED:
    from django.core.exceptions import ImproperlyConfigured
    raise ImproperlyConfigured(
        "IMAGEGEN_S3_BUCKET is set without IMAGEGEN_S3_QUARANTINE_BUCKET: held and taken-down images would go to "
        f"{IMAGEGEN_S3_QUARANTINE_PREFIX!r} inside the public bucket, where anything that can read the bucket (a CDN) "
        "can serve them; in production (IMAGEGEN_EMBEDDED=false) set IMAGEGEN_S3_QUARANTINE_BUCKET to a private bucket"
    )
IMAGEGEN_S3_PRESIGN_SECONDS = env_int("IMAGEGEN_S3_PRESIGN_SECONDS", 300)  # staff links to private objects
IMAGEGEN_S3_COLD_STORAGE_CLASS = env_str("IMAGEGEN_S3_COLD_STORAGE_CLASS", "STANDARD_IA")  # or GLACIER_IR, ...
# Tries per S3 request on transient errors, in all (botocore's adaptive retry mode: exponential
# backoff with jitter, and slower sending while the store throttles). The project adds no loop of
# its own: past them a Celery stage retries through its row, and a GPU hand-off puts the job back.
IMAGEGEN_UPLOAD_ATTEMPTS = env_int("IMAGEGEN_UPLOAD_ATTEMPTS", 4)
# The GPU worker's hand-off: images are encoded and written to quarantine off the denoising
# thread, by this many encoder threads, with at most HANDOFF_DEPTH denoised batches waiting
# (the denoising thread waits beyond that, so memory stays flat when storage is slow).
IMAGEGEN_ENCODE_THREADS = env_int("IMAGEGEN_ENCODE_THREADS", 2)
IMAGEGEN_HANDOFF_DEPTH = env_int("IMAGEGEN_HANDOFF_DEPTH", 2)
IMAGEGEN_PNG_COMPRESS_LEVEL = env_int("IMAGEGEN_PNG_COMPRESS_LEVEL", 3)  # zlib 0-9: 3 is half the time of 6 for ~3% more bytes
# Content credentials (C2PA) in every image file (jobs/media/credentials.py), signed with this PEM key
# and certificate chain; the embedded default makes its own in VAR_DIR/c2pa on first start
# (imagegen/signing_credentials.py). Expired or mismatched ones refuse to start; missing ones refuse to
# start the processes that sign (the web, the GPU workers) and no other.
IMAGEGEN_C2PA_KEY = env_str("IMAGEGEN_C2PA_KEY", "")
IMAGEGEN_C2PA_CERT = env_str("IMAGEGEN_C2PA_CERT", "")
# What `imagegen_cli.py verify` trusts besides the embedded root: a PEM file of root certificates.
IMAGEGEN_C2PA_TRUST_ANCHORS = env_str("IMAGEGEN_C2PA_TRUST_ANCHORS", "")
IMAGEGEN_C2PA_TSA_URL = env_str("IMAGEGEN_C2PA_TSA_URL", "")  # an RFC 3161 time-stamp authority, if any
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

# Retention: images older than HOT_DAYS with fewer than COLD_MAX_VIEWS views go to the cold
# tier; with DROP_COLD_BYTES, cold ones older than DROP_AFTER_DAYS lose their bytes (the row and
# its verdicts stay; the image is regenerated on demand while its model version is served).
IMAGEGEN_HOT_DAYS = env_float("IMAGEGEN_HOT_DAYS", 30.0)
IMAGEGEN_COLD_MAX_VIEWS = env_int("IMAGEGEN_COLD_MAX_VIEWS", 10)
IMAGEGEN_DROP_COLD_BYTES = env_bool("IMAGEGEN_DROP_COLD_BYTES", False)
IMAGEGEN_DROP_AFTER_DAYS = env_float("IMAGEGEN_DROP_AFTER_DAYS", 90.0)
# A job its owner deleted keeps its safety record (verdicts, quarantined images, an undecided
# appeal) this many days, then retention purges it.
IMAGEGEN_SAFETY_RECORD_DAYS = env_float("IMAGEGEN_SAFETY_RECORD_DAYS", 90.0)
IMAGEGEN_RETENTION_INTERVAL = env_float("IMAGEGEN_RETENTION_INTERVAL", 3600.0)  # seconds between runs
IMAGEGEN_RETENTION_BATCH = env_int("IMAGEGEN_RETENTION_BATCH", 500)  # objects per run and tier step
CELERY_IMPORTS = [*globals().get("CELERY_IMPORTS", []), "jobs.pipeline.tasks", "jobs.api.idempotency", "jobs.pipeline.retention", "jobs.media.cdn", "imagegen.dashboard",
                  "jobs.admission.summary"]  # its refresher thread starts on the cpu workers
CELERY_BEAT_SCHEDULE["retention"] = {"task": "jobs.pipeline.retention.run_retention", "schedule": IMAGEGEN_RETENTION_INTERVAL}
# Take-downs: the outbox of public deletes is retried every IMAGEGEN_UNPUBLISH_INTERVAL seconds;
# every IMAGEGEN_UNPUBLISH_RECONCILE_INTERVAL the public images are listed and any whose rows
# are not public (older than the grace, which covers a publish in flight) is taken down.
IMAGEGEN_UNPUBLISH_INTERVAL = env_float("IMAGEGEN_UNPUBLISH_INTERVAL", 30.0)
IMAGEGEN_UNPUBLISH_RETRY_BACKOFF = env_float("IMAGEGEN_UNPUBLISH_RETRY_BACKOFF", 10.0)  # first wait after a failure, doubling
IMAGEGEN_UNPUBLISH_RECONCILE_INTERVAL = env_float("IMAGEGEN_UNPUBLISH_RECONCILE_INTERVAL", 3600.0)
IMAGEGEN_UNPUBLISH_RECONCILE_GRACE_SECONDS = env_float("IMAGEGEN_UNPUBLISH_RECONCILE_GRACE_SECONDS", 3600.0)
CELERY_BEAT_SCHEDULE["unpublish"] = {"task": "jobs.pipeline.retention.run_unpublish", "schedule": IMAGEGEN_UNPUBLISH_INTERVAL}
