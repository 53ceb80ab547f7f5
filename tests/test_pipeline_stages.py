"""The pipeline as routed stages (check_prompt -> run_batch -> classify_batch -> publish_batch),
through real workers on real queues: every stage hands over ids only, quarantine first, one
layer owning job state, and a stuck stage re-run by the reaper."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from tests.conftest import admitted_to, wait_for_status

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.django_db(transaction=True)


def submit(api, prompt: str, **extra) -> str:
    body = {"prompt": prompt, "width": 64, "height": 64, "steps": 4, "seed": 5, **extra}
    response = api.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 202, response.content
    return response.json()["id"]


def wait_for_batch_stage(job_id, stage: str, timeout: float = 60.0):
    from jobs.models import GenerationJob

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = GenerationJob.objects.select_related("batch").get(id=job_id)
        if job.batch is not None and job.batch.stage == stage:
            return job.batch
        time.sleep(0.05)
    raise AssertionError(f"job {job_id}'s batch never reached {stage}: job {job.status} {job.reason!r}, "
                         f"batch {job.batch.stage if job.batch else None}")


# --- one layer writes the rows ---

_STATE_MODELS = {"GenerationJob", "Batch", "GeneratedImage", "SafetyVerdict"}
_WRITES = {"create", "update", "bulk_create", "bulk_update", "get_or_create", "update_or_create", "delete"}


def _chain_root(node) -> str | None:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def test_every_write_of_job_batch_image_and_verdict_rows_is_in_jobs_actions():
    """`.objects....create/update/bulk_*/delete` of GenerationJob, Batch, GeneratedImage and
    SafetyVerdict, and `.save(` of instances named after them, happen only in jobs/actions
    (and the migrations)."""
    offenders = []
    for path in _project_sources():
        rel = path.relative_to(ROOT)
        if rel.parts[:2] == ("jobs", "actions"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            name = node.func.attr
            if name in _WRITES and "objects" in ast.unparse(node.func) and _chain_root(node.func) in _STATE_MODELS:
                offenders.append(f"{rel}:{node.lineno} {ast.unparse(node.func)[:60]}")
            if name == "save" and isinstance(node.func.value, ast.Name) and node.func.value.id in {"job", "batch", "image", "verdict"}:
                offenders.append(f"{rel}:{node.lineno} {node.func.value.id}.save")
    assert offenders == []


# --- routing ---


def test_every_stage_task_has_one_queue_in_the_routing_table_and_lanes_pick_theirs():
    from imagegen.stage_table import route

    assert route("jobs.pipeline.tasks.check_prompt", ["j"], {}, {}) == {"queue": settings.QUEUE_CPU}
    assert route("gpu_tasks.tasks.run_batch", ["shapes"], {}, {}) == {"queue": f"{settings.QUEUE_GPU_PREFIX}shapes"}
    assert route("jobs.pipeline.tasks.classify_batch", ["shapes@v2", "b"], {}, {}) == {"queue": settings.QUEUE_CLASSIFY}
    assert route("jobs.pipeline.tasks.publish_batch", ["shapes", "b"], {}, {}) == {"queue": settings.QUEUE_IO}
    with pytest.raises(ValueError, match="lane"):
        route("gpu_tasks.tasks.run_batch", [], {}, {})


def test_no_call_site_names_a_queue():
    """One routing table: `queue=` never appears where a task is sent (asking the broker how
    deep a queue is, a passive `queue_declare`, sends nothing)."""
    offenders = []
    for path in _project_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "queue_declare":
                continue
            if isinstance(node, ast.Call) and any(k.arg == "queue" for k in node.keywords):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def _project_sources():
    for package in ("imagegen", "jobs", "safety", "gpu_tasks", "scheduling"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


# --- structure ---


def test_no_module_imports_itself_through_others():
    """No import cycle between the project's modules, counting imports inside functions (an
    import moved into a function to dodge a circle is still a circle)."""
    import grimp

    graph = grimp.build_graph("imagegen", "jobs", "safety", "gpu_tasks", "scheduling", include_external_packages=False)
    modules = sorted(m for m in graph.modules if ".migrations" not in m)
    cycles = []
    for module in modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != module and graph.chain_exists(importer=imported, imported=module):
                cycles.append(f"{module} <-> {imported}")
    assert cycles == []


def test_each_stage_is_described_in_one_place_that_the_table_and_the_actions_read():
    """How a failure reason names a stage ("the image safety check was interrupted 3 times") is
    written once, in the stage table's row (imagegen/stage_table.py, below every layer that
    fails a stage), and nowhere else."""
    from imagegen.stage_table import STAGES

    described = {name: stage.describes for name, stage in STAGES.items() if stage.describes}
    assert set(described) == {"rewrite", "generate", "classify", "publish"}
    sources = [p for p in _project_sources() if p.name != "stage_table.py"]
    for words in described.values():
        copies = [str(p.relative_to(ROOT)) for p in sources if f'"{words}"' in p.read_text()]
        assert copies == [], f"{words!r} is written again in {copies}"


def test_no_task_is_sent_by_a_name_of_its_own_outside_the_table():
    """The scheduler's wake-up, the rewrite token and the webhook outbox dispatch through the
    table's rows (they named their tasks themselves); only the table holds a stage's task name."""
    from imagegen.stage_table import STAGES

    offenders = []
    for path in _project_sources():
        if path.name == "stage_table.py":
            continue
        text = path.read_text()
        offenders += [f"{path.relative_to(ROOT)}: {stage.task}" for stage in STAGES.values()
                      if f'"{stage.task}"' in text]
    assert offenders == []


def test_the_import_layers_hold():
    result = subprocess.run([str(Path(sys.executable).parent / "lint-imports")], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]


def test_only_the_storage_module_writes_to_public_storage():
    """Quarantine first, structurally: generated bytes reach public storage only through
    jobs.media.storage.publish_object (the publish stage, or a moderator's approval)."""
    offenders = []
    for path in _project_sources():
        if path == ROOT / "jobs" / "media" / "storage.py":
            continue
        text = path.read_text()
        for needle in ("public_storage().save", "default_storage.save", 'storages["default"].save', "store_bytes("):
            if needle in text:
                offenders.append(f"{path.relative_to(ROOT)}: {needle}")
    assert offenders == []


def test_job_status_is_written_only_by_jobs_actions():
    """Every write of a job's status, reason, lease or an image's tier is in jobs/actions."""
    offenders = []
    for path in _project_sources():
        if "actions" in path.relative_to(ROOT).parts or path.name == "models.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update":
                written = {k.arg for k in node.keywords}
                if written & {"status", "reason", "lease_expires_at", "tier", "stage"}:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} writes {sorted(written)}")
    assert offenders == []


