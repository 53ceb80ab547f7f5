"""OpenAPI 3 documentation of the API (drf-spectacular): what the code alone does not say.

- ImagegenAutoSchema (REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]) adds the error answers every
  operation can give, in the shape its API uses: the native API's `{"detail": ...}` and
  `{field: [messages]}`, the OpenAI-compatible routes' `{"error": {...}}`; 429 and 503 carry
  Retry-After, 401 carries WWW-Authenticate.
- JobSerializerExtension types the job JSON's computed fields (progress, images, batch);
  StrictSerializerExtension says `additionalProperties: false` for the request bodies, which
  refuse unknown fields (jobs/api/strict.py).
- document_plain_views (a postprocessing hook) documents the routes that are plain Django
  views, not DRF ones: the SSE stream with its event shapes, the image URL, /healthz (and
  /readyz, /metrics when they exist).

Nothing here changes behaviour; it is only read when the schema is generated.
"""

from __future__ import annotations

import re

from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerExtension,
    OpenApiSerializerFieldExtension,
)
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ComponentRegistry, ResolvedComponent
from rest_framework import serializers

from jobs.models import JobStatus

SCHEMA_REF = "#/components/schemas/"

# --- reusable schema objects -------------------------------------------------------------

RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before trying again.",
        "schema": {"type": "integer", "minimum": 0},
    }
}
WWW_AUTHENTICATE = {
    "WWW-Authenticate": {
        "description": 'The scheme to authenticate with ("Token", or "Bearer" on the OpenAI-compatible routes).',
        "schema": {"type": "string"},
    }
}

FIELD_ERRORS_SCHEMA = {
    "type": "object",
    "description": (
        "Field errors: each invalid field (or `non_field_errors`) maps to a list of messages. "
        'A body that is not valid JSON gets `{"detail": "..."}` instead.'
    ),
    "additionalProperties": {
        "oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}],
    },
    "example": {"width": ["80x64 is not on the size menu (64x64, 96x64, 64x96, 96x96)"]},
}
OPENAI_ERROR_SCHEMA = {
    "type": "object",
    "description": "An error in the OpenAI API's shape.",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {
                    "type": "string",
                    "description": "invalid_request_error, authentication_error, rate_limit_error or server_error.",
                },
                "param": {"type": "string", "nullable": True, "description": "The request field at fault, if any."},
                "code": {
                    "type": "string",
                    "nullable": True,
                    "description": (
                        "moderation_blocked, content_policy_review, invalid_value, unknown_parameter, "
                        "invalid_type, unsupported_parameter, model_not_found, "
                        "invalid_api_key, rate_limit_exceeded, generation_failed, job_cancelled, timeout, "
                        "service_unavailable, unknown_url, ..."
                    ),
                },
                "moderation_details": {
                    "type": "object",
                    "description": "With moderation_blocked: where the request was stopped and why.",
                    "properties": {
                        "stage": {"type": "string", "enum": ["input", "output"],
                                  "description": "input: the prompt; output: a generated image."},
                        "categories": {"type": "array", "items": {"type": "string"},
                                       "description": "The safety policy's categories that stopped it."},
                    },
                },
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
    "example": {
        "error": {
            "message": "Your request was rejected by the safety system (prompt): ...",
            "type": "invalid_request_error",
            "param": "prompt",
            "code": "moderation_blocked",
            "moderation_details": {"stage": "input", "categories": ["violence"]},
        }
    },
}

EVENT_STATUSES = [*JobStatus.values, "deleted"]
JOB_EVENT_SCHEMA = {
    "oneOf": [
        {"$ref": SCHEMA_REF + "StatusEvent"},
        {"$ref": SCHEMA_REF + "ProgressEvent"},
        {"$ref": SCHEMA_REF + "PreviewEvent"},
    ],
    "discriminator": {
        "propertyName": "type",
        "mapping": {
            "status": SCHEMA_REF + "StatusEvent",
            "progress": SCHEMA_REF + "ProgressEvent",
            "preview": SCHEMA_REF + "PreviewEvent",
        },
    },
}

