"""The suite's layers (tests/conftest.py): a unit test that starts a process or connects to
anything but the run's database and Redis fails its layer's check; each test lands in the layer
its fixtures and name say."""

from __future__ import annotations

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