# --- through the stages ---


def test_a_job_passes_every_stage_and_is_done(workers, alice_api):
    from jobs.models import BatchStage, GenerationJob
    from safety.models import SafetyVerdict

    job_id = submit(alice_api, "a red circle on a blue background", count=2)
    job = wait_for_status(job_id, ("done",))
    assert job.batch.stage == BatchStage.DONE and job.batch.pass_started_at and job.batch.finished_at
    images = list(job.images.order_by("index"))
    assert [im.tier for im in images] == ["public", "public"]
    assert all(im.batch_id == job.batch_id for im in images)
    verdicts = SafetyVerdict.objects.filter(job_id=job_id, stage="image")
    assert sorted(v.image_id for v in verdicts) == sorted(im.id for im in images)
    from jobs.media.storage import public_storage, quarantine_storage

    for image in images:
        assert public_storage().exists(image.storage_key)
        assert not quarantine_storage().exists(image.storage_key)  # moved, not copied
    assert GenerationJob.objects.get(id=job_id).lease_expires_at is None


def test_the_next_batch_is_taken_while_the_current_one_denoises(workers, alice_api):
    from jobs.models import Batch, GenerationJob

    ids = [submit(alice_api, f"a green square {i}", seed=100 + i, steps=12) for i in range(8)]  # two passes of 4
    for job_id in ids:
        wait_for_status(job_id, ("done",), timeout=120)
    batches = sorted(Batch.objects.filter(id__in=set(GenerationJob.objects.filter(id__in=ids).values_list("batch_id", flat=True))),
                     key=lambda b: b.pass_started_at)
    assert len(batches) >= 2
    first, second = batches[0], batches[1]
    assert second.started_at < first.finished_at  # taken and claimed during the first pass
    assert (second.pass_started_at - first.finished_at).total_seconds() < 0.25