SSE_DESCRIPTION = """\
A `text/event-stream` (server-sent events) of the job's events, owner only. It starts with the
current state (a `status` event, then the latest `progress` while running), follows live, and
ends after the terminal status (`done`, `blocked`, `failed`, `cancelled`, or `deleted`).

Each event is framed as one `event: <type>` line and one `data: <json>` line, then a blank line;
a `: keepalive` comment line comes after 15 s of silence. The `data:` JSON is one of
`StatusEvent`, `ProgressEvent`, `PreviewEvent` (see `JobEvent`):

```
event: status
data: {"type": "status", "job": "…", "status": "running", "reason": "", "images": []}

event: progress
data: {"type": "progress", "job": "…", "step": 3, "total": 20}

event: preview
data: {"type": "preview", "job": "…", "step": 4, "image": "data:image/jpeg;base64,…"}

event: status
data: {"type": "status", "job": "…", "status": "done", "reason": "", "images": [{"id": "…", "index": 0, "seed": 7, "url": "/media/i/….png", "width": 64, "height": 64}]}
```

The same events arrive as text frames on the websocket `/ws/jobs/{job_id}/`.
"""


# --- components generated from serializers ---------------------------------------------------
# Each shape the API answers with is a serializer below; drf-spectacular maps it to its component
# (serializer_components), so no schema is written out by hand. FieldErrors (a map of field ->
# messages), OpenAIError's example and JobEvent (a oneOf of the event components) stay literal:
# a serializer cannot state them.


class ConstField(serializers.CharField):
    """A string that is always one of a few values (an event's `type`)."""

    def __init__(self, *values: str, **kwargs):
        self.values = list(values)
        super().__init__(**kwargs)


class ConstFieldExtension(OpenApiSerializerFieldExtension):
    target_class = "jobs.api.schema.ConstField"

    def map_serializer_field(self, auto_schema, direction):
        return {"type": "string", "enum": self.target.values}


class ErrorDetailSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="What went wrong, for a person to read.")


class JobImageSerializer(serializers.Serializer):
    """A delivered image. `url` is immutable and needs no auth; seeds are `job.seed + index`."""

    id = serializers.UUIDField()
    index = serializers.IntegerField()
    seed = serializers.IntegerField(max_value=2**63 - 1, min_value=-(2**63))
    url = serializers.CharField()
    width = serializers.IntegerField()
    height = serializers.IntegerField()


class ProgressSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    total = serializers.IntegerField()


class BatchSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    size = serializers.IntegerField(help_text="images in the pass")


class StatusEventSerializer(serializers.Serializer):
    """The job's status changed (sent first, with the current state, then on every change)."""

    type = ConstField("status")
    job = serializers.UUIDField()
    status = ConstField(*EVENT_STATUSES)
    reason = serializers.CharField(allow_blank=True)
    images = JobImageSerializer(many=True, help_text="Only when done.")


class ProgressEventSerializer(serializers.Serializer):
    """A denoising step finished."""

    type = ConstField("progress")
    job = serializers.UUIDField()
    step = serializers.IntegerField()
    total = serializers.IntegerField()


class PreviewEventSerializer(serializers.Serializer):
    """A low-resolution JPEG of the intermediate image, every few steps."""

    type = ConstField("preview")
    job = serializers.UUIDField()
    step = serializers.IntegerField()
    image = serializers.CharField(help_text="A data: URL, `data:image/jpeg;base64,...`.")


class ServerSentEventSerializer(serializers.Serializer):
    """One server-sent event as framed on the wire; `data` is the JSON text of a JobEvent."""

    event = ConstField("status", "progress", "preview")
    data = serializers.CharField(help_text="JSON: a StatusEvent, ProgressEvent or PreviewEvent (see JobEvent).")  # type: ignore[assignment]


class ReadinessSerializer(serializers.Serializer):
    status = ConstField("ready", "not ready")
    checks = serializers.DictField(child=serializers.CharField(),
                                   help_text='Each part (database, redis, gpu_workers): "ok" or what is wrong.')
    failing = serializers.ListField(child=serializers.CharField())


def _inspector(registry: ComponentRegistry | None = None) -> AutoSchema:
    """An AutoSchema outside any operation, to map documentation serializers."""
    from rest_framework.views import APIView

    auto = AutoSchema()
    auto.registry = registry or ComponentRegistry()
    auto.method, auto.path = "GET", "/"
    view = APIView()
    view.request = None  # type: ignore[assignment]  # no request: the schema of a shape, not of a call
    view.format_kwarg = None
    auto.view = view
    return auto


def serializer_components(*serializer_classes) -> dict[str, dict]:
    """The components drf-spectacular makes of these serializers (and those they nest)."""
    auto = _inspector()
    for serializer_class in serializer_classes:
        auto.resolve_serializer(serializer_class, "response")
    return auto.registry.build({}).get("schemas", {})


