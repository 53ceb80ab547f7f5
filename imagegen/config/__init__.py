"""imagegen's settings as one typed object, read from the environment in one place.

`load()` reads every variable once, through its declared reader, into groups by concern
(imagegen/config/groups.py, limits.py, delivery.py); imagegen/settings.py takes its module-level
names from it (`as_django()`), and docs/configuration.md's reference is generated from the same
declarations (`python -m imagegen.config --markdown`).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from imagegen.config.delivery import Credentials, Integration, Queues, Retention, Safety, Storage
from imagegen.config.fields import BASE_DIR, Derived, Group, Spec, specs
from imagegen.config.groups import Https, Installation, Levers, Models, Services, Web, Worker
from imagegen.config.limits import Access, Admission, Requests, Scheduler

__all__ = ["BASE_DIR", "Config", "load", "specs"]


class Config(BaseModel):
    """Every setting, by concern, in the order they are read."""

    model_config = ConfigDict(extra="forbid")

    installation: Installation
    https: Https
    services: Services
    web: Web
    models: Models
    levers: Levers
    worker: Worker
    requests: Requests
    scheduler: Scheduler
    admission: Admission
    access: Access
    safety: Safety
    queues: Queues
    integration: Integration
    storage: Storage
    credentials: Credentials
    retention: Retention

    @model_validator(mode="after")
    def _refuse_unsafe_combinations(self) -> Config:
        from django.core.exceptions import ImproperlyConfigured

        embedded, storage = self.installation.embedded, self.storage
        # Delivering images no classifier has judged is an explicit choice twice over in production.
        if not embedded and self.safety.image_classifier.strip() == "none" and not self.safety.allow_unchecked_delivery:
            raise ImproperlyConfigured(
                "IMAGEGEN_IMAGE_CLASSIFIER=none would deliver images no classifier has judged; in production "
                "(IMAGEGEN_EMBEDDED=false) also set IMAGEGEN_ALLOW_UNCHECKED_DELIVERY=true to accept that"
            )
        # A CDN in front of the bucket caches public objects for a year (immutable): a take-down must purge it.
        if storage.s3_custom_domain and storage.cdn_purge_hook.strip() == "jobs.media.cdn:log_purge":
            raise ImproperlyConfigured(
                "IMAGEGEN_S3_CUSTOM_DOMAIN puts a CDN in front of the public images, but IMAGEGEN_CDN_PURGE_HOOK is the "
                "log-only jobs.media.cdn:log_purge, so a take-down would stay cached at the edge for a year: set "
                "IMAGEGEN_CDN_PURGE_HOOK to jobs.media.cdn:http_purge, jobs.media.cdn:cloudfront_invalidate or your own hook"
            )
        # A prefix of the public bucket is private only while nothing that can read the bucket serves it.
        if storage.s3_bucket and not storage.s3_quarantine_bucket and not embedded:
            raise ImproperlyConfigured(
                "IMAGEGEN_S3_BUCKET is set without IMAGEGEN_S3_QUARANTINE_BUCKET: held and taken-down images would go to "
                f"{storage.s3_quarantine_prefix!r} inside the public bucket, where anything that can read the bucket (a CDN) "
                "can serve them; in production (IMAGEGEN_EMBEDDED=false) set IMAGEGEN_S3_QUARANTINE_BUCKET to a private bucket"
            )
        return self

    def groups(self) -> list[tuple[str, Group]]:
        return [(name, getattr(self, name)) for name in type(self).model_fields]

    def as_django(self) -> dict[str, Any]:
        """The module-level names imagegen/settings.py takes from the object, with their values."""
        return {spec.django: getattr(group, spec.name)
                for _, group in self.groups() for spec in specs(type(group)) if spec.django}


def group_classes() -> list[tuple[str, type[Group]]]:
    return [(name, info.annotation) for name, info in Config.model_fields.items()]  # type: ignore[misc]


def load(environ: Mapping[str, str] | None = None) -> Config:
    """Every setting from `environ` (the process's environment by default). An unset or empty
    variable takes its default; a malformed one raises ImproperlyConfiguredEnv naming it."""
    environ = os.environ if environ is None else environ
    loaded = SimpleNamespace()
    groups: dict[str, Group] = {}
    for name, cls in group_classes():
        values: dict[str, Any] = {}
        for spec in specs(cls):
            raw = environ.get(spec.env)
            if raw:
                value = spec.reader.read(spec.env, raw)
            elif isinstance(spec.default, Derived):
                value = spec.default.compute(loaded)
            else:
                value = copy.deepcopy(spec.default)
            values[spec.name] = value
            setattr(loaded, spec.name, value)
        groups[name] = cls.model_validate(values)
        vars(loaded).update(dict(groups[name]))
    return Config.model_validate(groups)


def all_specs() -> list[tuple[str, type[Group], list[Spec]]]:
    return [(name, cls, specs(cls)) for name, cls in group_classes()]
