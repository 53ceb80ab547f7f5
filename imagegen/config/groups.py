"""Every setting read from the environment, grouped by concern: type, default, one line of help.

The groups are read in this order; a derived default (Derived) sees the settings read before it.
docs/configuration.md's reference is generated from these declarations (`python -m imagegen.config
--markdown`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, ClassVar

import dj_database_url
from pydantic import model_validator

from imagegen import env
from imagegen.config.fields import (
    BASE_DIR,
    Derived,
    Group,
    Reader,
    choice,
    setting,
)
from imagegen.env import ImproperlyConfiguredEnv


def _secret_key(c: SimpleNamespace) -> str:
    if not c.embedded:
        raise ImproperlyConfiguredEnv("DJANGO_SECRET_KEY must be set")
    return ""  # settings.py then uses the installation's generated key (imagegen/secret_key.py)


def _proxy_header(name: str, value: str) -> tuple[str, str] | None:
    items = env.read_list(name, value)
    return (items[0], items[1]) if len(items) == 2 else None


class Installation(Group):
    """Where the installation keeps its files, and whether it is the embedded default or production."""

    var_dir: Path = setting(Derived("`var/` in the checkout", lambda c: BASE_DIR / "var"),
                            "the folder for the SQLite database, local storage, generated keys and logs", django="VAR_DIR")
    embedded: bool = setting(True, "the embedded default (loopback, generated keys); production sets false and its own secrets",
                             django="EMBEDDED")
    debug: bool = setting(False, "Django's DEBUG", env="DJANGO_DEBUG", django="DEBUG")
    secret_key: str = setting(Derived("embedded: generated once in `var/secret_key`; production: none (must be set)", _secret_key),
                              "Django's SECRET_KEY", env="DJANGO_SECRET_KEY", django=None)
    allowed_hosts: list[str] = setting(["127.0.0.1", "localhost", "testserver", "[::1]"], "Django's ALLOWED_HOSTS",
                                       env="DJANGO_ALLOWED_HOSTS", django="ALLOWED_HOSTS")
    csrf_trusted_origins: list[str] = setting([], "Django's CSRF_TRUSTED_ORIGINS", env="DJANGO_CSRF_TRUSTED_ORIGINS",
                                              django="CSRF_TRUSTED_ORIGINS")


class Https(Group):
    """HTTPS in production: `manage.py check --deploy` passes with IMAGEGEN_EMBEDDED=false, a secret key and the
    allowed hosts. `/healthz`, `/readyz` and `/metrics` are exempt from the redirect (probes come over plain HTTP)."""

    prefix: ClassVar[str] = "DJANGO_"
    secure_ssl_redirect: bool = setting(Derived("false when embedded, else true", lambda c: not c.embedded),
                                        "redirect plain HTTP to HTTPS", django="SECURE_SSL_REDIRECT")
    secure_hsts_seconds: int = setting(Derived("0 when embedded, else 31536000", lambda c: 0 if c.embedded else 31536000),
                                       "Strict-Transport-Security max-age", django="SECURE_HSTS_SECONDS")
    secure_hsts_include_subdomains: bool = setting(Derived("false when embedded, else true", lambda c: not c.embedded),
                                                   "HSTS for every subdomain too", django="SECURE_HSTS_INCLUDE_SUBDOMAINS")
    secure_hsts_preload: bool = setting(Derived("false when embedded, else true", lambda c: not c.embedded),
                                        "HSTS preload; set false if you do not control every subdomain (`check --deploy` "
                                        "then warns W021)", django="SECURE_HSTS_PRELOAD")
    secure_cookies: bool = setting(Derived("false when embedded, else true", lambda c: not c.embedded),
                                   "session and CSRF cookies only over HTTPS (SESSION_COOKIE_SECURE, CSRF_COOKIE_SECURE)",
                                   django=None)
    secure_proxy_ssl_header: Annotated[tuple[str, str] | None, Reader(_proxy_header, "`HEADER,value`")] = setting(
        None, "behind a TLS-terminating proxy that sets it (and strips it from clients), e.g. `HTTP_X_FORWARDED_PROTO,https`; "
        "without it the redirect loops there", django="SECURE_PROXY_SSL_HEADER")


def _sqlite(url: str) -> bool:
    return str(dj_database_url.parse(url)["ENGINE"]).endswith("sqlite3")


class Services(Group):
    """The database, Redis and the broker."""

    prefix: ClassVar[str] = ""
    database_url: str = setting(Derived("SQLite file `var/db.sqlite3`", lambda c: f"sqlite:///{c.var_dir / 'db.sqlite3'}"),
                                "the database: PostgreSQL (`postgres://...`) in production and CI", django=None)
    db_conn_max_age: int = setting(Derived("60 (PostgreSQL), 0 (SQLite)", lambda c: 0 if _sqlite(c.database_url) else 60),
                                   "seconds a connection is kept: one per web thread, health-checked before reuse",
                                   env="IMAGEGEN_DB_CONN_MAX_AGE", django=None)
    db_connect_timeout: int = setting(5, "seconds a PostgreSQL connection attempt may take (a hung one must not hold a "
                                      "web thread)", env="IMAGEGEN_DB_CONNECT_TIMEOUT", django=None)
    redis_url: str = setting("redis://127.0.0.1:6379/0", "Redis: broker, channel layer, scheduler state, metrics (the run "
                             "command starts a private one)")
    celery_broker_url: str = setting(Derived("`REDIS_URL`", lambda c: c.redis_url),
                                     "the Celery broker, e.g. `amqp://guest:guest@host:5672//` for RabbitMQ")
    celery_task_time_limit: int = setting(900, "seconds a task may run before it is killed")
    celery_task_soft_time_limit: int = setting(840, "seconds before a task is asked to stop (SoftTimeLimitExceeded)")


class Web(Group):
    """The web tier (imagegen/asgi.py, scripts/run.py; docs/operations.md, "Running the API tier")."""

    web_processes: int = setting(0, "processes serving HTTP and websockets on one port (0: one per CPU core, at most 8)")
    web_threads: int = setting(8, "threads per web process for the sync views (REST, page, admin)")
    web_backlog: int = setting(64, "requests that may wait for a thread beyond those running; past it 429 + Retry-After (busy)")
    web_queue_timeout: float = setting(2.0, "seconds a request may wait for a thread; then 429 + Retry-After (busy)")
    redis_pool_size: int = setting(Derived("`IMAGEGEN_WEB_THREADS` + 8", lambda c: c.web_threads + 8),
                                   "Redis connections per process (a blocking pool)")
    redis_pool_timeout: float = setting(2.0, "seconds a thread waits for a Redis connection; then 429 + Retry-After, never "
                                        "\"Too many connections\"")
    summary_max_age: float = setting(30.0, "the most seconds an entry of the wait-estimate summary may age; it is recomputed "
                                     "sooner, at 20x its own compute time (jobs/admission/summary.py)")
    server_timing: bool = setting(False, "a Server-Timing header on every answer (wall, CPU, database, Redis, thread wait) and "
                                  "each prompt check's own account in Redis (imagegen/timing.py; for bench/api_load.py "
                                  "--breakdown; off in production)")
    log_format: Annotated[str, Reader(env.read_str, "`json` or `plain`")] = setting(
        "json", "`json`: one object a line with job_id, batch_id, stage; `plain` for reading", django=None)
    log_level: str = setting("INFO", "the root logger's level", django=None)


_SHIPPED_V1 = BASE_DIR / "models" / "shapes-v1"
_SHIPPED_V2 = BASE_DIR / "models" / "shapes-v2"
_SHIPPED_STUDENTS = [BASE_DIR / "models" / "shapes-v2-lcm", BASE_DIR / "models" / "shapes-v1-lcm"]
_SHIPPED_REWRITER = BASE_DIR / "models" / "rewriter-v2"
# The video model: shapes-v2's motion module (a MotionAdapter folder, no model_index.json), served
# beside shapes-v2 when both are on disk (docs/video.md).
_SHIPPED_VIDEO = BASE_DIR / "models" / "shapes-v2-motion"


def _shipped() -> list[Path]:
    images = [m for m in (_SHIPPED_V2, _SHIPPED_V1, *_SHIPPED_STUDENTS) if (m / "model_index.json").exists()]
    video = [_SHIPPED_VIDEO] if _SHIPPED_V2 in images and (_SHIPPED_VIDEO / "config.json").exists() else []
    return images + video


def _default_model(c: SimpleNamespace) -> Path:
    shipped = _shipped()
    return next((m for m in (_SHIPPED_V2, _SHIPPED_V1) if m in shipped), None) or c.var_dir / "models" / "tiny-random"


def _extra_models(c: SimpleNamespace) -> dict[str, str]:
    shipped = _shipped()
    return {m.name: str(m) for m in shipped if m != c.model_path} if c.model_path in shipped else {}


def _read_extra_models(name: str, value: str) -> dict[str, str]:
    return {version: str(Path(path) if Path(path).is_absolute() else BASE_DIR / path)
            for version, path in env.read_models(name, value).items()}


def _quality_models(c: SimpleNamespace) -> dict[str, str]:
    student = next((m.name for m in _SHIPPED_STUDENTS if m.name in c.extra_models), None)
    return {"low": student} if student else {}


def _rewriter(c: SimpleNamespace) -> str:
    serving_shipped = c.model_path in _shipped()
    return str(_SHIPPED_REWRITER) if serving_shipped and (_SHIPPED_REWRITER / "config.json").exists() else ""


def _on_off(name: str, value: str) -> str:
    if value not in ("on", "off"):
        raise ImproperlyConfiguredEnv(f"{name} must be on or off, not {value!r}")
    return value


class Models(Group):
    """The served models and the prompt rewriter (docs/model.md, docs/rewriter.md). The shipped shapes-v2 is the
    default; shapes-v1 stays served so its old jobs keep regenerating (a version no longer served answers 410);
    `IMAGEGEN_MODEL_PATH=models/shapes-v1` rolls back."""

    model_path: Path = setting(Derived("`models/shapes-v2` (`models/shapes-v1` where v2 is missing; else "
                                       "`var/models/tiny-random`)", _default_model),
                               "the served diffusers checkpoint on disk")
    model_name: str = setting("shapes", "the model's name: its GPU queue is `gpu.<name>`")
    model_version: str = setting(Derived("the model folder's name", lambda c: c.model_path.name),
                                 "the version recorded on every job")
    extra_models: Annotated[dict[str, str], Reader(_read_extra_models, "`VERSION=PATH,...` or `none`")] = setting(
        Derived("every other shipped model on disk when a shipped model is the default; none otherwise", _extra_models),
        "more versions a job may name (`model` field), each on its lane `gpu.<name>@<version>` with its `serving.json` "
        "profile; relative paths are under the checkout")
    quality_models: Annotated[dict[str, str], Reader(env.read_models, "`TIER=VERSION,...` or `none`")] = setting(
        Derived("`low=` the shipped student when it is served (`shapes-v2-lcm`, else `shapes-v1-lcm`)", _quality_models),
        "OpenAI `quality` tiers that run on another served model when the request names none (versions not served are "
        "dropped)")
    canary_version: str = setting("", "canary rollout: another version of the model that a share of new jobs goes to "
                                  "(workers on `gpu.<name>@<version>`; `manage.py rollout` promotes or rolls back)")
    canary_share: float = setting(0.0, "the share of new jobs the canary version gets (0 to 1)")
    rewriter_path: str = setting(Derived("`models/rewriter-v2` when the shipped model is served, else none", _rewriter),
                                 "the prompt rewriter (any causal or seq2seq model transformers loads from disk)")
    rewrite_default: Annotated[str, Reader(_on_off, "`on` or `off`")] = setting(
        Derived("`on` where a rewriter is configured, else `off`", lambda c: "on" if c.rewriter_path else "off"),
        "what a request's `rewrite: auto` (and every OpenAI-route request) means")
    rewrite_batch: int = setting(16, "prompts one forward pass of the rewriter takes at most (the waiting ones of every user)")
    prior_rewrite_seconds: float = setting(0.03, "seconds one rewriter pass is assumed to take before one is measured "
                                           "(the shipped one: ~11 ms at batch 1, ~28 ms at 16 on one CPU thread)")

    @model_validator(mode="after")
    def _served_quality_models(self) -> Models:
        served = {*self.extra_models, self.model_version}
        self.quality_models = {tier: v for tier, v in self.quality_models.items() if v in served}
        return self


class Levers(Group):
    """Runtime levers for the per-step cost (bench/runtime_levers.py measures each on and off). Each is checked
    against the model's family at load (gpu_tasks/families.py): one it cannot honour stops the worker (exit 3),
    named in its log and in /readyz (docs/families.md)."""

    model_family: str = setting("", "the family expected at the model path: `sd15`, `sdxl`, `sd3`, `flux`, `pixart` "
                                "(empty: any)")
    dtype: str = setting("float32", "`float32`, `bfloat16` or `float16` (GPU)")
    attention: str = setting("sdpa", "`sdpa` or `classic`")
    channels_last: bool = setting(False, "channels-last memory format")
    compile: bool = setting(False, "torch.compile the denoiser")
    compile_mode: str = setting("default", "torch.compile's mode: `default`, `max-autotune`, `reduce-overhead`")
    warm_up: bool = setting(Derived("`IMAGEGEN_COMPILE`", lambda c: c.compile),
                            "run each menu shape once at worker start (needed with torch.compile; cheap without)")
    cfg_cutoff: float = setting(0.0, "stop classifier-free guidance after this fraction of the steps (0: off; sd15, sdxl, sd3)")
    step_cache: str = setting("off", "`off` or `first-block` (diffusers' first-block cache; flux)")
    step_cache_threshold: float = setting(0.05, "the first-block cache's threshold")
    true_cfg_scale: float = setting(1.0, "flux: > 1 honours negative prompts by true CFG (a second pass per step); 1: a flux "
                                    "job with a negative prompt is a 400 naming `negative_prompt`")
    text_cache_size: int = setting(0, "text-encoder outputs kept per (model version, prompt, negative prompt); 0: off")
    preview_source: Annotated[str, choice("x0", "latents")] = setting(
        "x0", "previews decode the scheduler's clean-image estimate (`x0`) or the noisy latents (`latents`)")
    preview_decoder: bool = setting(True, "previews through the tiny decoder a model ships (`preview_decoder.safetensors`); "
                                    "off, or a model without one: the linear latent-to-RGB map")


class Worker(Group):
    """The GPU worker: its device, the simulated accelerator, previews and the hand-off of finished images."""

    device: str = setting("cpu", "`cuda:N` pins a worker to a GPU")
    torch_threads: int = setting(1, "torch threads per worker process on CPU (0: torch's default; one thread measured 60x "
                                 "faster than the default with two processes on two cores)")
    accelerator: str = setting("real", "`real` runs the diffusers pipeline; `simulated` sleeps by a cost model "
                               "(gpu_tasks/simulated.py)")
    sim_step_ms: float = setting(40.0, "the simulated accelerator's milliseconds per step")
    sim_batch_marginal: float = setting(0.15, "the simulated accelerator's added cost per extra image in a batch")
    prior_seconds_per_mpx_step: float = setting(2.0, "GPU-seconds per image-megapixel-step assumed until the first batch of "
                                                "a model is measured")
    preview_every: int = setting(4, "steps between previews")
    preview_min_interval: float = setting(0.25, "seconds between previews at least")
    encode_threads: int = setting(2, "threads that encode images and write them to quarantine off the denoising thread")
    encode_processes: int = setting(0, "processes of their own that encode, sign and write images to quarantine (0: the "
                                    "encode threads of the GPU worker; the Kubernetes manifest sets 2 on GPU pods)")
    handoff_depth: int = setting(2, "denoised batches that may wait for the encoders (then the denoising thread waits)")
    png_compress_level: int = setting(3, "zlib level 0-9: 3 is half the time of 6 for ~3% more bytes")