def inline(serializer_class, **extra) -> dict:
    """A serializer's schema, inline (not a component)."""
    return {**_inspector()._map_serializer(serializer_class(), "response"), **extra}


def _register(auto_schema, name: str, schema: dict) -> dict:
    component = ResolvedComponent(name=name, type=ResolvedComponent.SCHEMA, schema=schema, object=f"imagegen:{name}")
    auto_schema.registry.register_on_missing(component)
    return component.ref


# --- documentation-only serializers ----------------------------------------------------------


class ConflictSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="Why the job cannot be cancelled.")
    status = serializers.ChoiceField(choices=JobStatus.choices, help_text="The job's (terminal) status.")


class ImagesResponseDataSerializer(serializers.Serializer):
    url = serializers.CharField(required=False, help_text='An absolute URL of the PNG (response_format "url").')
    b64_json = serializers.CharField(required=False, help_text='The PNG, base64 (response_format "b64_json").')
    revised_prompt = serializers.CharField(required=False, allow_null=True, help_text=(
        "The prompt drawn, as the prompt rewriter wrote it (the server default IMAGEGEN_REWRITE_DEFAULT says "
        "whether this route rewrites); null: not rewritten."))


class ImagesResponseSerializer(serializers.Serializer):
    created = serializers.IntegerField(help_text="Unix time the job was created.")
    data = ImagesResponseDataSerializer(many=True)  # type: ignore[assignment]  # a field named data


class ModelSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="The served model version (IMAGEGEN_MODEL_VERSION).")
    object = serializers.ChoiceField(choices=["model"])
    created = serializers.IntegerField(help_text="Unix time the model was installed.")
    owned_by = serializers.CharField()


class ModelListSerializer(serializers.Serializer):
    object = serializers.ChoiceField(choices=["list"])
    data = ModelSerializer(many=True)  # type: ignore[assignment]  # a field named data


# --- extensions ------------------------------------------------------------------------------


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "jobs.api.openai.views.BearerTokenAuthentication"
    name = "bearerAuth"
    priority = 1

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "The same API token as `Authorization: Token ...`, sent as `Authorization: Bearer <token>`.",
        }


class StrictSerializerExtension(OpenApiSerializerExtension):
    """A request body of a StrictSerializer (jobs/api/strict.py) takes no other fields: an unknown
    one is a 400 naming it."""

    target_class = "jobs.api.strict.StrictSerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_basic_serializer(self.target, direction)
        if direction == "request":
            schema["additionalProperties"] = False
        return schema


class JobSerializerExtension(OpenApiSerializerExtension):
    target_class = "jobs.representation.JobSerializer"

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        props = schema.get("properties", {})
        image_ref = auto_schema.resolve_serializer(JobImageSerializer, direction).ref
        if "progress" in props:
            props["progress"] = inline(ProgressSerializer, readOnly=True, description="Steps done of the total.")
        if "images" in props:
            props["images"] = {
                "type": "array",
                "items": image_ref,
                "readOnly": True,
                "description": "The delivered images; empty until the job is done.",
            }
        if "batch" in props:
            props["batch"] = inline(BatchSerializer, nullable=True, readOnly=True, description=(
                "The GPU pass the job ran in (jobs of the same shape from any user share one); null before it runs."))
        if "status" in props:
            props["status"].setdefault(
                "description",
                "queued -> running -> done, or blocked (see blocked_stage, reason), failed (reason), "
                "cancelled, or review (held for a moderator).",
            )
        return schema


# --- the AutoSchema ------------------------------------------------------------------------

_UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}


def _json(schema: dict, description: str, headers: dict | None = None) -> dict:
    response = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        response["headers"] = dict(headers)
    return response


