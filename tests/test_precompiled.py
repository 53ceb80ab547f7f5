"""imagegen/precompiled.py: a hot query compiled once answers what the ORM answers, row for row
and object for object, on the suite's database (PostgreSQL in CI, SQLite as the README runs
it), runs one statement per call where the query budget tests count it, and keeps one compiled
statement per thread."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from imagegen.precompiled import Precompiled
from jobs.models import Batch, GeneratedImage, GenerationJob
from tests.test_security import make_job

pytestmark = pytest.mark.django_db


def fields_of(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_a_job_with_its_batch_is_the_object_the_orm_gives(alice, bob):
    from jobs.api.views import _OWN_JOB

    batch = Batch.objects.create(model_version="tiny-random", width=64, height=64, steps=2, guidance_scale=5.0, size=3, cap=8)
    with_batch = make_job(alice, status="running", batch=batch, started_at=timezone.now())
    without = make_job(alice, status="queued", cancel_after=30, deadline_at=timezone.now() + timedelta(seconds=30))
    make_job(bob)
    assert _OWN_JOB.is_compiled()
    for job in (with_batch, without):
        orm = GenerationJob.objects.visible().select_related("batch").get(id=job.id, owner=alice)
        with CaptureQueriesContext(connection) as captured:
            got = _OWN_JOB.first(id=job.id, owner=alice.pk)
            got_str = _OWN_JOB.first(id=str(job.id), owner=alice.pk)  # the path's text form too
        assert len(captured) == 2
        assert fields_of(got) == fields_of(orm) == fields_of(got_str)
        assert (got.batch is None) == (orm.batch is None)
        if orm.batch is not None:
            assert fields_of(got.batch) == fields_of(orm.batch)
        assert got._state.adding is False and got._state.db == "default"
    assert _OWN_JOB.first(id=with_batch.id, owner=bob.pk) is None     # another tenant's job: none
    assert _OWN_JOB.first(id=uuid.uuid4(), owner=alice.pk) is None
    GenerationJob.objects.filter(id=without.id).update(deleted_at=timezone.now())
    assert _OWN_JOB.first(id=without.id, owner=alice.pk) is None     # deleted: not visible


def test_a_token_with_its_user_and_the_images_of_a_job(alice):
    from jobs.access import tokens
    from jobs.models import ApiToken
    from jobs.representation import _IMAGES_OF

    token = tokens.issue(alice, name="t")
    tokens.find(token)  # the first use writes last_used_at
    row = tokens.find(token)
    orm = ApiToken.objects.select_related("user").get(prefix=tokens.prefix_of(token))
    assert fields_of(row) == fields_of(orm) and fields_of(row.user) == fields_of(orm.user)
    assert tokens.find(token[:-1] + ("A" if token[-1] != "A" else "B")) is None

    job = make_job(alice)
    for index in (1, 0):
        GeneratedImage.objects.create(job=job, index=index, seed=index, storage_key=f"i/{uuid.uuid4().hex}.png",
                                      width=64, height=64, byte_size=1, sha256="0" * 64, tier="public")
    got = _IMAGES_OF(job=job.pk)
    assert [fields_of(i) for i in got] == [fields_of(i) for i in job.images.all()] and [i.index for i in got] == [0, 1]
    assert _IMAGES_OF(job=uuid.uuid4()) == []


def test_grouped_counts_answer_tuples_and_nothing_when_none_match(alice, bob):
    from jobs.access import usage

    for status in ("queued", "running", "done", "queued"):
        make_job(alice, status=status)
    make_job(alice, status="queued", priority="batch")
    assert usage._IN_FLIGHT.is_compiled()
    assert usage.jobs_in_flight(alice.pk) == 3 and usage.jobs_in_flight(alice.pk, "batch") == 1
    assert usage.jobs_in_flight(bob.pk) == 0
    by_orm = (GenerationJob.objects.filter(owner=alice, status__in=["queued", "running"], priority="interactive")
              .order_by().values("owner_id").annotate(n=Count("id")).values_list("n"))
    assert usage._IN_FLIGHT(user=alice.pk, priority="interactive") == list(by_orm) == [(3,)]


def test_a_query_whose_standins_the_backend_does_not_pass_as_parameters_runs_through_the_orm(alice):
    make_job(alice, status="queued")
    # The stand-in is inlined into the SQL (a raw extra clause), so no parameter holds it.
    inlined = Precompiled(lambda owner: GenerationJob.objects.extra(where=[f"owner_id = {int(owner)}"]),
                          owner=GenerationJob._meta.get_field("owner"))
    assert not inlined.is_compiled()
    assert [j.owner_id for j in inlined(owner=alice.pk)] == [alice.pk]


def test_each_thread_keeps_its_own_compiled_statement(alice):
    from jobs.access import usage

    make_job(alice, status="queued")
    seen = []

    def count() -> None:
        seen.append((usage.jobs_in_flight(alice.pk), id(usage._IN_FLIGHT._local.compiled)))
        connection.close()

    usage.jobs_in_flight(alice.pk)
    threads = [threading.Thread(target=count) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    mine = id(usage._IN_FLIGHT._local.compiled)
    assert [n for n, _ in seen] == [1, 1] and len({c for _, c in seen} | {mine}) == 3
