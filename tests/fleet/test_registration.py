"""A serve instance's side of the fleet (inference/runtime/registration.py, docs/fleet.md): it serves while its router
is away and registers once the router comes; it registers again when the registry forgot it; a model loaded later
is registered and an unloaded one dropped; and the router's fleet token opens the session export and restore routes
to it (the affinity's moves of a session's KV)."""

from __future__ import annotations

import httpx
import pytest
import redis

from pantheon_site.models import AuditEvent
from tests.fleet.fleet_processes import FLEET_TOKEN, MODEL, Fleet, instance_id, load_model
from tests.inference.serving import bearer, free_port, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FLEET_HEADER = "X-Pantheon-Fleet-Token"


@pytest.fixture(scope="module")
def late_router(serving_db, tmp_path_factory, stories_gguf_path):
    """One instance whose router was not running when it started (its URL named a port nothing listened on), and
    the router started on that port once the instance served."""
    fleet = Fleet(tmp_path_factory, stories_gguf_path)
    port = free_port()
    (instance,) = fleet.start_instances(1, f"http://127.0.0.1:{port}")
    completion = {"model": MODEL, "prompt": "Once", "max_tokens": 2}
    served_alone = httpx.post(instance.url + "/v1/completions", json=completion, timeout=60).status_code
    router = fleet.start_router(port=port)
    fleet.wait_live(router, 1)
    yield fleet, served_alone
    fleet.stop()


def test_an_instance_serves_while_its_router_is_away_and_registers_when_it_comes(late_router):
    fleet, served_alone = late_router
    assert served_alone == 200
    log = fleet.instances[0].log()
    assert log.count("cannot be reached") == 1  # once per outage, not once per heartbeat
    assert log.count("is reachable again") == 1


def test_an_instance_the_registry_forgot_registers_again(late_router):
    fleet, _ = late_router
    store = redis.Redis.from_url(fleet.redis_url)
    try:
        store.delete(f"pantheon:fleet:instance:{instance_id(fleet.instances[0])}")
    finally:
        store.close()
    fleet.wait_live(fleet.routers[0], 1)  # its next heartbeat is refused as unknown, and it registers


def test_a_model_loaded_later_is_registered_and_an_unloaded_one_dropped(late_router):
    fleet, _ = late_router
    (instance,), router = fleet.instances, fleet.routers[0]
    load_model(instance, fleet.gguf, "stories-b")
    assert fleet.wait_live(router, 1, "stories-b")["context_window"]
    secret = instance.run_file()["admin_secret"]
    answer = httpx.post(instance.url + "/admin/models/unload", json={"name": "stories-b"}, headers=bearer(secret))
    assert answer.status_code == 200
    wait_for(lambda: "stories-b" not in router.models())
    assert router.models()[MODEL]["live"] == 1


def test_the_fleet_token_is_the_routers_identity_for_session_export_and_restore(late_router):
    fleet, _ = late_router
    instance = fleet.instances[0]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Once"}], "max_tokens": 4, "session_id": "s1"}
    assert httpx.post(instance.url + "/v1/chat/completions", json=chat, timeout=60).status_code == 200
    target = {"name": MODEL, "session_id": "s1"}

    for headers in ({}, {FLEET_HEADER: "not-the-fleet-token"}):
        refused = httpx.post(instance.url + "/admin/session/export", json=target, headers=headers)
        assert refused.status_code == 401
    exported = httpx.post(instance.url + "/admin/session/export", json=target, headers={FLEET_HEADER: FLEET_TOKEN})
    assert exported.status_code == 200
    event = AuditEvent.objects.filter(operation="session_export", outcome="accepted").get()
    assert (event.actor_kind, event.actor_label) == ("system", "router")

    export = exported.json()
    restore = {"name": MODEL, "session_id": "s2", "blob": export["blob_b64"], "tokens": export["tokens"]}
    refused = httpx.post(instance.url + "/session/restore", json=restore, headers={FLEET_HEADER: "wrong"})
    assert refused.status_code == 401
    restored = httpx.post(instance.url + "/session/restore", json=restore, headers={FLEET_HEADER: FLEET_TOKEN})
    assert restored.status_code == 200, restored.text
