"""The control plane `serve` runs: its supervisor is the one the PANTHEON_WORKER_* settings describe, and the loads it
starts itself (on demand, at start) are audited like an operator's."""

import pytest
from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.test import override_settings

from inference.runtime import supervisor as supervisor_module
from inference.runtime.control_plane import ControlPlane
from inference.services.model_lifecycle import load_catalogued
from pantheon_site.errors import ModelNotFound
from pantheon_site.models import AuditEvent

WORKER_SETTINGS = {
    "PANTHEON_WORKER_DEVICES": ["cpu"],
    "PANTHEON_WORKER_HEARTBEAT_INTERVAL_S": 0.25,
    "PANTHEON_WORKER_HEARTBEAT_TIMEOUT_S": 3.5,
    "PANTHEON_WORKER_START_TIMEOUT_S": 12.0,
    "PANTHEON_WORKER_RESTART_BACKOFF_S": 0.3,
    "PANTHEON_WORKER_RESTART_BACKOFF_MAX_S": 4.0,
}


@pytest.fixture
async def plane():
    with override_settings(**WORKER_SETTINGS):
        plane = ControlPlane(load_catalogued)
    yield plane
    await plane.client.close()


async def test_the_supervisor_follows_the_worker_settings(plane, monkeypatch):
    supervisor = plane.supervisor
    assert supervisor.devices == ["cpu"] and supervisor.on_crash == plane._on_crash
    assert (supervisor.heartbeat_interval, supervisor.heartbeat_timeout, supervisor.ready_timeout) == (0.25, 3.5, 12.0)
    assert (supervisor.backoff_initial, supervisor.backoff_max) == (0.3, 4.0)
    # The worker it starts is told to beat at that interval.
    started = []
    monkeypatch.setattr(supervisor_module.subprocess, "Popen", lambda command, **kwargs: started.append(command))
    supervisor._spawn("cpu")
    [command] = started
    assert command[command.index("--heartbeat-interval") + 1] == "0.25"


@pytest.mark.django_db(transaction=True)
async def test_a_load_of_a_name_the_catalogue_lacks_is_audited_as_the_systems_refusal(plane):
    with pytest.raises(ModelNotFound):
        await plane.load_on_demand("ghost")

    def events():
        fields = ("operation", "outcome", "error_type", "reason", "actor_kind", "actor_label", "model")
        found = list(AuditEvent.objects.values_list(*fields))
        close_old_connections()
        return found

    assert await sync_to_async(events)() == [
        ("model_load", "refused", "model_not_found", "not_catalogued", "system", "on_demand", "ghost")
    ]
