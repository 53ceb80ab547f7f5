"""How a setting is declared: its type (with the reader of its environment value), its default
(fixed, or derived from settings read before it), one line of help, its environment variable
and the Django setting it becomes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, ClassVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

from imagegen import env
from imagegen.env import ImproperlyConfiguredEnv

BASE_DIR = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class Reader:
    """Reads a set, non-empty environment value; `kind` names its form in the reference."""

    read: Callable[[str, str], Any]
    kind: str


@dataclass(frozen=True)
class Derived:
    """A default computed from the settings read before this one (`loaded`, by field name)."""

    doc: str
    compute: Callable[[SimpleNamespace], Any]


def choice(*options: str) -> Reader:
    def read(name: str, value: str) -> str:
        if value not in options:
            raise ImproperlyConfiguredEnv(f"{name}={value!r} is not one of {', '.join(options)}")
        return value

    return Reader(read, "one of " + ", ".join(f"`{o}`" for o in options))


Sizes = Annotated[list[tuple[int, int]], Reader(env.read_sizes, "sizes `WxH,...`")]
Caps = Annotated[dict[str, int], Reader(env.read_caps, "`WxH:N,...`")]
Weights = Annotated[dict[str, float], Reader(env.read_weights, "`USERNAME=WEIGHT,...`")]
Rate = Annotated[str, Reader(env.read_rate, "rate `N/min`, `N/s`, `N/hour`, `N/15min` or `off`")]
Networks = Annotated[list[str], Reader(env.read_networks, "CIDRs `a.b.c.d/n,...`")]

_PLAIN: dict[Any, Reader] = {
    str: Reader(env.read_str, "text"),
    int: Reader(env.read_int, "integer"),
    float: Reader(env.read_float, "number"),
    bool: Reader(env.read_bool, "boolean"),
    Path: Reader(lambda name, value: Path(value), "path"),
    list[str]: Reader(env.read_list, "list `a,b,...`"),
}


class Group(BaseModel):
    """Settings of one concern. `prefix` + the field's name in capitals is its variable unless
    the field names its own `env`."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    prefix: ClassVar[str] = "IMAGEGEN_"


def setting(default: Any, help: str, *, env: str | None = None, django: str | None = "") -> Any:
    """A setting. `django`: the module-level name in imagegen/settings.py ("": the variable's
    name; None: used only inside settings.py's own structures, e.g. DATABASES)."""
    return Field(default=default, description=help, json_schema_extra={"env": env or "", "django": django})


@dataclass(frozen=True)
class Spec:
    name: str
    env: str
    django: str | None
    default: Any
    help: str
    reader: Reader


def specs(group: type[Group]) -> list[Spec]:
    out = []
    for name, info in group.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        variable = str(extra.get("env") or group.prefix + name.upper())
        django = extra.get("django", "")
        out.append(Spec(name, variable, variable if django == "" else (str(django) if django else None),
                        info.default, info.description or "", _reader(info)))
    return out


def _reader(info: FieldInfo) -> Reader:
    for meta in info.metadata:
        if isinstance(meta, Reader):
            return meta
    annotation = info.annotation
    if annotation in _PLAIN:
        return _PLAIN[annotation]
    if get_origin(annotation) is Annotated:  # pragma: no cover - pydantic unwraps these
        return _reader(FieldInfo.from_annotation(get_args(annotation)[0]))
    raise TypeError(f"no reader for {annotation!r}")