class ImagegenAutoSchema(AutoSchema):
    def get_tags(self) -> list[str]:
        if self.path.startswith("/v1/"):
            return ["openai-compatible"]
        if self.path.startswith("/api/v1/jobs"):
            return ["jobs"]
        if self.path.startswith("/api/"):
            return ["service"]
        return super().get_tags()

    def _is_openai(self) -> bool:
        return bool(getattr(self.view, "openai_compatible", False))

    def _requires_auth(self) -> bool:
        auth = self.get_auth()
        return bool(auth) and {} not in auth

    def _error_shape(self, code: str) -> dict:
        if self._is_openai():
            name = "OpenAIError"
        else:
            name = "FieldErrors" if code == "400" else "ErrorDetail"
        return _json({"$ref": SCHEMA_REF + name}, "")

    def _error_responses(self) -> dict:
        has_body = self.method in {"POST", "PUT", "PATCH"} and self.get_request_serializer() is not None
        has_path_params = "{" in self.path
        paginated = self.method == "GET" and self._is_list_view() and self._get_paginator() is not None
        auth = self._requires_auth()
        out: dict = {}
        if self._is_openai():
            err = {"$ref": SCHEMA_REF + "OpenAIError"}
            if has_body:
                out["400"] = _json(err, "Invalid request: `param` names the field at fault.")
            if auth:
                out["401"] = _json(err, "Missing or wrong API key.", WWW_AUTHENTICATE)
            if has_path_params:
                out["404"] = _json(err, "No such object.")
            out["429"] = _json(err, "Too many requests.", RETRY_AFTER)
            out["503"] = _json(err, "A backing service (database, queue) is unavailable.", RETRY_AFTER)
            return out
        if not auth:
            return out
        detail = {"$ref": SCHEMA_REF + "ErrorDetail"}
        if has_body:
            out["400"] = _json({"$ref": SCHEMA_REF + "FieldErrors"}, "Invalid input: field errors.")
        out["401"] = _json(detail, "No or wrong credentials.", WWW_AUTHENTICATE)
        if self.method in _UNSAFE:
            out["403"] = _json(detail, "Session auth without a valid CSRF token.")
        if has_path_params:
            out["404"] = _json(detail, "No such job, or not yours (another user's job is a 404, never a 403).")
        elif paginated:
            out["404"] = _json(detail, "Invalid cursor.")
        out["429"] = _json(detail, "Too many requests or over quota; retry after Retry-After seconds.", RETRY_AFTER)
        out["503"] = _json(detail, "The database or the queue is unavailable; nothing was changed.", RETRY_AFTER)
        return out

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        # Shared components the error answers point at.
        self.resolve_serializer(ErrorDetailSerializer, direction)
        _register(self, "FieldErrors", FIELD_ERRORS_SCHEMA)
        _register(self, "OpenAIError", OPENAI_ERROR_SCHEMA)
        defaults = self._error_responses()
        for code, response in defaults.items():
            if code in responses:
                # Declared by the view: keep its body, add the headers.
                if "headers" in response:
                    responses[code].setdefault("headers", {}).update(response["headers"])
                continue
            responses[code] = response
        for code, response in responses.items():
            if code >= "400" and "content" not in response:
                # An error declared with a description only: the API's error shape.
                fallback = defaults.get(code) or self._error_shape(code)
                response["content"] = fallback["content"]
        for code in ("429", "503"):
            if code in responses:
                responses[code].setdefault("headers", {}).update(RETRY_AFTER)
        return dict(sorted(responses.items()))


# --- plain Django views ------------------------------------------------------------------------


def url_routes() -> dict[str, str]:
    """OpenAPI path -> URL name for every route in the URLconf."""
    from django.urls import URLPattern, URLResolver, get_resolver

    def to_openapi(prefix: str, pattern) -> str:
        text = str(pattern)
        if text.startswith("^") or text.endswith("$"):
            text = text.lstrip("^").rstrip("$")
            text = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", text)
            text = text.replace("\\", "")
        else:
            text = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", text)
        return prefix + text

    routes: dict[str, str] = {}

    def walk(patterns, prefix: str) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, to_openapi(prefix, p.pattern))
            elif isinstance(p, URLPattern):
                routes["/" + to_openapi(prefix, p.pattern)] = p.name or ""

    walk(get_resolver().url_patterns, "")
    return routes


_JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}
_TOKEN_OR_SESSION: list[dict[str, list]] = [{"tokenAuth": []}, {"cookieAuth": []}]


