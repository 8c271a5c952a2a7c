"""Fixtures of the fleet's tests (tests/fleet/fleet_processes.py): `start_fleet` starts routers and instances for a
module, and stops them when it is done; the instances share the test run's database (`serving_db`)."""

from __future__ import annotations

import pytest

from tests.fleet.fleet_processes import Fleet
from tests.inference.conftest import serving_db  # noqa: F401


@pytest.fixture(scope="module")
def start_fleet(serving_db, tmp_path_factory, stories_gguf_path):  # noqa: F811
    """`start_fleet(instances=2, routers=1, **env)`: that many routers on one Redis database, then that many
    instances registered with the first router, each serving the stories260K GGUF as "stories", once every router
    shows them all live. Returns the Fleet; everything stops at the end of the module."""
    fleets: list[Fleet] = []

    def start(instances: int = 2, routers: int = 1, load_options: dict | None = None, **env: str) -> Fleet:
        fleet = Fleet(tmp_path_factory, stories_gguf_path)
        fleets.append(fleet)
        for _ in range(routers):
            fleet.start_router(**env)
        fleet.start_instances(instances, fleet.routers[0], load_options=load_options, **env)
        for router in fleet.routers:
            fleet.wait_live(router, instances)
        return fleet

    yield start
    for fleet in fleets:
        fleet.stop()
