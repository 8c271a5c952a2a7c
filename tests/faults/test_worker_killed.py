"""A worker killed (SIGKILL) in the middle of a load, and in the middle of a weights commit (docs/reliability.md):
no request hangs, each gets a clear error, and afterwards the catalogue, the instance rows and the weights barrier
agree with what is served."""

from __future__ import annotations

import os
import signal
import threading

import httpx
import pytest

from inference.models import CatalogModel, ModelInstance
from tests.inference.serving import wait_for
from tests.weights.weights_calls import Holder, greedy, load_attachable, status, weights_call

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def server(start_server):
    """A server whose supervisor waits long for a silent worker: here the test, not the heartbeat, kills it."""
    return start_server(PANTHEON_WORKER_HEARTBEAT_TIMEOUT_S="300")


def test_a_worker_killed_during_a_load_fails_the_load_and_leaves_nothing_half_recorded(server, api, stories_hf_dir):
    """The worker is stopped (SIGSTOP) before the load is asked for, so the load is held in flight at the worker
    for as long as the test needs (once the LOAD is sent, an unload of the name answers 409: it is loading), then
    killed (SIGKILL): the control plane sees what it sees of a worker dying in the middle of a load. (The load's
    admission asks the stopped worker for its memory first and goes on without an answer after 10 s.)"""
    api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "stories"}).raise_for_status()
    [pid] = server.worker_pids()
    second = {"path": str(stories_hf_dir), "name": "second"}
    result = {}

    def load():
        with httpx.Client(base_url=server.url, timeout=120, headers=api.headers) as client:
            result["load"] = client.post("/admin/models/load", json=second)

    os.kill(pid, signal.SIGSTOP)
    thread = threading.Thread(target=load)
    thread.start()
    wait_for(lambda: api.post("/admin/models/unload", json={"name": "second"}).status_code == 409, timeout=60)
    os.kill(pid, signal.SIGKILL)
    thread.join(120)  # a hang guard: the answer comes when the crash is seen
    assert not thread.is_alive()
    refused = result["load"]
    assert refused.status_code == 500, refused.text
    assert refused.json()["error"]["type"] == "load_failed", refused.text

    # The worker is back with the model it served; the load that died is in no row.
    wait_for(lambda: [p for p in server.worker_pids() if p != pid], timeout=30)
    wait_for(lambda: api.post("/v1/chat/completions", json=CHAT).status_code == 200, timeout=60, interval=0.2)
    assert [row["id"] for row in api.get("/admin/models").json()["data"]] == ["stories"]
    assert not CatalogModel.objects.filter(name="second").exists()
    rows = lambda: list(ModelInstance.objects.values_list("served_name", "state"))  # noqa: E731
    wait_for(lambda: rows() == [("stories", "ready")], timeout=30)  # the mirror's next sync after the reload
    api.post("/admin/models/load", json=second).raise_for_status()  # and the same load now goes through


CHAT = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 4}


def test_a_worker_killed_during_a_commit_ends_the_commit_clearly_and_the_barrier_is_clean_after(
    server, api, stories_hf_dir
):
    holder = Holder(server, load_attachable(api, stories_hf_dir))
    holder.attach()
    assert holder.ok("quiesce")["weights_state"] == "clean"
    holder.ok("commit-begin")
    assert status(server)["weights_state"] == "writing"
    [pid] = server.worker_pids()
    os.kill(pid, signal.SIGKILL)

    ended = holder.call("commit-end")  # the commit died with the worker: refused at once, in the envelope
    assert ended.error[:2] in {(400, "MODEL_NOT_LOADED"), (409, "NOT_ATTACHED")}, ended.body
    wait_for(lambda: [p for p in server.worker_pids() if p != pid], timeout=30)
    wait_for(lambda: weights_call(server, "status?model=stories", method="GET").status == 200, timeout=60)
    after = status(server)
    assert after["weights_state"] == "clean" and after["attachment"] is None, after
    assert greedy(server.url).status_code == 200
    holder.attachment_id = None
    holder.attach()  # a trainer starts over on the weights the restarted worker serves
    holder.detach()