def _plain_operations() -> dict[str, dict]:
    detail = {"$ref": SCHEMA_REF + "ErrorDetail"}
    return {
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Liveness",
                "description": "200 while the web process is up; checks nothing else.",
                "tags": ["service"],
                "security": [{}],
                "responses": {
                    "200": _json(
                        {"type": "object", "properties": {"status": {"type": "string", "enum": ["ok"]}}, "required": ["status"]},
                        "The process is up.",
                    )
                },
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Readiness",
                "description": "200 when the database, Redis and the GPU workers answer; 503 naming the failing part.",
                "tags": ["service"],
                "security": [{}],
                "responses": {
                    "200": _json({"$ref": SCHEMA_REF + "Readiness"}, "Ready."),
                    "503": _json({"$ref": SCHEMA_REF + "Readiness"}, "Not ready: `failing` names the failing parts."),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics",
                "tags": ["service"],
                "security": [{}],
                "responses": {
                    "200": {"description": "Prometheus text exposition format.", "content": {"text/plain": {"schema": {"type": "string"}}}},
                },
            }
        },
        "/api/v1/jobs/{job_id}/events": {
            "get": {
                "operationId": "api_v1_jobs_events_retrieve",
                "summary": "Watch a job (server-sent events)",
                "description": SSE_DESCRIPTION,
                "tags": ["jobs"],
                "parameters": [_JOB_ID],
                "security": _TOKEN_OR_SESSION,
                "responses": {
                    "200": {
                        "description": "The event stream; ends after the terminal status.",
                        "content": {
                            "text/event-stream": {
                                # Before OpenAPI 3.2 (itemSchema), `schema` describes one event.
                                "schema": {"$ref": SCHEMA_REF + "ServerSentEvent"},
                                "x-data-schema": {"$ref": SCHEMA_REF + "JobEvent"},
                            }
                        },
                    },
                    "401": _json(detail, "No or wrong credentials.", WWW_AUTHENTICATE),
                    "404": _json(detail, "No such job, or not yours."),
                    "503": _json(detail, "The database or the queue is unavailable.", RETRY_AFTER),
                },
            }
        },
        "/v1/{path}": {
            method: {
                "operationId": f"openai_unknown_{method}",
                "summary": "Any other path under /v1",
                "description": "Not a route: 404 in the OpenAI error shape (code `unknown_url`), never an HTML page.",
                "tags": ["openai-compatible"],
                "security": [{}],
                "parameters": [{"name": "path", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"404": _json({"$ref": SCHEMA_REF + "OpenAIError"}, "No such route.")},
            }
            for method in ("get", "post")
        },
        "/api/{path}": {
            method: {
                "operationId": f"api_unknown_{method}",
                "summary": "Any other path under /api",
                "description": "Not a route (a malformed id included): 404 `{\"detail\": \"Not found.\"}`, never an HTML page.",
                "tags": ["jobs"],
                "security": [{}],
                "parameters": [{"name": "path", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"404": _json(detail, "No such route.")},
            }
            for method in ("get", "post")
        },
        "/media/i/{key}": {
            "get": {
                "operationId": "media_image_retrieve",
                "summary": "A delivered image",
                "description": (
                    "The file behind an image `url` (local storage; with S3 the URLs point at the bucket), in the "
                    "job's output format (png, jpeg, webp; the extension says which, the Content-Type follows it), "
                    "with the generation parameters inside (docs/api.md, Image files). Immutable: cached for a year. "
                    "No auth: the key is unguessable."
                ),
                "tags": ["images"],
                "security": [{}],
                "parameters": [
                    {
                        "name": "key",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "pattern": r"^[0-9a-f]{32}\.(png|jpeg|webp)$"},
                        "description": "32 hex digits and `.png`, `.jpeg` or `.webp`.",
                    }
                ],
                "responses": {
                    "200": {
                        "description": "The image.",
                        "content": {t: {"schema": {"type": "string", "format": "binary"}} for t in ("image/png", "image/jpeg", "image/webp")},
                    },
                    "404": {"description": "No such image.", "content": {"text/html": {"schema": {"type": "string"}}}},
                    "503": _json(detail, "The database is unavailable.", RETRY_AFTER),
                },
            }
        },
        "/media/v/{clip}/{name}": {
            "get": {
                "operationId": "media_clip_file_retrieve",
                "summary": "A delivered clip's file",
                "description": (
                    "The files behind a video's `url`, `poster_url`, `playlist_url` and `sprites_url` (local storage; "
                    "with S3 the URLs point at the bucket): the MP4 (H.264, faststart, content credentials), the "
                    "poster and sprite sheet (PNG), the HLS playlists and their fMP4 init and media segments, named "
                    "by relative URIs (docs/video.md). A single byte range (`Range: bytes=a-b`) is answered 206 "
                    "(416 past the end). Immutable: cached for a year. No auth: the clip's id is unguessable."
                ),
                "tags": ["images"],
                "security": [{}],
                "parameters": [
                    {"name": "clip", "in": "path", "required": True,
                     "schema": {"type": "string", "pattern": r"^[0-9a-f]{32}$"}, "description": "The clip's id, 32 hex digits."},
                    {"name": "name", "in": "path", "required": True,
                     "schema": {"type": "string", "pattern": r"^[a-z0-9_/]{1,40}\.[a-z0-9]{3,4}$"},
                     "description": "`video.mp4`, `poster.png`, `sprites.png`, `hls/master.m3u8`, `hls/<rendition>/...`."},
                ],
                "responses": {
                    "200": {
                        "description": "The file.",
                        "content": {t: {"schema": {"type": "string", "format": "binary"}} for t in (
                            "video/mp4", "image/png", "application/vnd.apple.mpegurl", "video/iso.segment")},
                    },
                    "206": {"description": "The byte range asked for.",
                            "content": {"video/mp4": {"schema": {"type": "string", "format": "binary"}}}},
                    "404": {"description": "No such file of a public clip.",
                            "content": {"text/html": {"schema": {"type": "string"}}}},
                    "416": {"description": "The range starts past the end."},
                    "503": _json(detail, "The database is unavailable.", RETRY_AFTER),
                },
            }
        },
    }


