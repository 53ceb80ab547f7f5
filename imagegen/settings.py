"""Settings for imagegen. Every knob is read from the environment; see the README's table."""

from __future__ import annotations

from pathlib import Path

import dj_database_url

from imagegen.env import env_bool, env_float, env_int, env_caps, env_list, env_sizes, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("IMAGEGEN_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DJANGO_DEBUG", False)
# The embedded default runs on loopback with a generated key; production must set its own.
SECRET_KEY = env_str("DJANGO_SECRET_KEY", "insecure-embedded-default-key" if env_bool("IMAGEGEN_EMBEDDED", True) else None)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "channels",
    "jobs",
    "safety",
    "gpu_tasks",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

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
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # Tests share the database with worker processes, so the test database is a file too.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-db.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS: list[dict] = []
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

# --- object storage ---
MEDIA_ROOT = Path(env_str("IMAGEGEN_MEDIA_ROOT", str(VAR_DIR / "media")))
MEDIA_URL = env_str("IMAGEGEN_MEDIA_URL", "/media/")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
IMAGE_CACHE_CONTROL = "public, max-age=31536000, immutable"
IMAGEGEN_CDN_PURGE_HOOK = env_str("IMAGEGEN_CDN_PURGE_HOOK", "jobs.cdn:log_purge")

# --- the served model ---
_shipped_model = BASE_DIR / "models" / "shapes-v1"
_default_model = _shipped_model if (_shipped_model / "model_index.json").exists() else VAR_DIR / "models" / "tiny-random"
IMAGEGEN_MODEL_PATH = Path(env_str("IMAGEGEN_MODEL_PATH", str(_default_model)))
# The model's name picks its GPU queue (gpu.<name>); the version is recorded on every job.
IMAGEGEN_MODEL_NAME = env_str("IMAGEGEN_MODEL_NAME", "shapes")
IMAGEGEN_MODEL_VERSION = env_str("IMAGEGEN_MODEL_VERSION", IMAGEGEN_MODEL_PATH.name)
IMAGEGEN_DEVICE = env_str("IMAGEGEN_DEVICE", "cpu")
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
IMAGEGEN_MAX_PROMPT_CHARS = 2000

# --- batch scheduler ---
IMAGEGEN_BATCH_CAP = env_int("IMAGEGEN_BATCH_CAP", 8)  # images per pass, any shape
# Per-shape caps as "WxH:cap,..."; a measured table from `manage.py measure_batch_caps`.
IMAGEGEN_BATCH_CAPS = env_caps("IMAGEGEN_BATCH_CAPS")
IMAGEGEN_FILL_WAIT = env_float("IMAGEGEN_FILL_WAIT", 0.3)  # seconds a partial batch waits for more
IMAGEGEN_STARVATION_SECONDS = env_float("IMAGEGEN_STARVATION_SECONDS", 10.0)
IMAGEGEN_LEASE_SECONDS = env_float("IMAGEGEN_LEASE_SECONDS", 30.0)  # renewed while a batch runs
IMAGEGEN_MAX_ATTEMPTS = env_int("IMAGEGEN_MAX_ATTEMPTS", 3)
IMAGEGEN_REAPER_INTERVAL = env_float("IMAGEGEN_REAPER_INTERVAL", 5.0)
IMAGEGEN_PREVIEW_EVERY = env_int("IMAGEGEN_PREVIEW_EVERY", 4)  # steps between previews
IMAGEGEN_PREVIEW_MIN_INTERVAL = env_float("IMAGEGEN_PREVIEW_MIN_INTERVAL", 0.25)  # seconds

