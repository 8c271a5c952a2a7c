"""`manage.py router` refuses to run in a way that could not work: without the fleet token (it would take
registrations from anyone, or from no one), or with a heartbeat no shorter than the timeout (every instance would be
dropped between two of its heartbeats)."""

from __future__ import annotations

import os

from tests.inference.serving import free_port, run_manage


def router_env(tmp_path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PANTHEON_REGISTRY", "PANTHEON_FLEET"))}
    return {**env, "PANTHEON_DATA_DIR": str(tmp_path), "PANTHEON_FLEET_REDIS_URL": "", **settings}


def test_the_router_needs_the_fleet_token(tmp_path):
    done = run_manage(router_env(tmp_path), "router", "--port", str(free_port()), timeout=60)
    assert done.returncode != 0
    assert "PANTHEON_FLEET_TOKEN" in done.stderr


def test_a_heartbeat_no_shorter_than_the_timeout_is_refused(tmp_path):
    env = router_env(tmp_path, PANTHEON_FLEET_TOKEN="t", PANTHEON_REGISTRY_HEARTBEAT_S="5",
                     PANTHEON_REGISTRY_TIMEOUT_S="5")  # fmt: skip
    done = run_manage(env, "router", "--port", str(free_port()), timeout=60)
    assert done.returncode != 0
    assert "PANTHEON_REGISTRY_HEARTBEAT_S must be above 0 and below PANTHEON_REGISTRY_TIMEOUT_S" in done.stderr