def test_a_blocked_image_never_reaches_public_storage(workers, alice_api, classifier_mode):
    from jobs.media.storage import public_storage, quarantine_storage

    classifier_mode('json:{"star": 0.99}')
    job = wait_for_status(submit(alice_api, "a yellow circle", seed=77), ("blocked",))
    assert job.blocked_stage == "image", job.reason
    image = job.images.get()
    assert image.tier == "quarantine"
    assert quarantine_storage().exists(image.storage_key)
    assert not public_storage().exists(image.storage_key)


def test_killing_the_classify_worker_mid_batch_loses_nothing_and_delivers_each_image_once(
    workers, reaper, start_worker, alice_api, classifier_mode
):
    """This lane's batches are classified by a worker of their own (a classify queue nobody
    else consumes), killed while the gate hangs; the reaper re-runs the stage (on the session's
    classify queue) and the job is delivered once."""

    from imagegen import metrics
    from jobs.models import Batch, GeneratedImage

    def reruns() -> float:
        return metrics.read_counters().get("imagegen_stage_reruns_total", {}).get('{"stage": "classify"}', 0.0)

    before = reruns()
    lane = "classifykill"
    # The victim's gate waits as long as the hang lasts: it must still hold the batch when killed.
    env = {"IMAGEGEN_MODEL_NAME": lane, "IMAGEGEN_QUEUE_CLASSIFY": "classify-victim", "IMAGEGEN_CLASSIFIER_TIMEOUT": "600"}
    gpu = start_worker("gpu-classifykill", f"{settings.QUEUE_GPU_PREFIX}{lane}", **env)
    victim = start_worker("classify-victim", "classify-victim", **env)
    classifier_mode("hang")
    with admitted_to(lane):
        job_id = submit(alice_api, "a blue circle", count=2, seed=31)
        batch = wait_for_batch_stage(job_id, "classify")
        deadline = time.monotonic() + 120
        while not Batch.objects.filter(id=batch.id, stage="classify", stage_started_at__isnull=False).exists():
            # the victim started the stage (holds its lease), and hangs in the gate
            assert time.monotonic() < deadline, "the classify worker never started the batch"
            time.sleep(0.05)
        victim.kill()
        classifier_mode(None)
        job = wait_for_status(job_id, ("done",), timeout=90)
    batch.refresh_from_db()
    assert batch.stage == "done" and reruns() >= before + 1
    images = list(GeneratedImage.objects.filter(job_id=job_id))
    assert sorted(im.index for im in images) == [0, 1]
    assert len({im.storage_key for im in images}) == 2
    assert job.verdicts.filter(stage="image").count() == 2
    gpu.stop()


def test_a_publish_that_dies_after_copying_and_before_committing_is_finished_once_by_the_reaper(
    workers, reaper, start_worker, alice_api, monkeypatch, redis_client
):
    """This lane's publish messages go to a queue nobody consumes; this process publishes and
    dies between the copy to public storage and the transaction. The reaper re-runs the stage
    (on the session's io worker), which finds the public copies and finishes once."""

    from jobs import actions
    from jobs.media.storage import public_storage
    from jobs.models import GeneratedImage, GenerationJob
    from jobs.pipeline import publish

    lane = "publishcrash"
    env = {"IMAGEGEN_MODEL_NAME": lane, "IMAGEGEN_QUEUE_IO": "io-nobody", "IMAGEGEN_QUEUE_CLASSIFY": "classify-crash"}
    gpu = start_worker("gpu-publishcrash", f"{settings.QUEUE_GPU_PREFIX}{lane},classify-crash", **env)
    with admitted_to(lane):
        job_id = submit(alice_api, "a white square", seed=41, count=2)
    batch = wait_for_batch_stage(job_id, "publish")

    def die(*args, **kwargs):
        raise SystemExit("the io worker was killed")

    monkeypatch.setattr(actions, "finish_batch", die)
    with pytest.raises(SystemExit):
        publish.publish(str(batch.id))
    monkeypatch.undo()
    keys = list(GeneratedImage.objects.filter(job_id=job_id).values_list("storage_key", "tier"))
    assert all(tier == "quarantine" for _, tier in keys)  # not delivered: the transaction never ran
    assert all(public_storage().exists(key) for key, _ in keys)  # the bytes were copied
    job = wait_for_status(job_id, ("done",), timeout=60)
    batch.refresh_from_db()
    assert batch.stage == "done" and batch.stage_attempts == 1
    images = list(job.images.order_by("index"))
    assert [im.tier for im in images] == ["public", "public"] and len({im.storage_key for im in images}) == 2
    assert GenerationJob.objects.get(id=job_id).status == "done"
    redis_client.delete("io-nobody")
    gpu.stop()


