"""Migration 0015 places the jobs in flight at the stage their fields implied before the stage
was one field (issue 43, item 2): run on a scratch SQLite database of its own, populated at
0014, in a process of its own (the suite's databases are already migrated)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import json, os, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")
django.setup()
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

call_command("migrate", "jobs", "0014", verbosity=0)
call_command("migrate", "safety", verbosity=0)
apps = MigrationExecutor(connection).loader.project_state(("jobs", "0014_job_steering")).apps
Job, Batch = apps.get_model("jobs", "GenerationJob"), apps.get_model("jobs", "Batch")
Verdict, User = apps.get_model("safety", "SafetyVerdict"), apps.get_model("auth", "User")
owner, now = User.objects.create(username="placed"), timezone.now()

def job(**fields):
    return Job.objects.create(owner=owner, prompt="a red circle", width=64, height=64, steps=2, guidance_scale=5.0,
                              seed=1, model_version="v", **fields).id

def batch(stage):
    return Batch.objects.create(model_version="v", width=64, height=64, steps=2, guidance_scale=5.0, size=1, cap=1,
                                stage=stage)

expected = {
    job(status="done"): "done", job(status="blocked"): "blocked", job(status="review"): "review",
    job(status="running", batch=batch("generate")): "generate",
    job(status="running", batch=batch("classify")): "classify",
    job(status="running", batch=batch("publish")): "publish",
    job(status="queued", scheduled_at=now, cache_reveal_at=now): "reveal",
    job(status="queued", scheduled_at=now): "waiting_gpu",
    job(status="queued", rewrite=True, rewritten_at=now, revised_prompt="a red disc"): "rewrite_check",
    job(status="queued"): "prompt",
}
allowed, drained, approved = job(status="queued", rewrite=True), job(status="queued", rewrite=True), job(status="queued", rewrite=True)
Verdict.objects.create(job_id=allowed, stage="prompt", decision="allow")
Verdict.objects.create(job_id=drained, stage="prompt", decision="block")  # recorded by a drain, not applied
Verdict.objects.create(job_id=approved, stage="human", decision="allow")
expected.update({allowed: "rewrite", drained: "prompt", approved: "rewrite"})

call_command("migrate", "jobs", verbosity=0)
from jobs.models import GenerationJob, status_of
placed = {str(j.id): (j.stage, j.status) for j in GenerationJob.objects.all()}
print(json.dumps({"expected": {str(k): v for k, v in expected.items()}, "placed": placed,
                  "status_of": {stage: status_of(stage) for stage, _ in placed.values()}}))
'''


@pytest.mark.integration
def test_migration_0015_places_each_job_in_flight_at_its_stage(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'placed.sqlite3'}", IMAGEGEN_VAR_DIR=str(tmp_path / "var"),
               PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    placed = {job: stage for job, (stage, _) in result["placed"].items()}
    assert placed == result["expected"]
    assert all(status == result["status_of"][stage] for stage, status in result["placed"].values())
