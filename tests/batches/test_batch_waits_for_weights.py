"""A batch whose model's weights a trainer holds does not fail its lines: it waits with `waiting_reason`
weights_held, records nothing meanwhile, and once the trainer resumes it runs every line to completed (a real server,
a trainer attached over the weights routes, a real Celery worker on Redis)."""

from __future__ import annotations

import pytest

from batches.models import Batch, BatchStatus
from tests.batches.runner_batches import BATCH_REDIS_URL, chat_line, ended, make_batch, recorded, send_task
from tests.inference.serving import wait_for
from tests.inference.session_turns import load
from tests.weights.weights_calls import Holder, new_token

pytestmark = pytest.mark.django_db(transaction=True)

LINES = 12


@pytest.fixture(scope="module")
def server(start_server):  # noqa: F811
    return start_server(WEIGHTS_HOLD_TIMEOUT_S="300")  # the hold lasts until the test resumes it


def test_a_held_models_batch_waits_as_weights_held_and_completes_once_resumed(api, server, stories_hf_dir,
                                                                              start_worker):  # fmt: skip
    trainer = Holder(server, new_token("trainer", "batch-trainer"))  # before the load: it loads attachable
    load(api, stories_hf_dir, "stories")
    trainer.attach(model="stories")
    try:
        trainer.ok("quiesce")
        batch = make_batch(server.data_dir / "files", [chat_line(f"line-{i}", max_tokens=8) for i in range(LINES)])
        start_worker()
        send_task(BATCH_REDIS_URL, "batches.run_batch", batch.id)
        wait_for(lambda: Batch.objects.get(pk=batch.id).waiting_reason == "weights_held", timeout=120)
        held = Batch.objects.get(pk=batch.id)
        assert held.status == BatchStatus.IN_PROGRESS and recorded(batch.id) == 0
        trainer.ok("resume")
        done = wait_for(lambda: ended(batch.id), timeout=300)
    finally:
        trainer.detach()
    assert (done.status, done.completed_count, done.failed_count) == (BatchStatus.COMPLETED, LINES, 0)
    assert done.waiting_reason == "" and done.error_file_id is None
