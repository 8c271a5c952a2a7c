"""Worker rows a dead serve left behind are marked dead by the periodic work; a running serve's rows never are."""

import os
import signal
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from inference.models import CatalogModel, InstanceState, ModelInstance, Worker, WorkerState
from inference.runtime.control_plane import HEARTBEAT_RECORD_S
from inference.services.stale_workers import mark_stale_workers
from pantheon_site.models import AuditEvent
from tests.inference.serving import wait_for

STALE_AFTER_S = 60.0


def _worker(device: str, state: str, *, age_s: float) -> Worker:
    worker = Worker.objects.create(device=device, state=state, pid=4242)
    Worker.objects.filter(pk=worker.pk).update(updated_at=timezone.now() - timedelta(seconds=age_s))
    return Worker.objects.get(pk=worker.pk)


@pytest.mark.django_db
def test_rows_nobody_rewrote_are_marked_dead_with_their_instances_failed(stories_gguf_path):
    stale = _worker("cuda:0", WorkerState.READY, age_s=STALE_AFTER_S * 2)
    _worker("cuda:1", WorkerState.STARTING, age_s=STALE_AFTER_S * 2)
    fresh = _worker("cpu", WorkerState.READY, age_s=1)
    _worker("cuda:2", WorkerState.STOPPED, age_s=STALE_AFTER_S * 10)
    model = CatalogModel.objects.create(name="stories", path=str(stories_gguf_path), format="gguf")
    served = ModelInstance.objects.create(catalog=model, served_name="stories", worker=stale, device="cuda:0",
                                          state=InstanceState.READY)  # fmt: skip
    elsewhere = ModelInstance.objects.create(catalog=model, served_name="stories", worker=fresh, device="cpu",
                                             state=InstanceState.READY)  # fmt: skip
    assert sorted(mark_stale_workers(STALE_AFTER_S)) == ["cuda:0", "cuda:1"]
    states = dict(Worker.objects.values_list("device", "state"))
    assert states == {"cuda:0": "dead", "cuda:1": "dead", "cpu": "ready", "cuda:2": "stopped"}
    served.refresh_from_db()
    assert served.state == InstanceState.FAILED and "cuda:0" in served.last_error
    assert ModelInstance.objects.get(pk=elsewhere.pk).state == InstanceState.READY
    events = AuditEvent.objects.filter(operation="worker_marked_dead").order_by("id")
    assert [(e.details["device"], e.details["instances"]) for e in events] == [("cuda:0", ["stories"]),
                                                                              ("cuda:1", [])]  # fmt: skip
    assert mark_stale_workers(STALE_AFTER_S) == []  # once


@pytest.mark.django_db
def test_a_threshold_a_running_serve_could_miss_is_refused():
    with pytest.raises(ValueError, match="must exceed"):
        mark_stale_workers(HEARTBEAT_RECORD_S)


@pytest.mark.django_db(transaction=True)
def test_a_running_serves_rows_are_never_marked_but_a_killed_serves_are(start_server):
    # The worker is stopped (SIGSTOP): its heartbeats stop, and the supervisor, told to wait 600 s, leaves it be.
    # The serve still vouches for its row, so a threshold just above the serve's rewrite period never marks it.
    # Once the serve is killed (-9, no shutdown), nobody vouches for the row: it is marked dead.
    server = start_server(PANTHEON_WORKER_HEARTBEAT_TIMEOUT_S="600")
    worker = wait_for(lambda: Worker.objects.filter(device="cpu", state=WorkerState.READY).first(), timeout=120)
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        threshold = HEARTBEAT_RECORD_S + 3.0
        deadline = time.monotonic() + 2 * threshold
        while time.monotonic() < deadline:
            assert mark_stale_workers(threshold) == []
            time.sleep(0.5)
        assert Worker.objects.get(device="cpu").state == WorkerState.READY
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    assert server.process.poll() is None
    server.process.kill()
    server.process.wait()
    os.kill(worker.pid, signal.SIGKILL)
    assert wait_for(lambda: mark_stale_workers(threshold), timeout=4 * threshold) == ["cpu"]
    assert Worker.objects.get(device="cpu").state == WorkerState.DEAD
