"""Prompt checks batched across prompts (jobs/pipeline/prompt_batch.py): one encoder pass for
several waiting prompts gives each the verdict its own check gives, records the others'
verdicts, and their own tasks then only apply them."""

from __future__ import annotations

import pytest

from imagegen.redis_client import get_redis
from jobs.models import GenerationJob
from jobs.pipeline import prompt_batch
from jobs.pipeline.prompt_gate import gate_prompt
from safety.prompt_filter import get_prompt_filter

PROMPTS = [
    ("a red circle on a grey background", ""),
    ("a watercolour of a lighthouse at dusk, highly detailed", "blurry"),
    ("a woman with no clothes at all", ""),
    ("a man hanging from a noose in a barn", ""),
    ("un chat orange sur une clôture", ""),
    ("two people having explicit sex", ""),
    ("a blue square and a green triangle", "text, watermark"),
    ("a corpse with its throat slit open", ""),
]


@pytest.fixture
def counted_checks(monkeypatch):
    """The process's filter, with its single-prompt checks counted (the batch's own pass is
    check_many's, which calls check per prompt once the encoder ran for all of them)."""
    flt = get_prompt_filter()
    calls = {"check": 0, "many": 0}
    check, many = flt.check, flt.check_many

    def counting_check(prompt, negative_prompt=""):
        calls["check"] += 1
        return check(prompt, negative_prompt)

    def counting_many(items):
        calls["many"] += 1
        return many(items)

    monkeypatch.setattr(flt, "check", counting_check)
    monkeypatch.setattr(flt, "check_many", counting_many)
    return calls


def waiting_job(owner, prompt: str, negative: str = "") -> GenerationJob:
    return GenerationJob.objects.create(owner=owner, prompt=prompt, negative_prompt=negative, width=64, height=64,
                                        steps=2, guidance_scale=5.0, seed=1, model_version="tiny-random",
                                        progress_total=2)


def test_a_batch_check_gives_every_prompt_the_verdict_its_own_check_gives():
    flt = get_prompt_filter()
    alone = [flt.check(p, n) for p, n in PROMPTS]
    flt.embedding_cache.clear()  # the batch encodes them itself, in one pass
    together = flt.check_many(PROMPTS)
    assert [(v.decision, v.category) for v in together] == [(v.decision, v.category) for v in alone]
    assert [v.score for v in together] == pytest.approx([v.score for v in alone], abs=0.01)
    assert {v.decision for v in alone} >= {"allow", "block"}  # the set exercises both outcomes


def test_one_bad_pair_in_a_batch_fails_alone():
    answers = get_prompt_filter().check_many([PROMPTS[0], (None, ""), PROMPTS[2]])  # type: ignore[list-item]
    assert answers[0].decision == "allow" and isinstance(answers[1], TypeError) \
        and answers[2].decision == get_prompt_filter().check(*PROMPTS[2]).decision != "allow"


@pytest.mark.django_db(transaction=True)
def test_a_check_records_the_waiting_prompts_verdicts_and_their_tasks_only_apply_them(
        alice, redis_client, settings, monkeypatch, counted_checks, stay_queued):
    settings.IMAGEGEN_PROMPT_BATCH = 32
    jobs = [waiting_job(alice, p, n) for p, n in PROMPTS]
    first = gate_prompt(str(jobs[0].id))
    assert first == "allow" and counted_checks["many"] == 1
    for job in jobs[1:]:
        assert job.verdicts.filter(stage="prompt").count() == 1  # recorded by the first job's pass
    checks_after_the_pass = counted_checks["check"]
    decisions = [gate_prompt(str(job.id)) for job in jobs[1:]]
    assert counted_checks["check"] == checks_after_the_pass and counted_checks["many"] == 1  # no filter ran again
    expected = [get_prompt_filter().check(p, n).decision for p, n in PROMPTS[1:]]
    assert decisions == expected
    for job, decision in zip(jobs[1:], decisions, strict=True):
        job.refresh_from_db()
        if decision == "allow":  # admitted to the scheduler (a session's GPU worker may have taken it since)
            assert job.scheduled_at is not None and job.status not in ("blocked", "review")
        else:
            assert job.status == {"block": "blocked", "review": "review"}[decision]


@pytest.mark.django_db(transaction=True)
def test_a_prompt_another_worker_claimed_is_left_to_it(alice, redis_client, settings, monkeypatch, stay_queued):
    settings.IMAGEGEN_PROMPT_BATCH = 32
    mine, claimed, free = (waiting_job(alice, p) for p, _ in PROMPTS[:3])
    get_redis().set(prompt_batch._claim_key(str(claimed.id)), "1", ex=60)  # another worker's drain holds it
    gate_prompt(str(mine.id))
    assert not claimed.verdicts.exists()
    assert free.verdicts.filter(stage="prompt").count() == 1


