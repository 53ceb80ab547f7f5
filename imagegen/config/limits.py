"""Settings of what a request may ask, how work is scheduled and recovered, and who may ask how much."""

from __future__ import annotations

from typing import Annotated

from imagegen import env
from imagegen.config.fields import Caps, Derived, Group, Networks, Rate, Reader, Sizes, Weights, choice, setting
from imagegen.env import ImproperlyConfiguredEnv

QUALITY_STEPS = {"low": 8, "medium": 20, "high": 40}


def _quality_steps(name: str, value: str) -> dict[str, int]:
    steps = dict(QUALITY_STEPS)
    for item in env.read_list(name, value):
        tier, sep, number = item.partition(":")
        try:
            steps[tier.strip()] = int(number)
        except ValueError as exc:
            raise ImproperlyConfiguredEnv(f"{name}: {item!r} is not TIER:STEPS") from exc
        if not sep:
            raise ImproperlyConfiguredEnv(f"{name}: {item!r} is not TIER:STEPS")
    return steps


def _quality_levers(name: str, value: str) -> dict[str, str]:
    levers = {}
    for item in env.read_list(name, value):
        if item == "none":
            continue
        tier, sep, variant = item.partition(":")
        if not sep:
            raise ImproperlyConfiguredEnv(f"{name}: {item!r} is not TIER:LEVER=VALUE,... or none")
        levers[tier.strip()] = variant.strip()
    return levers


class Requests(Group):
    """What one request may ask for, and its defaults."""

    size_menu: Sizes = setting([(64, 64), (96, 64), (64, 96), (96, 96)],
                               "the sizes a request may ask for; production: `512x512,768x768,1024x1024,...`")
    max_steps: int = setting(150, "the most steps a request may ask for")
    default_steps: int = setting(20, "steps when a request names none (a served model's `serving.json` may set its own)")
    max_count: int = setting(8, "the most images one request may ask for")
    default_guidance: float = setting(5.0, "guidance scale when a request names none")
    quality_steps: Annotated[dict[str, int], Reader(_quality_steps, "`TIER:STEPS,...`")] = setting(
        dict(QUALITY_STEPS), "the OpenAI route's quality tiers as steps on the default model, on top of the default "
        "(another served model's come from its `serving.json`; bench/quality_tiers.py measures them)")
    quality_levers: Annotated[dict[str, str], Reader(_quality_levers, "`TIER:LEVER=VALUE,...` or `none`")] = setting(
        {"low": "cfg-cutoff=0.5"}, "the levers a tier bundles on the default model (gpu_tasks/levers.py `variant`): its jobs "
        "run in passes of their own with them, and its cache entries are its own (docs/families.md)")
    max_cancel_after: int = setting(7 * 86400, "the largest `cancel_after` a job may ask for, seconds")
    openai_wait_seconds: float = setting(120.0, "how long `POST /v1/images/generations` waits for its job (on its events)")
    openai_cancel_on_disconnect: bool = setting(True, "cancel the job when its OpenAI-route client hangs up first")


class Scheduler(Group):
    """The batch scheduler, and the recovery of work whose worker or message was lost."""

    batch_cap: int = setting(8, "images per pass, any shape")
    batch_caps: Caps = setting({}, "per-shape caps (`manage.py measure_batch_caps` suggests a measured table)")
    fill_wait: float = setting(0.3, "seconds a partial batch waits for more")
    starvation_seconds: float = setting(10.0, "a bucket older than this goes first")
    fair_share: bool = setting(True, "deficit round robin by images across owners inside a shape (scheduling/policy.py); "
                               "false: first in, first out, for comparison")
    preemption: bool = setting(True, "interactive work waiting for a lane pauses its GPU's batch-tier pass at the next step "
                               "(state kept in the worker), runs, and the paused pass resumes (docs/stages.md)")
    user_weights: Weights = setting({}, "per-user fair-share weights, usernames (default 1, at least 0.1): a weight of 2 gets "
                                    "twice the images per round")
    lease_seconds: float = setting(30.0, "a worker's lease on work it started, renewed every third of this; work waiting in "
                                   "a queue holds none and is never declared stuck")
    max_attempts: int = setting(3, "attempts at a job's stage; only a lost worker counts as one")
    reaper_interval: float = setting(5.0, "seconds between passes of the reaper (expired leases, lost messages)")
    prompt_check_resend_seconds: float = setting(60.0, "a job still waiting for its prompt check this long gets the check "
                                                 "sent again (a broker that restarted empty drops messages)")
    prompt_batch: int = setting(16, "a cpu worker's prompt check also checks up to this many - 1 other waiting prompts, one "
                                "encoder pass for all (jobs/pipeline/prompt_batch.py; 1: each alone)")
    preload_prompt_filter: bool = setting(True, "a worker consuming the prompt-check queue loads the prompt filter before its "
                                          "pool forks, so its processes share one load")
    stage_resend_seconds: float = setting(120.0, "a batch stage no worker started this long after it was sent is sent again "
                                          "(no attempt); plus twice its measured run time per batch queued ahead of it")
    stage_retry_max_backoff: float = setting(60.0, "storage away in a batch stage: Celery retries it, doubling from 1 s "
                                             "(with jitter) up to this many seconds apart")
    classify_retry_seconds: float = setting(3600.0, "real time the classify stage is retried for; then its jobs fail")
    publish_retry_seconds: float = setting(3600.0, "real time the publish stage is retried for; then its jobs fail")


