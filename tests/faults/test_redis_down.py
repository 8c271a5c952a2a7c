"""Redis stopped under a serving server with REDIS_URL set, then started again (docs/reliability.md).

REDIS_URL makes Redis the Channels layer and the Celery broker (pantheon_site/settings.py). The serving routes send
to neither, so nothing a user or an operator does there notices an outage: every route answers as before, the log
holds no traceback, and nothing needs Redis back to recover. The batch queue does need it: a batch created while
Redis is down cannot be sent to a Celery worker, and a Redis without persistence comes back empty; the batch is not
lost, because the sweep (batches.resume_batches, on beat) finds every active batch no task runs (docs/batches.md)."""

from __future__ import annotations

import httpx
import pytest
from kombu.exceptions import OperationalError
from redis import Redis

from batches.models import BatchStatus
from tests.batches.runner_batches import CeleryWorker, chat_line, ended, make_batch, output_lines, send_task, worker_env
from tests.faults.private_services import PrivateRedis
from tests.faults.test_database_down import ChatLoad
from tests.inference.serving import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    server = PrivateRedis(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server(start_server, redis):
    return start_server(REDIS_URL=redis.url)


def test_redis_down_changes_nothing_a_client_or_an_operator_sees(server, api, redis, stories_hf_dir):
    assert api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "stories"}).status_code == 200
    with ChatLoad(server.url) as load:
        wait_for(lambda: len(load.statuses) >= 2)
        redis.stop()
        during = len(load.statuses)
        answers = {
            "list": api.get("/admin/models"),
            "load": api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "second"}),
            "unload": api.post("/admin/models/unload", json={"name": "second"}),
            "weights": api.get("/api/weights/checkpoints"),
            "health": httpx.get(f"{server.url}/api/health/detailed", timeout=60),
        }
        wait_for(lambda: len(load.statuses) >= during + 3)
        redis.start()
        wait_for(lambda: len(load.statuses) >= during + 6)
    assert {name: r.status_code for name, r in answers.items()} == dict.fromkeys(answers, 200)
    assert set(load.statuses) == {200}
    assert "Traceback" not in server.log()


def test_a_batch_created_while_redis_is_down_runs_once_it_is_back(server, api, redis, stories_hf_dir, tmp_path):
    assert api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "stories"}).status_code == 200
    worker = CeleryWorker(worker_env(server.env, broker_url=redis.url), tmp_path / "celery.log").start()
    try:
        # idle first: a worker that holds an unacknowledged message when Redis goes away exits (kombu cannot
        # restore the message without Redis; docs/batches.md), and a service manager would restart it
        wait_for(lambda: "resume_batches" in worker.log() and "succeeded" in worker.log(), timeout=120)
        wait_for(lambda: unacknowledged(redis.url) == 0)  # its ack can follow the "succeeded" line
        redis.stop()
        batch = make_batch(server.data_dir / "files", [chat_line(f"line-{i}") for i in range(20)])
        with pytest.raises(OperationalError):  # what the batch route meets: its run_batch message is not sent
            send_task(redis.url, "batches.run_batch", batch.id)
        redis.start()  # empty: nothing was persisted
        send_task(redis.url, "batches.resume_batches")  # what beat sends on its schedule
        batch = wait_for(lambda: ended(batch.id), timeout=300)
    finally:
        worker.kill()
    assert batch.status == BatchStatus.COMPLETED and (batch.completed_count, batch.failed_count) == (20, 0)
    output = output_lines(server.data_dir / "files", batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(f"line-{i}" for i in range(20))


def unacknowledged(url: str) -> int:
    """Messages a worker has taken and not yet acknowledged (kombu's Redis transport keeps them in "unacked")."""
    store = Redis.from_url(url)
    try:
        return store.hlen("unacked")
    finally:
        store.close()