def document_plain_views(result, generator, request, public):
    """Postprocessing hook: add the plain Django routes present in the URLconf and the event schemas."""
    routes = url_routes()
    paths = result.setdefault("paths", {})
    for path, item in _plain_operations().items():
        if path in routes and path not in paths:
            paths[path] = item
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    documented = [ErrorDetailSerializer, JobImageSerializer, StatusEventSerializer, ProgressEventSerializer,
                  PreviewEventSerializer, ServerSentEventSerializer, *([ReadinessSerializer] if "/readyz" in paths else [])]
    for name, schema in [*serializer_components(*documented).items(), ("JobEvent", JOB_EVENT_SCHEMA),
                         ("OpenAIError", OPENAI_ERROR_SCHEMA)]:
        schemas.setdefault(name, schema)
    result["components"]["schemas"] = dict(sorted(schemas.items()))
    security = result["components"].setdefault("securitySchemes", {})
    security.setdefault(
        "tokenAuth",
        {"type": "apiKey", "in": "header", "name": "Authorization", "description": 'Token-based authentication with required prefix "Token"'},
    )
    security.setdefault("cookieAuth", {"type": "apiKey", "in": "cookie", "name": "sessionid"})
    result["paths"] = dict(sorted(paths.items()))
    return result


class RefusedSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="Why the job was refused.")
    limit = serializers.CharField(required=False, allow_blank=True, help_text="Which limit (e.g. jobs_in_flight).")
    eta_seconds = serializers.FloatField(required=False, allow_null=True, help_text="The estimated wait that was too long, if that was the reason.")
    retry_after = serializers.IntegerField(required=False, help_text="Seconds; the same as the Retry-After header.")


class QueueShapeSerializer(serializers.Serializer):
    jobs = serializers.IntegerField(required=False)
    images = serializers.IntegerField(required=False)
    estimated_wait_seconds = serializers.FloatField(required=False, allow_null=True)


class QueueModelSerializer(serializers.Serializer):
    model = serializers.CharField(help_text="The lane: the model's name, name@version for a version other than the default.")
    version = serializers.CharField(required=False, help_text="What a job's `model` field names.")
    display_name = serializers.CharField(required=False, help_text="The model as the page shows it.")
    default = serializers.BooleanField(required=False, help_text="The version a job without `model` runs on.")
    default_steps = serializers.IntegerField(required=False)
    min_steps = serializers.IntegerField(required=False, help_text="Fewer steps are refused (a 400 naming `steps`).")
    max_steps = serializers.IntegerField(required=False)
    guidance_scale = serializers.FloatField(required=False)
    active_workers = serializers.IntegerField(required=False, allow_null=True)
    queued_images = serializers.IntegerField(required=False)
    queued_gpu_seconds = serializers.FloatField(required=False, allow_null=True)
    estimated_wait_seconds = serializers.FloatField(required=False, allow_null=True, help_text="For a new job of the default shape.")
    shapes = QueueShapeSerializer(many=True, required=False, help_text="Per shape (width, height, steps, ...): queue depth and wait.")


class QueueSerializer(serializers.Serializer):
    models = QueueModelSerializer(many=True)