class Admission(Group):
    """The request-hash cache, admission control and per-user limits (docs/limits.md, "Limits and abuse")."""

    cache_enabled: bool = setting(True, "the request-hash cache")
    cache_scope: Annotated[str, choice("k-anonymous", "user", "global-unseeded", "global")] = setting(
        "k-anonymous", "who an entry serves: its owner at once and others once k distinct users asked (answered no sooner "
        "than a fresh job), its owner only, requests without a seed, or all (docs/limits.md)")
    cache_share_k: int = setting(3, "distinct users who must ask for a request before its entry serves others (k-anonymous)")
    seed_policy: str = setting("random", "`random` or `fixed` (fixed seeds make repeats hit the cache)")
    fixed_seed: int = setting(0, "the seed with `IMAGEGEN_SEED_POLICY=fixed`")
    max_queue_wait: float = setting(120.0, "seconds of estimated wait past which a submit is a 429, or degraded with "
                                    "`allow_degrade`")
    degrade_steps: int = setting(8, "steps of a degraded job (a model's `serving.json` may name its own: shapes-v2 12)")
    max_queued_images: int = setting(2000, "images queued in all past which submits are refused")
    user_max_in_flight: int = setting(16, "unfinished jobs per user (429 naming the limit, checked with the insert)")
    user_max_images_per_day: int = setting(1000, "GPU images per user in 24 h, plus those their unfinished jobs reserve")
    batch_max_queue_wait: float = setting(6 * 3600.0, "`priority: batch` jobs' wait limit (they wait behind interactive "
                                          "work)")
    user_max_batch_in_flight: int = setting(64, "unfinished batch jobs per user, counted apart from interactive ones")
    user_max_batch_images_per_day: int = setting(5000, "batch images per user in 24 h")
    user_prompt_checks_per_minute: int = setting(60, "prompt checks per user per minute, whatever they decide "
                                                 "(`prompt_checks`; 0: off)")
    user_max_in_review: int = setting(5, "cases per user in the moderators' queue (held jobs, undecided appeals); a hold "
                                      "past it blocks the job instead")
    user_max_tokens: int = setting(50, "API tokens one account may hold (then 409)")
    user_max_streams: int = setting(32, "open websockets and SSE streams per user, together (across web processes)")
    watch_reread_seconds: float = setting(5.0, "how often a watcher re-reads its job's row and each web process re-joins "
                                          "the job's events (a Redis restart forgets them)")


class Access(Group):
    """Request rates, client addresses, sign-in and the metrics endpoint (docs/limits.md, "Request rates")."""

    throttle_submit: Rate = setting("120/min", "per signed-in user: requests that change something (POST/PUT/PATCH/DELETE; "
                                    "429 `submits_per_user`)")
    throttle_read: Rate = setting("600/min", "per signed-in user: GET/HEAD; a conditional read answered 304 costs a tenth "
                                  "(429 `reads_per_user`)")
    throttle_stream: Rate = setting("60/min", "per signed-in user: streams opened (429 `streams_per_user`)")
    throttle_ip: Rate = setting("600/min", "per client address, every request (429 `requests_per_ip`)")
    num_proxies: int = setting(0, "proxies in front that append to X-Forwarded-For (0: the peer address is the client; the "
                               "deploy files: 0, uvicorn resolving it from IMAGEGEN_TRUSTED_PROXIES)")
    signin_max_failures: int = setting(10, "failed sign-ins per (account, address) and per address in the window, then "
                                       "locked (429 + Retry-After); past as many on one account, a doubling delay")
    signin_window_seconds: float = setting(900.0, "the window failed sign-ins are counted in")
    signin_max_delay: float = setting(30.0, "the longest delay of an attempt on an account with many failures")
    signin_known_days: float = setting(90.0, "an address the account signed in from passes the account-wide delay this "
                                       "long")
    password_min_length: int = setting(10, "Django's password validators on the admin's forms and `changepassword` "
                                       "(also: similarity to the user, common passwords, all digits)", django=None)
    metrics_token: str = setting("", "`/metrics` and `/readyz`'s details accept `Authorization: Bearer <token>`")
    metrics_allow: Networks = setting(Derived("`127.0.0.0/8,::1/128` when embedded, else none",
                                              lambda c: ["127.0.0.0/8", "::1/128"] if c.embedded else []),
                                      "client addresses let into `/metrics` without the token (else 401)")
    metrics_cache_seconds: float = setting(5.0, "the database gauges are computed at most once per this many seconds per "
                                           "process (counters stay live)")
