"""Hot queries built and compiled by the ORM once, then run with new values per call.

Building a queryset and compiling its SQL costs the web tier more CPU than the database spends
answering it: a poll's two lookups (the token with its user, the job with its batch) took about
a millisecond of ORM work each, per request, for statements that never change but for their
values (bench/api_load.py --breakdown). A `Precompiled` query is built once per database and
thread with stand-in values, its SQL and parameters kept; a call fills the stand-ins' places
with the values asked for, runs the statement through Django's cursor (so execute wrappers,
query capture and the query budget tests see it) and turns the rows into model instances the
way QuerySet iteration does (its converters, select_related's populators), so callers get the
same objects the ORM would give them.

    TOKEN = Precompiled(lambda prefix: ApiToken.objects.select_related("user").filter(prefix=prefix),
                        prefix=ApiToken._meta.get_field("prefix"))
    rows = TOKEN(prefix="abcd1234")

Each stand-in is an exact comparison with one model field (it may appear in several places, as
in two subqueries), named with that field so its value is prepared for the database the way
the ORM prepares it. A `values_list()` query answers tuples instead of instances (a grouped
count or sum: no row when nothing matched). A query whose compiled parameters do not hold
every stand-in (a backend that inlines values) runs through the ORM on every call instead:
slower, never wrong.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import count
from typing import Any

from django.db import connections
from django.db.models import Field, QuerySet
from django.db.models.query import get_related_populators  # type: ignore[attr-defined]  # Django's own, as QuerySet iteration uses it

_serial = count(1)


def _target(field: Any) -> Field:
    """The field whose values a comparison with `field` takes: a foreign key's is its target's."""
    return field.target_field if field.is_relation else field


def _standin(field: Field, connection) -> Any:
    """A value of the field's type that no real row has, different for every call (an integer
    near the top of the backend's range for the field: outside it the ORM compiles no SQL)."""
    n = next(_serial)
    internal = _target(field).get_internal_type()
    if internal == "UUIDField":
        return uuid.UUID(int=(0x5EED_0000_0000_0000 << 64) + n)
    if internal in ("DateTimeField",):
        return datetime(1901, 2, 3, 4, 5, 6, n % 1_000_000, tzinfo=UTC)
    if internal in ("CharField", "TextField", "SlugField"):
        return f"\x01precompiled-standin-{n}\x01"
    if internal in ("AutoField", "BigAutoField", "IntegerField", "BigIntegerField", "PositiveIntegerField",
                    "SmallIntegerField", "PositiveSmallIntegerField", "PositiveBigIntegerField", "SmallAutoField"):
        low, high = connection.ops.integer_field_range(internal)
        return (high if high is not None else 2**31 - 1) - 7 - n
    raise TypeError(f"no stand-in for a {internal} ({field})")


@dataclass
class _Compiled:
    compiler: Any
    sql: str
    params: list
    slots: list[tuple[int, str]]          # (place in params, stand-in name)
    converters: dict
    columns: int
    init_list: list[str] | None           # None: a values_list() query, rows answered as tuples
    model_slice: slice
    populators: list


class Precompiled:
    def __init__(self, build: Callable[..., QuerySet], **fields: Any):
        self.build, self.fields = build, fields
        self._local = threading.local()

    def _prepare(self, name: str, value: Any, connection) -> Any:
        target = _target(self.fields[name])
        return target.get_db_prep_value(target.get_prep_value(value), connection, prepared=True)

    def _compile(self, using: str) -> _Compiled | None:
        connection = connections[using]
        standins = {name: _standin(field, connection) for name, field in self.fields.items()}
        queryset = self.build(**standins)
        compiler = queryset.query.get_compiler(using=using)
        sql, params = compiler.as_sql()
        params = list(params)
        slots: list[tuple[int, str]] = []
        for name, value in standins.items():
            prepared = self._prepare(name, value, connection)
            found = [i for i, p in enumerate(params) if type(p) is type(prepared) and p == prepared]
            if not found:
                return None
            slots.extend((i, name) for i in found)
        fields = [s[0] for s in compiler.select[0:compiler.col_count]]
        klass_info = compiler.klass_info
        converters = compiler.get_converters(fields)
        if klass_info is None:
            return _Compiled(compiler, sql, params, slots, converters, compiler.col_count, None, slice(0), [])
        start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
        return _Compiled(
            compiler=compiler, sql=sql, params=params, slots=slots, converters=converters,
            columns=compiler.col_count,
            init_list=[f[0].target.attname for f in compiler.select[start:end]],
            model_slice=slice(start, end),
            populators=get_related_populators(klass_info, compiler.select, using),
        )

    def _compiled(self, using: str) -> _Compiled | None:
        cache = self._local.__dict__.setdefault("compiled", {})
        key = (using, connections[using].settings_dict["NAME"])
        if key not in cache:
            cache[key] = self._compile(using)
        return cache[key]

    def is_compiled(self, using: str = "default") -> bool:
        """Whether calls run the kept statement (False: the ORM per call, the fallback)."""
        return self._compiled(using) is not None

    def __call__(self, using: str = "default", **values: Any) -> list:
        connection = connections[using]
        compiled = self._compiled(using)
        if compiled is None:  # the ORM, every call
            return list(self.build(**values).using(using))
        params = list(compiled.params)
        for place, name in compiled.slots:
            params[place] = self._prepare(name, values[name], connection)
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            rows = cursor.fetchall()
        if compiled.converters:
            rows = list(compiled.compiler.apply_converters(rows, compiled.converters))
        if compiled.init_list is None:
            return [tuple(row[:compiled.columns]) for row in rows]
        model = compiled.compiler.klass_info["model"]
        out = []
        for row in rows:
            obj = model.from_db(using, compiled.init_list, row[compiled.model_slice])
            for populator in compiled.populators:
                populator.populate(row, obj)
            out.append(obj)
        return out

    def first(self, using: str = "default", **values: Any) -> Any:
        rows = self(using, **values)
        return rows[0] if rows else None
