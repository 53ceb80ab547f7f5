"""A job's stage is one field (issue 43, item 2): every claim selects by it, every move is a
compare-and-set from the stage the mover holds, and the status is derived from it in one place
and kept equal by the database. A duplicated or a stale message of each stage changes nothing.

Unit layer: each stage's action called directly, on a rollback transaction (nothing commits, so
no bucket entry or wake-up leaves it)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs import actions
from jobs.models import (
    FIRST_STAGE,
    STATUS_OF,
    Batch,
    BatchStage,
    GenerationJob,
    JobStage,
    JobStatus,
    at,
    status_of,
)
from safety.models import SafetyVerdict
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(db):
    """A user on the rollback transaction (the session's `alice` needs a committing database)."""
    return make_user("stage-alice")


def _job(owner, stage=JobStage.PROMPT, **fields) -> GenerationJob:
    fields = {"model_version": "tiny-random", **fields}
    return GenerationJob.objects.create(owner=owner, prompt="a red circle", width=64, height=64, steps=2,
                                        guidance_scale=5.0, seed=1, stage=stage, **fields)


def _as_sent(value):
    """What a broker carries: ids through a JSON round trip."""
    return json.loads(json.dumps(value, default=str))


def _snapshot(job_id) -> dict:
    row = GenerationJob.objects.filter(id=job_id).values().first()
    return {**row, "verdicts": SafetyVerdict.objects.filter(job_id=job_id).count()}


def test_every_stage_has_one_status_and_every_status_a_first_stage():
    assert set(STATUS_OF) == set(JobStage.values)
    assert {status_of(stage) for stage in JobStage.values} == set(JobStatus.values)
    assert all(status_of(FIRST_STAGE[status]) == status for status in JobStatus.values)
    assert FIRST_STAGE[JobStatus.QUEUED] == JobStage.PROMPT and FIRST_STAGE[JobStatus.RUNNING] == JobStage.GENERATE


def test_the_database_refuses_a_status_that_is_not_its_stages(alice):
    job = _job(alice, JobStage.WAITING_GPU)
    assert job.status == JobStatus.QUEUED  # derived on save
    with pytest.raises(IntegrityError), transaction.atomic():
        GenerationJob.objects.filter(id=job.id).update(status=JobStatus.RUNNING)
    with pytest.raises(IntegrityError), transaction.atomic():
        GenerationJob.objects.filter(id=job.id).update(stage=JobStage.DONE)
    GenerationJob.objects.filter(id=job.id).update(**at(JobStage.GENERATE))
    assert GenerationJob.objects.get(id=job.id).status == JobStatus.RUNNING


def test_a_rewrite_run_never_takes_a_job_whose_prompt_check_has_not_moved_it_on(alice):
    """The hole of issue 43: a verdict recorded (by a batch drain) but not applied, or no
    verdict at all, leaves the job in `prompt`; only the gate's allow moves it to `rewrite`."""
    unchecked = _job(alice, rewrite=True)
    drained = _job(alice, rewrite=True)
    SafetyVerdict.objects.create(job=drained, stage="prompt", decision="block", category="star")
    assert actions.claim_rewrites(_as_sent(str(unchecked.id)), 16) == []
    assert actions.claim_rewrites(None, 16) == []
    assert actions.admit(drained.id, from_stages=[JobStage.PROMPT]) == JobStage.REWRITE  # the gate's allow
    assert [j.id for j in actions.claim_rewrites(None, 16)] == [drained.id]
    assert GenerationJob.objects.get(id=unchecked.id).stage == JobStage.PROMPT


def test_a_duplicated_or_stale_prompt_check_changes_nothing(alice, settings):
    from jobs.pipeline.prompt_gate import gate_prompt

    settings.IMAGEGEN_PROMPT_BATCH = 1
    job = _job(alice)
    assert gate_prompt(_as_sent(str(job.id))) == "allow"
    moved = _snapshot(job.id)
    assert moved["stage"] == JobStage.WAITING_GPU and moved["verdicts"] == 1
    assert gate_prompt(_as_sent(str(job.id))) == "skipped"  # the duplicate
    assert _snapshot(job.id) == moved
    assert actions.admit(job.id) is None  # a stale allow from `prompt`
    assert actions.block_job(job.id, "prompt", "late", from_stages=[JobStage.PROMPT]) is False
    assert actions.hold_for_review(job.id, "prompt", "late") is False
    assert _snapshot(job.id) == moved


def test_a_duplicated_or_stale_rewrite_changes_nothing(alice):
    job = _job(alice, JobStage.REWRITE, rewrite=True)
    [claimed] = actions.claim_rewrites(str(job.id), 16)
    assert actions.claim_rewrites(str(job.id), 16) == []  # a duplicate token: the lease is held
    assert actions.save_rewrite(claimed.id, "a red circle, centred", "rw@1", changed=True)
    saved = _snapshot(job.id)
    assert saved["stage"] == JobStage.REWRITE_CHECK and saved["rewrite_attempts"] == 1
    assert not actions.save_rewrite(claimed.id, "something else", "rw@1", changed=False)  # a stale run
    assert actions.claim_rewrites(str(job.id), 16) == []
    assert not actions.fail_rewrite(job.id, "late")
    assert _snapshot(job.id) == saved


def test_an_unchanged_rewrite_goes_straight_to_the_scheduler(alice):
    job = _job(alice, JobStage.REWRITE, rewrite=True)
    actions.claim_rewrites(None, 16)
    assert actions.save_rewrite(job.id, job.prompt, "rw@1", changed=False)
    job.refresh_from_db()
    assert job.stage == JobStage.WAITING_GPU and job.scheduled_at is not None and job.drawn_prompt == job.prompt


def test_a_duplicated_or_stale_claim_and_hand_off_change_nothing(alice):
    job = _job(alice, JobStage.WAITING_GPU, scheduled_at=timezone.now())
    batch = Batch.objects.create(model_version="tiny-random", width=64, height=64, steps=2, guidance_scale=5.0,
                                 size=1, cap=1)
    [claimed] = actions.claim_batch(_as_sent([str(job.id)]), batch.id)
    assert claimed.stage == JobStage.GENERATE and claimed.status == JobStatus.RUNNING
    again = Batch.objects.create(model_version="tiny-random", width=64, height=64, steps=2, guidance_scale=5.0,
                                 size=1, cap=1)
    assert actions.claim_batch([str(job.id)], again.id) == []  # a duplicated scheduler entry
    held, dropped = actions.hand_off(batch.id, {str(job.id): claimed.attempts}, [])
    assert held == {str(job.id)} and dropped == []
    after = _snapshot(job.id)
    assert after["stage"] == JobStage.CLASSIFY and after["status"] == JobStatus.RUNNING
    assert actions.hand_off(batch.id, {str(job.id): claimed.attempts}, []) == (set(), [])  # a redelivery
    assert not actions.fail_running(claimed, "a stale attempt")  # the job left `generate`
    assert _snapshot(job.id) == after


def test_the_batch_stages_move_the_jobs_once_and_a_stale_run_moves_nothing(alice):
    batch = Batch.objects.create(model_version="tiny-random", width=64, height=64, steps=2, guidance_scale=5.0,
                                 size=1, cap=1, stage=BatchStage.CLASSIFY)
    job = _job(alice, JobStage.CLASSIFY, batch=batch, attempts=1)
    run = actions.start_stage(batch.id, BatchStage.CLASSIFY)
    assert actions.start_stage(batch.id, BatchStage.CLASSIFY) is None  # a duplicate finds it held
    assert not actions.record_verdicts(batch.id, "another-run", [])
    assert actions.record_verdicts(batch.id, run, [])
    assert GenerationJob.objects.get(id=job.id).stage == JobStage.PUBLISH
    assert not actions.record_verdicts(batch.id, run, [])  # the stage moved on
    publish = actions.start_stage(batch.id, BatchStage.PUBLISH)
    outcome = actions.Outcome(str(job.id), 1, JobStatus.DONE, "", "")
    assert actions.finish_batch(batch.id, "stale", [outcome]) is None
    finished, gone = actions.finish_batch(batch.id, publish, [outcome])
    assert finished == [str(job.id)] and gone == set()
    done = _snapshot(job.id)
    assert done["stage"] == JobStage.DONE and done["status"] == JobStatus.DONE
    assert actions.finish_batch(batch.id, publish, [outcome]) is None
    assert not actions.cancel_job(GenerationJob.objects.get(id=job.id))
    assert _snapshot(job.id) == done


def test_a_moderators_approval_moves_a_held_prompt_on_once(alice):
    moderator = make_user("stage-moderator")
    rewriting = _job(alice, JobStage.REVIEW, rewrite=True, blocked_stage="prompt", reason="held")
    rewritten = _job(alice, JobStage.REVIEW, rewrite=True, rewritten_at=timezone.now(), revised_prompt="a red disc",
                     blocked_stage="rewrite", reason="held")
    assert actions.approve(rewriting, moderator) == "approved"
    assert actions.approve(rewritten, moderator) == "approved"
    assert GenerationJob.objects.get(id=rewriting.id).stage == JobStage.REWRITE  # its prompt allowed: the rewriter next
    assert GenerationJob.objects.get(id=rewritten.id).stage == JobStage.WAITING_GPU
    with pytest.raises(actions.ReviewError):
        actions.approve(rewriting, moderator)  # a second moderator, or a double click
    assert SafetyVerdict.objects.filter(job=rewriting, stage="human").count() == 1


def test_the_reaper_re_sends_a_lost_rewrite_token_and_a_lost_check_by_stage(alice):
    old = timezone.now() - timedelta(hours=3)
    waiting_rewrite = _job(alice, JobStage.REWRITE, rewrite=True)
    held_lease = _job(alice, JobStage.REWRITE, rewrite=True, rewrite_lease_expires_at=timezone.now() + timedelta(minutes=5))
    unchecked = _job(alice)
    second_check = _job(alice, JobStage.REWRITE_CHECK, rewrite=True, rewritten_at=timezone.now())
    scheduled = _job(alice, JobStage.WAITING_GPU, scheduled_at=timezone.now())
    GenerationJob.objects.filter(owner=alice).update(created_at=old)
    restored, recheck, rewake = actions.rebuild_scheduler_state(min_age_seconds=3600 * 2)
    assert restored == 0  # admitted too recently for the bound given
    assert set(recheck) == {str(unchecked.id), str(second_check.id)}
    assert rewake == [str(waiting_rewrite.id)]
    assert str(held_lease.id) not in rewake and str(scheduled.id) not in recheck
    assert actions.rebuild_scheduler_state(min_age_seconds=3600 * 2)[1:] == ([], [])  # once per resend interval


def test_each_stage_waits_and_goes_silent_as_long_as_its_row_says(alice, monkeypatch, settings):
    """The table's rows declare how long a started run may go silent (its lease) and how long work
    may wait unstarted before a re-send; the claims and the reaper read the row, not a global."""
    import dataclasses

    from imagegen import stage_table

    settings.IMAGEGEN_TEST_REWRITE_RESEND = 10 * 3600
    settings.IMAGEGEN_TEST_CLASSIFY_LEASE = 4321
    settings.IMAGEGEN_TEST_REWRITE_LEASE = 1234
    rows = stage_table.STAGES
    monkeypatch.setitem(rows, "rewrite", dataclasses.replace(
        rows["rewrite"], resend_setting="IMAGEGEN_TEST_REWRITE_RESEND", lease_setting="IMAGEGEN_TEST_REWRITE_LEASE"))
    monkeypatch.setitem(rows, "classify", dataclasses.replace(rows["classify"], lease_setting="IMAGEGEN_TEST_CLASSIFY_LEASE"))
    old = timezone.now() - timedelta(hours=3)
    waiting_rewrite = _job(alice, JobStage.REWRITE, rewrite=True)
    unchecked = _job(alice)
    GenerationJob.objects.filter(owner=alice).update(created_at=old)
    _, recheck, rewake = actions.rebuild_scheduler_state(min_age_seconds=60)
    assert recheck == [str(unchecked.id)] and rewake == []  # 3 h is past the prompt row's bound, not the rewrite's
    [claimed] = actions.claim_rewrites(None, limit=4)
    claimed.refresh_from_db()
    lease = (claimed.rewrite_lease_expires_at - timezone.now()).total_seconds()
    assert claimed.id == waiting_rewrite.id and 1200 < lease <= 1234
    batch = Batch.objects.create(model_version="tiny-random", width=64, height=64, steps=2, guidance_scale=5.0,
                                 size=1, cap=1, stage=BatchStage.CLASSIFY)
    assert actions.start_stage(batch.id, BatchStage.CLASSIFY)
    lease = (Batch.objects.get(id=batch.id).lease_expires_at - timezone.now()).total_seconds()
    assert 4300 < lease <= 4321
    assert stage_table.STAGES["publish"].resend_seconds == settings.IMAGEGEN_STAGE_RESEND_SECONDS
    with pytest.raises(LookupError):
        _ = stage_table.STAGES["webhook"].lease_seconds  # its outbox row holds the lease
    with pytest.raises(ValueError, match="lease_setting"):
        dataclasses.replace(rows["publish"], lease_setting=None)  # a leased batch stage must say both


def test_a_message_for_a_job_that_is_gone_moves_nothing_and_raises_nothing(alice):
    """A stage's message may outlive its job (deleted by its owner, purged): the move finds no
    row and says so."""
    gone = _job(alice)
    gone_id = _as_sent(str(gone.id))
    gone.delete()
    assert actions.admit(gone_id) is None
    assert not actions.block_job(gone_id, "prompt", "nothing")
    assert not actions.save_rewrite(gone_id, "a red disc", "rw@1", changed=False)


def test_a_claim_that_fails_puts_the_jobs_it_took_back_in_their_buckets(alice, monkeypatch, settings):
    """The take removes entries from the buckets before the claim commits: a claim that raises
    (here as when a batch row vanished under it) puts back the jobs still waiting for a GPU, so
    they do not wait for the reaper's rebuild (the suite's shared workers run no reaper: a test's
    job stayed queued when the previous test's flush failed the GPU worker's claim)."""
    from gpu_tasks import generate
    from jobs.actions import lifecycle
    from scheduling import lanes, scheduler

    lane = f"stage-putback-{uuid.uuid4().hex[:8]}"
    job = _job(alice, JobStage.WAITING_GPU, scheduled_at=timezone.now(), model_version=lane)
    monkeypatch.setattr(lifecycle.lanes, "lane_of", lambda version: lane)
    monkeypatch.setattr(lanes, "wake", lambda lane: None)
    lifecycle.enqueue(job, job.scheduled_at.timestamp())
    flow = {"owner": str(job.owner_id), "tier": scheduler.tier_of(job.priority)}
    assert scheduler.is_enqueued(lifecycle.shape_of(job), str(job.id), 1, **flow)

    def vanished(job_ids, batch_id):
        raise IntegrityError("FOREIGN KEY constraint failed")

    monkeypatch.setattr(generate.actions, "claim_batch", vanished)
    with pytest.raises(IntegrityError):
        generate.take_and_claim(lane)
    assert scheduler.is_enqueued(lifecycle.shape_of(job), str(job.id), 1, **flow), "the taken job was lost"
    assert GenerationJob.objects.get(id=job.id).stage == JobStage.WAITING_GPU


def test_the_job_json_says_where_the_pipeline_has_the_job_beside_the_status_derived_from_it(alice):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(alice)
    for stage in (JobStage.REWRITE, JobStage.CLASSIFY, JobStage.REVIEW):
        job = _job(alice, stage, rewrite=stage == JobStage.REWRITE)
        body = api.get(f"/api/v1/jobs/{job.id}").json()
        assert (body["stage"], body["status"]) == (stage, status_of(stage)), body


def test_a_worker_loads_before_its_first_task_what_the_rows_of_its_queues_declare(monkeypatch, settings):
    import dataclasses
    from types import SimpleNamespace

    from gpu_tasks import worker
    from imagegen import stage_table

    loads_for = stage_table.loads_for
    assert loads_for({settings.QUEUE_CPU}) == ["prompt_filter"]
    assert loads_for({settings.QUEUE_CLASSIFY}) == ["image_gate"]
    assert loads_for({f"{settings.QUEUE_GPU_PREFIX}some-lane", settings.QUEUE_REWRITE}) == ["signing_key", "image_gate", "rewriter", "model"]
    assert loads_for({settings.QUEUE_IO, settings.QUEUE_WEBHOOKS}) == ["signing_key"]  # publish signs a clip's MP4
    assert loads_for({settings.QUEUE_WEBHOOKS}) == []
    # A row that declares a load: a worker of its queue loads it, and no other.
    rows = stage_table.STAGES
    monkeypatch.setitem(rows, "publish", dataclasses.replace(rows["publish"], loads=("image_gate",)))
    checked: list[bool] = []
    monkeypatch.setattr(worker, "_check_image_gate", lambda: checked.append(True))

    def consuming(*queues):
        return SimpleNamespace(task_consumer=SimpleNamespace(queues=[SimpleNamespace(name=q) for q in queues]))

    worker._on_worker_ready(sender=consuming(settings.QUEUE_WEBHOOKS))
    assert checked == []
    worker._on_worker_ready(sender=consuming(settings.QUEUE_IO))
    assert checked == [True]
    with pytest.raises(ValueError, match="not one of"):
        dataclasses.replace(rows["publish"], loads=("the-moon",))


def test_a_job_is_held_for_review_only_where_a_row_declares_that_hold(alice, monkeypatch, settings):
    """Each row declares which human-review hold can happen at its stage (issue 43, item 3): the
    prompt check holds the prompt as written and a changed rewrite, classify the images. Holding a
    job under a name no row declares raises and moves nothing; what counts as "stopped before
    generation" (the deadline's reach, the OpenAI answer's `input`) is read from the rows."""
    import dataclasses

    from imagegen import stage_table
    from jobs.api.openai.compat import stopped_at_input

    rows = stage_table.STAGES
    assert {name: row.holds for name, row in rows.items() if row.holds} == {
        "prompt": ("prompt", "rewrite"), "classify": ("image",)}
    assert stage_table.holds_before("generate") == ("prompt", "rewrite")
    settings.IMAGEGEN_USER_MAX_IN_REVIEW = 10
    job = _job(alice)
    before = _snapshot(job.id)
    with pytest.raises(LookupError, match="watermark"):
        actions.hold_for_review(_as_sent(str(job.id)), "watermark", "looks odd")
    assert _snapshot(job.id) == before
    assert actions.hold_for_review(_as_sent(str(job.id)), "prompt", "a heart")
    held = GenerationJob.objects.get(id=job.id)
    assert (held.stage, held.blocked_stage) == (JobStage.REVIEW, "prompt") and stopped_at_input(held)
    # A stage that declares a hold of its own can hold a job under it, and one declared before
    # generation counts as stopped at the input.
    monkeypatch.setitem(rows, "rewrite", dataclasses.replace(rows["rewrite"], holds=("watermark",)))
    assert stage_table.holds_before("generate") == ("prompt", "rewrite", "watermark")
    other = _job(alice)
    assert actions.hold_for_review(str(other.id), "watermark", "looks odd")
    assert stopped_at_input(GenerationJob.objects.get(id=other.id))


def test_a_batch_stage_put_after_classify_by_its_row_takes_the_batch_and_passes_it_on(alice, monkeypatch):
    """Issue 43, item 6: a batch stage between classify and publish is its row (classify's `next`
    names it, its own `next` names publish) and its function; the verdicts move the batch to it,
    and `pass_on` moves it on to publish, once: no move of its own in jobs/actions."""
    import dataclasses

    from imagegen import stage_table

    rows = stage_table.STAGES
    monkeypatch.setitem(rows, "watermark", stage_table.Stage(
        "watermark", "tests.stages.watermark", "QUEUE_IO", next="publish", leased=True, process="io",
        lease_setting="IMAGEGEN_LEASE_SECONDS", resend_setting="IMAGEGEN_STAGE_RESEND_SECONDS"))
    monkeypatch.setitem(rows, "classify", dataclasses.replace(rows["classify"], next="watermark"))
    batch = Batch.objects.create(model_version="tiny-random", width=64, height=64, steps=2, guidance_scale=5.0,
                                 size=1, cap=1, stage=BatchStage.CLASSIFY)
    job = _job(alice, JobStage.CLASSIFY, batch=batch, attempts=1)
    run = actions.start_stage(_as_sent(str(batch.id)), "classify")
    assert actions.record_verdicts(str(batch.id), run, [])
    assert Batch.objects.get(id=batch.id).stage == "watermark"
    assert GenerationJob.objects.get(id=job.id).stage == JobStage.PUBLISH  # its jobs wait for publish
    watermarking = actions.start_stage(_as_sent(str(batch.id)), "watermark")
    assert watermarking and actions.start_stage(str(batch.id), "watermark") is None  # a duplicate finds it held
    assert actions.pass_on(_as_sent(str(batch.id)), "watermark", watermarking)
    assert not actions.pass_on(str(batch.id), "watermark", watermarking)  # a stale or repeated run moves nothing
    moved = Batch.objects.get(id=batch.id)
    assert (moved.stage, moved.stage_run, moved.lease_expires_at) == (BatchStage.PUBLISH, "", None)
