"""Settings as one typed object (imagegen/config.py): imagegen/settings.py's module-level names are
the ones it had before the object existed, with the same values, under every environment below
(tests/settings_snapshot.json was captured from the hand-written readers); bad values stop the
start with the same message; the settings reference in docs/configuration.md is generated from the
object and matches it.

Regenerate the snapshot after an intended change of a setting:
`.venv/bin/python tests/test_settings_object.py --write` (and review its diff).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "tests" / "settings_snapshot.json"
OWN_PREFIXES = ("IMAGEGEN_", "DJANGO_", "CELERY_")
OWN_NAMES = ("DATABASE_URL", "REDIS_URL")

pytestmark = pytest.mark.unit


def _environments(var: Path) -> dict[str, dict[str, str]]:
    """The environments compared: a name and the variables set (besides IMAGEGEN_VAR_DIR)."""
    from imagegen.signing_credentials import issue_chain

    issued = var / "c2pa-issued"
    if not (issued / "key.pem").exists() and not any(issued.glob("*")):
        issued.mkdir(parents=True, exist_ok=True)
        creds = issue_chain(issued, valid_days=365, organization="imagegen test")
        (var / "issued.json").write_text(json.dumps({"key": str(creds.key), "chain": str(creds.chain)}))
    creds_paths = json.loads((var / "issued.json").read_text())
    production = {
        "IMAGEGEN_EMBEDDED": "false", "DJANGO_SECRET_KEY": "x" * 50, "DJANGO_ALLOWED_HOSTS": "imagegen.example.com",
        "IMAGEGEN_C2PA_KEY": creds_paths["key"], "IMAGEGEN_C2PA_CERT": creds_paths["chain"],
    }
    services = {"DATABASE_URL": "postgres://imagegen:pw@db.example:5432/imagegen", "REDIS_URL": "redis://redis.example:6379/1"}
    tuned = {
        "DJANGO_DEBUG": "yes", "DJANGO_ALLOWED_HOSTS": "a.example, b.example", "DJANGO_CSRF_TRUSTED_ORIGINS": "https://a.example",
        "DJANGO_SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https", "DJANGO_SECURE_HSTS_SECONDS": "60",
        "IMAGEGEN_SERVER_TIMING": "on", "IMAGEGEN_WEB_THREADS": "4", "IMAGEGEN_WEB_QUEUE_TIMEOUT": "1.5",
        "IMAGEGEN_DB_CONN_MAX_AGE": "7", "IMAGEGEN_PASSWORD_MIN_LENGTH": "12",
        "IMAGEGEN_MODEL_PATH": "models/shapes-v1", "IMAGEGEN_MODEL_NAME": "art", "IMAGEGEN_EXTRA_MODELS": "canary=models/shapes-v2,abs=/opt/m",
        "IMAGEGEN_QUALITY_MODELS": "low=canary,high=missing", "IMAGEGEN_COMPILE": "true", "IMAGEGEN_REWRITE_DEFAULT": "off",
        "IMAGEGEN_PREVIEW_SOURCE": "latents", "IMAGEGEN_SIZE_MENU": "512x512, 768X512", "IMAGEGEN_QUALITY_STEPS": "low:4, ultra:60",
        "IMAGEGEN_QUALITY_LEVERS": "none", "IMAGEGEN_BATCH_CAPS": "512x512:4,768x512:2", "IMAGEGEN_USER_WEIGHTS": "alice=4,bot=0.5",
        "IMAGEGEN_CACHE_SCOPE": "user", "IMAGEGEN_THROTTLE_READ": "10/15min", "IMAGEGEN_THROTTLE_IP": "off",
        "IMAGEGEN_METRICS_ALLOW": "10.0.0.0/8,::1", "IMAGEGEN_NUM_PROXIES": "1", "IMAGEGEN_IMAGE_CLASSIFIER": "none",
        "IMAGEGEN_QUEUE_CPU": "c", "IMAGEGEN_QUEUE_GPU_PREFIX": "g/", "CELERY_BROKER_URL": "amqp://guest@mq//",
        "CELERY_TASK_TIME_LIMIT": "100", "IMAGEGEN_LOG_FORMAT": "plain", "IMAGEGEN_LOG_LEVEL": "DEBUG",
        "IMAGEGEN_S3_BUCKET": "pub", "IMAGEGEN_S3_ENDPOINT_URL": "http://minio:9000/", "IMAGEGEN_S3_PUBLIC_ACL": "public-read",
        "IMAGEGEN_S3_CUSTOM_DOMAIN": "img.example.com", "IMAGEGEN_CDN_PURGE_HOOK": "jobs.media.cdn:http_purge",
        "IMAGEGEN_UPLOAD_ATTEMPTS": "6", "IMAGEGEN_RETENTION_INTERVAL": "60", "IMAGEGEN_UNPUBLISH_INTERVAL": "5",
        "IMAGEGEN_REAPER_INTERVAL": "2",
    }
    bad = {
        "bad-int": {"IMAGEGEN_WEB_THREADS": "many"},
        "bad-bool": {"DJANGO_DEBUG": "maybe"},
        "bad-float": {"IMAGEGEN_HOT_DAYS": "soon"},
        "bad-size": {"IMAGEGEN_SIZE_MENU": "64x64,64"},
        "bad-caps": {"IMAGEGEN_BATCH_CAPS": "64x64"},
        "bad-weights": {"IMAGEGEN_USER_WEIGHTS": "alice=0"},
        "bad-models": {"IMAGEGEN_EXTRA_MODELS": "a@b=models/x"},
        "bad-rate": {"IMAGEGEN_THROTTLE_SUBMIT": "fast"},
        "bad-choice": {"IMAGEGEN_CACHE_SCOPE": "everyone"},
        "bad-preview-source": {"IMAGEGEN_PREVIEW_SOURCE": "noise"},
        "bad-rewrite-default": {"IMAGEGEN_REWRITE_DEFAULT": "auto"},
        "bad-metrics-allow": {"IMAGEGEN_METRICS_ALLOW": "10.0.0.0/8,nowhere"},
        "production-without-key": {**production, "DJANGO_SECRET_KEY": ""},
        "production-unchecked": {**production, "IMAGEGEN_IMAGE_CLASSIFIER": "none"},
        "production-unchecked-accepted": {**production, "IMAGEGEN_IMAGE_CLASSIFIER": "none", "IMAGEGEN_ALLOW_UNCHECKED_DELIVERY": "1"},
        "production-s3-without-quarantine": {**production, "IMAGEGEN_S3_BUCKET": "pub"},
        "production-s3": {**production, "IMAGEGEN_S3_BUCKET": "pub", "IMAGEGEN_S3_QUARANTINE_BUCKET": "held"},
        "cdn-log-only": {"IMAGEGEN_S3_BUCKET": "pub", "IMAGEGEN_S3_CUSTOM_DOMAIN": "img.example.com"},
        "c2pa-mismatch": {"IMAGEGEN_C2PA_KEY": creds_paths["key"]},
    }
    return {"embedded": {}, "services": services, "production": production, "tuned": tuned, **bad}


def _normalized(text: str, var: Path) -> str:
    return text.replace(str(var), "<VAR>").replace(str(ROOT), "<BASE>")


def _plain(value: Any, var: Path) -> Any:
    """A JSON form that keeps types apart (1 vs 1.0, a tuple vs a list, a Path vs a str)."""
    if isinstance(value, Path):
        return {"Path": _normalized(str(value), var)}
    if isinstance(value, str):
        return _normalized(value, var)
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return {"float": value}
    if isinstance(value, tuple):
        return {"tuple": [_plain(v, var) for v in value]}
    if isinstance(value, list):
        return [_plain(v, var) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, var) for k, v in value.items()}
    if hasattr(value, "__dict__") and not callable(value):  # botocore's Config in STORAGES
        return {type(value).__name__: _plain(dict(sorted(vars(value).items())), var)}
    return {type(value).__name__: _normalized(repr(value), var)}


def snapshot(env: dict[str, str], var: Path) -> dict[str, Any]:
    """Every upper-case module-level name imagegen/settings.py defines under `env` (the process's
    environment without the project's own variables, plus these), or the error that stops it."""
    saved = dict(os.environ)
    base = {k: v for k, v in saved.items() if not k.startswith(OWN_PREFIXES) and k not in OWN_NAMES}
    os.environ.clear()
    os.environ.update({**base, "IMAGEGEN_VAR_DIR": str(var), **env})
    try:
        namespace = runpy.run_path(str(ROOT / "imagegen" / "settings.py"))
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {_normalized(str(exc), var)}"}
    finally:
        os.environ.clear()
        os.environ.update(saved)
    names = {k: _plain(v, var) for k, v in sorted(namespace.items()) if k.isupper() and not k.startswith("_")}
    if not env.get("DJANGO_SECRET_KEY"):
        names["SECRET_KEY"] = "<installation key>"
    return names


def snapshots(var: Path) -> dict[str, dict[str, Any]]:
    return {name: snapshot(env, var) for name, env in _environments(var).items()}


def test_settings_are_the_ones_captured_before_the_object(tmp_path):
    expected = json.loads(SNAPSHOT.read_text())
    got = snapshots(tmp_path)
    assert set(got) == set(expected)
    for name in expected:
        assert got[name].keys() == expected[name].keys(), name
        for key in expected[name]:
            assert got[name][key] == expected[name][key], f"{name}: {key}"


def test_the_settings_module_names_every_value_of_the_object():
    from imagegen.config.reference import assignments

    text = (ROOT / "imagegen" / "settings.py").read_text()
    assert assignments() in text, "regenerate the block: python -m imagegen.config --assignments"
    assert "os.environ" not in text and "getenv" not in text, "settings.py reads the environment only through the object"


def test_the_reference_in_the_docs_is_generated_from_the_object():
    from imagegen.config.reference import BEGIN, END, markdown

    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert BEGIN in doc and END in doc
    committed = doc[doc.index(BEGIN):doc.index(END) + len(END)] + "\n"
    assert committed == markdown(), "regenerate docs/configuration.md's reference: python -m imagegen.config --markdown"


def test_every_setting_has_one_variable_a_type_a_default_and_one_line_of_help():
    from imagegen.config import all_specs, load

    variables = [spec.env for _, _, specs in all_specs() for spec in specs]
    assert len(variables) == len(set(variables)), "a variable declared twice"
    django = [spec.django for _, _, specs in all_specs() for spec in specs if spec.django]
    assert len(django) == len(set(django)), "a Django setting taken from two variables"
    for _, cls, specs in all_specs():
        assert cls.__doc__, f"{cls.__name__}: no description"
        for spec in specs:
            assert spec.help and "\n" not in spec.help, f"{spec.env}: no help line"
    config = load({})
    assert config.web.web_threads == 8 and config.web.redis_pool_size == 16
    assert load({"IMAGEGEN_WEB_THREADS": "2"}).web.redis_pool_size == 10  # a derived default follows what it derives from


@pytest.mark.parametrize("kind, bad", [("integer", "many"), ("number", "soon"), ("boolean", "maybe")])
def test_a_malformed_value_stops_the_start_naming_its_variable(kind, bad):
    from imagegen.config import all_specs, load
    from imagegen.env import ImproperlyConfiguredEnv

    specs = [spec for _, _, group in all_specs() for spec in group if spec.reader.kind == kind]
    assert specs
    for spec in specs:
        with pytest.raises(ImproperlyConfiguredEnv, match=spec.env):
            load({spec.env: bad})


@pytest.mark.parametrize("variable, bad", [
    ("IMAGEGEN_QUALITY_STEPS", "low"), ("IMAGEGEN_QUALITY_STEPS", "low:many"), ("IMAGEGEN_QUALITY_LEVERS", "low"),
    ("IMAGEGEN_QUALITY_MODELS", "low"), ("IMAGEGEN_METRICS_ALLOW", "10.0.0.0/8,::1,lan"),
    ("IMAGEGEN_THROTTLE_IP", "lots"), ("IMAGEGEN_REWRITE_DEFAULT", "yes"), ("IMAGEGEN_DB_CONNECT_TIMEOUT", "soon"),
])
def test_a_malformed_list_or_table_names_its_variable(variable, bad):
    """These were a bare ValueError from an unpacking (quality steps, levers) or, for the connect
    timeout, not read at all on SQLite; now each stops the start naming the variable."""
    from imagegen.config import load
    from imagegen.env import ImproperlyConfiguredEnv

    with pytest.raises(ImproperlyConfiguredEnv, match=variable):
        load({variable: bad})


def test_unset_and_empty_variables_take_the_default():
    from imagegen.config import load

    assert load({"IMAGEGEN_MAX_STEPS": "", "IMAGEGEN_SIZE_MENU": ""}) == load({})


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: tests/test_settings_object.py --write")
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as folder:
        SNAPSHOT.write_text(json.dumps(snapshots(Path(folder)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
