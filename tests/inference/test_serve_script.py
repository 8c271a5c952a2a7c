"""The README's `./scripts/serve`, run twice as a new user would: the first run catalogues and serves the demo model
without a word about "no server", the second serves it again without a second load, and neither prints a traceback,
however long the catalogue's listing is."""

import httpx
import pytest

from inference.engine.contract.checkpoint import Checkpoint
from inference.engine.contract.params import LoadOptions
from inference.models import CatalogModel
from inference.services.catalogue import do_catalogue_model
from pantheon_site.models import AuditEvent
from tests.inference.serving import PantheonServer, serving_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# Catalogue rows listed after `demo`, enough that the listing outgrows a pipe's buffer: a reader that stops at
# `demo` leaves list_models writing into a closed pipe.
LISTED_AFTER_DEMO = 600


def served(server):
    return [m["id"] for m in httpx.get(server.url + "/v1/models", timeout=10).json()["data"]]


def test_serve_twice_loads_the_demo_once_and_prints_no_traceback(tmp_path, stories_gguf_path):
    for n in range(LISTED_AFTER_DEMO):
        checkpoint = Checkpoint(str(stories_gguf_path), "gguf", "llama", 1)
        do_catalogue_model(f"zz-{n:04d}-{'x' * 80}", checkpoint, LoadOptions())
    CatalogModel.objects.filter(name__startswith="zz-").update(autoload=False)
    env = serving_env(tmp_path)
    logs = []
    for _ in range(2):
        server = PantheonServer(tmp_path, env, script=True).start()
        try:
            wait_for(lambda server=server: served(server) == ["demo"], timeout=120)
        finally:
            server.stop()
        logs.append(server.log())
    for log in logs:
        assert "Traceback" not in log and "Error" not in log, log
        assert "No server is running" not in log, log
    assert "Cataloguing the demo model" in logs[0] and "Cataloguing" not in logs[1]
    catalogued = AuditEvent.objects.filter(operation="model_load", actor_kind="cli")
    assert [e.model for e in catalogued] == ["demo"]