# --- on a real S3 server ---


def _submit_to_lane(api, lane: str, prompt: str, **extra) -> str:
    with admitted_to(lane):
        return submit(api, prompt, **extra)


def _bucket_keys(server, bucket: str) -> set[str]:
    return {o["Key"] for o in server.client().list_objects_v2(Bucket=bucket).get("Contents", [])}


def test_on_s3_a_blocked_image_never_appears_in_the_public_bucket(seaweed, s3_gpu_worker, alice_api, classifier_mode):
    from jobs.models import GenerationJob
    from tests.s3_fixtures import S3_MODEL_NAME
    from tests.s3_server import PUBLIC_BUCKET, QUARANTINE_BUCKET

    classifier_mode('json:{"star": 0.99}')
    job_id = _submit_to_lane(alice_api, S3_MODEL_NAME, "a yellow circle", seed=88)
    listed: set[str] = set()
    deadline = time.monotonic() + 90
    while GenerationJob.objects.get(id=job_id).status in ("queued", "running"):
        assert time.monotonic() < deadline, "the job did not finish"
        listed |= _bucket_keys(seaweed, PUBLIC_BUCKET)  # watched the whole time, not only at the end
        time.sleep(0.05)
    job = GenerationJob.objects.get(id=job_id)
    assert job.status == "blocked", job.reason
    key = job.images.get().storage_key
    assert key not in listed | _bucket_keys(seaweed, PUBLIC_BUCKET)
    assert key in _bucket_keys(seaweed, QUARANTINE_BUCKET)


def test_on_s3_publish_with_the_store_down_retries_and_then_delivers(seaweed, start_worker, workers, alice_api):
    """The batch is judged while S3 is up; S3 goes down before it is published; the publish
    stage retries (the reaper does not count it as lost) and delivers once S3 is back."""
    import urllib.request

    from jobs.models import GenerationJob
    from tests.s3_fixtures import s3_env
    from tests.s3_server import PUBLIC_BUCKET

    lane, io_queue = "s3later", "io-s3-later"
    env = {"IMAGEGEN_MODEL_NAME": lane, "IMAGEGEN_QUEUE_IO": io_queue, "IMAGEGEN_QUEUE_CLASSIFY": "classify-s3later",
           **s3_env(seaweed)}
    gpu = start_worker("gpu-s3later", f"{settings.QUEUE_GPU_PREFIX}{lane},classify-s3later", **env)
    job_id = _submit_to_lane(alice_api, lane, "a red square", seed=91, count=2)
    wait_for_batch_stage(job_id, "publish", timeout=90)
    seaweed.stop()
    io = start_worker("io-s3later", io_queue, **env)
    try:
        deadline = time.monotonic() + 120
        while b"retrying" not in io.log_path.read_bytes():
            assert time.monotonic() < deadline, "publish did not retry"
            time.sleep(0.2)
        assert GenerationJob.objects.get(id=job_id).status == "running"
    finally:
        seaweed.start()
    job = wait_for_status(job_id, ("done",), timeout=120)
    assert job.batch.stage_attempts == 0  # retried in place, not re-run by the reaper
    keys = {im.storage_key for im in job.images.all()}
    assert len(keys) == 2 and keys <= _bucket_keys(seaweed, PUBLIC_BUCKET)
    for key in keys:
        with urllib.request.urlopen(f"{seaweed.endpoint}/{PUBLIC_BUCKET}/{key}", timeout=10) as r:
            assert r.status == 200 and r.read(8) == b"\x89PNG\r\n\x1a\n"
    gpu.stop()
    io.stop()
