"""Several `serve` processes sharing one database (docs/fleet.md): each keeps and forgets only its own worker and
instance rows, so a second instance starting does not erase what the first one serves."""

from __future__ import annotations

from inference.models import InstanceState, ModelInstance, Worker, WorkerState
from tests.fleet.fleet_processes import MODEL, load_model
from tests.inference.conftest import start_server  # noqa: F401
from tests.inference.serving import wait_for


def test_a_serve_starting_beside_another_leaves_the_other_ones_rows(start_server, stories_gguf_path):  # noqa: F811
    first = start_server()
    load_model(first, stories_gguf_path)
    second = start_server()  # starts after the first one's load: it forgets its own earlier run, not the first's
    load_model(second, stories_gguf_path)
    servers = {f"127.0.0.1:{server.port}" for server in (first, second)}

    def rows():
        instances = set(ModelInstance.objects.filter(served_name=MODEL, state=InstanceState.READY)
                        .values_list("server", flat=True))  # fmt: skip
        workers = set(Worker.objects.filter(device="cpu", state=WorkerState.READY).values_list("server", flat=True))
        return instances, workers

    wait_for(lambda: rows() == (servers, servers))  # a ready instance row and a ready cpu worker row for each serve