# --- request-hash cache and admission control ---
IMAGEGEN_CACHE_ENABLED = env_bool("IMAGEGEN_CACHE_ENABLED", True)
IMAGEGEN_CACHE_SCOPE = env_str("IMAGEGEN_CACHE_SCOPE", "global")  # global | user
IMAGEGEN_SEED_POLICY = env_str("IMAGEGEN_SEED_POLICY", "random")  # random | fixed
IMAGEGEN_FIXED_SEED = env_int("IMAGEGEN_FIXED_SEED", 0)
IMAGEGEN_MAX_QUEUE_WAIT = env_float("IMAGEGEN_MAX_QUEUE_WAIT", 120.0)  # seconds; past it: 429 or degrade
IMAGEGEN_DEGRADE_STEPS = env_int("IMAGEGEN_DEGRADE_STEPS", 8)
IMAGEGEN_MAX_QUEUED_IMAGES = env_int("IMAGEGEN_MAX_QUEUED_IMAGES", 2000)
IMAGEGEN_USER_MAX_IN_FLIGHT = env_int("IMAGEGEN_USER_MAX_IN_FLIGHT", 16)
IMAGEGEN_USER_MAX_IMAGES_PER_DAY = env_int("IMAGEGEN_USER_MAX_IMAGES_PER_DAY", 1000)
# Used until the first batch of a model is measured: GPU-seconds per image-megapixel-step.
IMAGEGEN_PRIOR_SECONDS_PER_MPX_STEP = env_float("IMAGEGEN_PRIOR_SECONDS_PER_MPX_STEP", 2.0)

# --- safety ---
# "shapes" (the shipped classifier), "hf:<path>" (transformers image classifier),
# "sd-safety:<path>" (diffusers' StableDiffusionSafetyChecker), or "none" (explicit opt-out,
# every verdict then says "unchecked"). Unset or broken: the image gate fails closed.
IMAGEGEN_IMAGE_CLASSIFIER = env_str("IMAGEGEN_IMAGE_CLASSIFIER", f"shapes:{BASE_DIR / 'models' / 'shapes-classifier-v1'}")
IMAGEGEN_CLASSIFIER_TIMEOUT = env_float("IMAGEGEN_CLASSIFIER_TIMEOUT", 30.0)
IMAGEGEN_SAFETY_POLICY = env_str("IMAGEGEN_SAFETY_POLICY", str(BASE_DIR / "safety" / "policy.json"))

# --- Celery: one routing table, every queue named once ---
QUEUE_CPU = env_str("IMAGEGEN_QUEUE_CPU", "cpu")
QUEUE_IO = env_str("IMAGEGEN_QUEUE_IO", "io")
QUEUE_GPU_PREFIX = env_str("IMAGEGEN_QUEUE_GPU_PREFIX", "gpu.")
QUEUE_GPU = QUEUE_GPU_PREFIX + IMAGEGEN_MODEL_NAME

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_DEFAULT_QUEUE = QUEUE_CPU
CELERY_TASK_ROUTES = {
    "safety.tasks.check_prompt": {"queue": QUEUE_CPU},
    "jobs.tasks.reap": {"queue": QUEUE_CPU},
    "gpu_tasks.tasks.run_batch": {"queue": QUEUE_GPU},
}
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 900)
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 840)
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    "reap": {"task": "jobs.tasks.reap", "schedule": IMAGEGEN_REAPER_INTERVAL},
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "capacity": 1000, "expiry": 120},
    }
}

REST_FRAMEWORK = {
    # Token first, so a request without credentials gets 401 with WWW-Authenticate.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "jobs.api_errors.exception_handler",
    "PAGE_SIZE": 20,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("IMAGEGEN_LOG_LEVEL", "INFO")},
    "loggers": {"django.request": {"level": "ERROR"}},
}

# --- API schema and docs (drf-spectacular; Swagger UI served locally by the sidecar) ---
INSTALLED_APPS += ["drf_spectacular", "drf_spectacular_sidecar"]
REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"] = "jobs.schema.ImagegenAutoSchema"
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
    "ENUM_NAME_OVERRIDES": {"JobStatusEnum": "jobs.models.JobStatus"},
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "jobs.schema.document_plain_views"],
}

# --- OpenAI-compatible API: how long POST /v1/images/generations waits for its job ---
IMAGEGEN_OPENAI_WAIT_SECONDS = env_float("IMAGEGEN_OPENAI_WAIT_SECONDS", 120.0)
