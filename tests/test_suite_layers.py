"""The suite's layers (tests/conftest.py): a unit test that starts a process or connects to
anything but the run's database and Redis fails its layer's check; each test lands in the layer
its fixtures and name say."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from tests.conftest import LayerViolation


def test_a_unit_test_cannot_start_a_process():
    with pytest.raises(LayerViolation, match="started a process"):
        subprocess.Popen(["true"])


def test_a_unit_test_cannot_connect_past_the_database_and_redis():
    with pytest.raises(LayerViolation, match="connected to"):
        socket.create_connection(("127.0.0.1", 9), timeout=1)


@pytest.mark.django_db
def test_a_unit_test_reaches_the_runs_database_and_redis(redis_client):
    from django.contrib.auth import get_user_model

    assert redis_client.set("layers-probe", "1") and redis_client.get("layers-probe") == "1"
    get_user_model().objects.create_user(username="layers-probe")
    assert get_user_model().objects.filter(username="layers-probe").count() == 1


@pytest.mark.integration
def test_an_integration_test_may_start_a_process():
    assert subprocess.run(["true"], check=False).returncode == 0


def test_each_layer_is_derived_from_what_the_test_uses(request):
    from tests.conftest import layer_of

    assert layer_of(request.node) == "unit"
    layers = {item.nodeid: layer_of(item) for item in request.session.items}
    for nodeid, layer in layers.items():  # whatever this run selected (make test-fast: the unit layer)
        if nodeid.endswith("::test_an_integration_test_may_start_a_process"):
            assert layer == "integration"
        if "tests/test_fleet.py::" in nodeid or "tests/test_run_command.py::" in nodeid:
            assert layer == "fault", nodeid
        if "tests/test_generation.py::" in nodeid:  # real workers
            assert layer == "integration", nodeid


@pytest.mark.django_db
def test_each_pytest_xdist_worker_has_its_own_var_folder_and_redis_database(settings):
    """`make test` runs three pytest-xdist workers (gw0-gw2): each prepares its own var folder and
    Redis database (so its own Celery queues); pytest-django gives each its own test database."""
    import os
    from pathlib import Path

    who = os.environ.get("PYTEST_XDIST_WORKER", "main")
    assert os.environ["IMAGEGEN_TEST_PREPARED"] == who
    assert Path(settings.VAR_DIR).name.startswith(f"imagegen-test-{who}-")
    assert str(settings.IMAGEGEN_MODEL_PATH).startswith(str(settings.VAR_DIR))
    given = json.loads(os.environ["IMAGEGEN_TEST_GIVEN_ENV"]).get("REDIS_URL")
    if given:  # a shared server: database 9 (IMAGEGEN_TEST_REDIS_DB) plus the worker's index
        index = int(who[2:]) if who.startswith("gw") else 0
        assert settings.REDIS_URL.rsplit("/", 1)[1] == str(int(os.environ.get("IMAGEGEN_TEST_REDIS_DB", "9")) + index)
    if who != "main":
        from django.db import connection

        assert who in str(connection.settings_dict["NAME"])


@pytest.mark.integration
def test_the_shared_workers_run_no_beat(workers):
    """No timer acts between a test's update and its check: the reaper runs only where a test
    asks for it (the `reaper` fixture)."""
    for worker in workers.values():
        assert "-B" not in worker.proc.args and worker.proc.poll() is None