@pytest.mark.django_db(transaction=True)
def test_with_a_batch_of_one_each_prompt_is_checked_alone(alice, redis_client, settings, monkeypatch, counted_checks,
                                                          stay_queued):
    settings.IMAGEGEN_PROMPT_BATCH = 1
    mine, other = waiting_job(alice, PROMPTS[0][0]), waiting_job(alice, PROMPTS[1][0])
    gate_prompt(str(mine.id))
    assert counted_checks == {"check": 1, "many": 0} and not other.verdicts.exists()


@pytest.mark.django_db(transaction=True)
def test_a_prefork_worker_loads_the_prompt_filter_once_before_its_pool_forks(alice, start_worker, settings):
    """The pool processes of a worker on the prompt-check queue start with the filter loaded by
    their parent: none of them loads it on its first check (each did: 11-17 s per process on
    these cores, before the first prompt of a fresh `make run` got its verdict)."""
    import re
    import time

    from jobs.pipeline import stages

    queue = "cpu-preload"
    settings.QUEUE_CPU = queue   # this test's checks go to this worker only
    worker = start_worker("cpu-preload", queue, concurrency=2, IMAGEGEN_QUEUE_CPU=queue)
    try:
        jobs = [waiting_job(alice, p, n) for p, n in PROMPTS[:4]]
        for job in jobs:
            stages.send("prompt", str(job.id))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(j.verdicts.filter(stage="prompt").exists() for j in jobs):
            time.sleep(0.2)
        assert all(j.verdicts.filter(stage="prompt").exists() for j in jobs)
        loads = [int(pid) for pid in re.findall(r"prompt filter loaded in process (\d+)", worker.log_path.read_text())]
        assert loads == [worker.proc.pid], loads
    finally:
        worker.stop()   # start_worker's workers otherwise live until the session ends


def _rows_read(plan: dict) -> float:
    """Rows every node of an EXPLAIN (ANALYZE, FORMAT JSON) plan produced, loops included."""
    return plan.get("Actual Rows", 0) * plan.get("Actual Loops", 1) + sum(_rows_read(p) for p in plan.get("Plans", []))


@pytest.mark.django_db
def test_finding_waiting_prompts_reads_a_bounded_number_of_rows_behind_a_backlog(alice):
    """Behind 1,000 queued jobs whose prompts were checked, the drain's search for unchecked
    prompts read every verdict once per queued job on PostgreSQL whose statistics had not caught
    up with the burst (~1M rows, ~0.5 s a pass: an anti-join); it must read about as many rows
    as it finds, whatever the backlog."""
    import json

    from django.db import connection

    from jobs import actions
    from safety.prompt_filter import PromptVerdict

    if connection.vendor != "postgresql":
        pytest.skip("row counts of a query plan need PostgreSQL (CI's first pass runs this)")
    backlog = GenerationJob.objects.bulk_create([GenerationJob(
        owner=alice, prompt=f"a red circle {i}", width=64, height=64, steps=2, guidance_scale=5.0, seed=i,
        model_version="tiny-random", progress_total=2) for i in range(1000)])
    for job in backlog:  # checked the way the gate records it (an allowed prompt: its verdict)
        actions.record_prompt_verdict(job, PromptVerdict("allow", "", 0.0, "", "test"))
    GenerationJob.objects.bulk_create([GenerationJob(
        owner=alice, prompt=f"a blue square {i}", width=64, height=64, steps=2, guidance_scale=5.0, seed=i,
        model_version="tiny-random", progress_total=2) for i in range(20)])
    query = prompt_batch.waiting_query(backlog[0].id, 15)
    assert len(list(query)) == 15
    plan = json.loads(query.explain(format="json", analyze=True))[0]["Plan"]
    assert _rows_read(plan) < 100, plan


@pytest.mark.django_db(transaction=True)
def test_with_server_timing_on_each_check_keeps_its_account_for_the_benchmark(alice, redis_client, settings, stay_queued):
    """bench/api_load.py --run-command reads these: the check's wall and CPU time, statements and
    round trips, the prompts in its encoder pass, and how long after the submit it started."""
    from imagegen.timing import read_records, records_key
    from jobs.pipeline.tasks import check_prompt

    settings.IMAGEGEN_PROMPT_BATCH = 32
    settings.IMAGEGEN_SERVER_TIMING = True
    get_redis().delete(records_key("prompt_check"))
    jobs = [waiting_job(alice, p, n) for p, n in PROMPTS[:3]]
    assert [check_prompt(str(job.id)) for job in jobs] == ["allow", "allow", "review"]
    first, *others = reversed(read_records("prompt_check"))
    assert first["batch"] == 3 and first["decision"] == "allow" and first["db_n"] >= 3 and first["redis_n"] >= 1
    assert first["cpu_s"] > 0 and first["wall_s"] >= first["cpu_s"] * 0.5 and first["waited_s"] >= 0
    assert [r.get("batch") for r in others] == [None, None] and [r["decision"] for r in others] == ["allow", "review"]
    settings.IMAGEGEN_SERVER_TIMING = False
    check_prompt(str(waiting_job(alice, PROMPTS[0][0]).id))
    assert len(read_records("prompt_check")) == 3  # off: nothing kept
