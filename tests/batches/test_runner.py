"""A batch run by a real Celery worker against a real server: every line answered once, in order, into OpenAI's
output and error files; a worker killed mid-batch, a cancel, and a server restart in the middle of one."""

from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest

from batches.models import Batch, BatchLine, BatchStatus, FilePurpose, LineState, StoredFile
from batches.services import do_cancel_batch
from tests.batches.runner_batches import (
    BATCH_REDIS_URL,
    chat_line,
    ended,
    make_batch,
    output_lines,
    recorded,
    send_task,
)
from tests.inference.serving import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def files_of(server, batch: Batch) -> tuple[list[dict], list[dict]]:
    files = server.data_dir / "files"
    return output_lines(files, batch.output_file_id), output_lines(files, batch.error_file_id)


def long_batch(server, count: int = 60):
    """A batch whose lines take long enough that a test can act while some are recorded and some are not."""
    return make_batch(server.data_dir / "files", [chat_line(f"line-{i}", max_tokens=200) for i in range(count)])


def test_a_batch_answers_every_line_once_and_fails_only_its_bad_lines(server, models, start_worker):
    lines = [chat_line(f"req-{i}", model=models[i % 2]) for i in range(38)]
    lines.insert(5, chat_line("unknown-model", model="no-such-model"))
    lines.insert(20, {"custom_id": "bad-body", "method": "POST", "url": "/v1/chat/completions", "body": "hello"})
    batch = make_batch(server.data_dir / "files", lines)
    start_worker()
    send_task(BATCH_REDIS_URL, "batches.run_batch", batch.id)
    batch = wait_for(lambda: ended(batch.id), timeout=300)

    assert batch.status == BatchStatus.COMPLETED and batch.completed_at and batch.finalizing_at
    assert (batch.total_count, batch.completed_count, batch.failed_count) == (40, 38, 2)
    output, errors = files_of(server, batch)
    assert Counter(line["custom_id"] for line in output + errors) == Counter(line["custom_id"] for line in lines)
    assert [line["custom_id"] for line in output] == [line["custom_id"] for line in lines if line["custom_id"]
                                                      not in ("unknown-model", "bad-body")]  # fmt: skip
    # each answer names the weights that produced it, as a direct call to the same model does
    for name in models:
        direct = httpx.post(f"{server.url}/v1/chat/completions", json=chat_line("x", model=name)["body"], timeout=60)
        served = {line["response"]["headers"]["X-miLLM-Model"] for line in output
                  if line["response"]["body"]["model"] == name}  # fmt: skip
        assert served == {direct.headers["X-miLLM-Model"]}
    assert all(line["response"]["status_code"] == 200 and line["error"] is None for line in output)
    assert all(line["response"]["body"]["object"] == "chat.completion" for line in output)
    assert len({line["response"]["request_id"] for line in output}) == 38
    by_id = {line["custom_id"]: line for line in errors}
    assert by_id["unknown-model"]["response"]["status_code"] == 404
    assert by_id["unknown-model"]["response"]["body"]["error"]["type"] == "model_not_found"
    assert by_id["bad-body"]["response"] is None and by_id["bad-body"]["error"]["code"] == "invalid_body"
    # one send per line, and the files as OpenAI's: purpose batch_output, their line counts
    assert set(
        BatchLine.objects.filter(batch=batch).exclude(custom_id="bad-body").values_list("attempts", flat=True)
    ) == {1}
    stored = StoredFile.objects.filter(pk__in=[batch.output_file_id, batch.error_file_id])
    assert sorted(stored.values_list("purpose", "line_count")) == [(FilePurpose.BATCH_OUTPUT, 2),
                                                                   (FilePurpose.BATCH_OUTPUT, 38)]  # fmt: skip
    assert batch.waiting_reason == "" and batch.lease_owner == ""


def test_a_worker_killed_mid_batch_is_replaced_and_no_recorded_line_runs_again(server, models, start_worker):
    batch = long_batch(server)
    worker = start_worker(PANTHEON_BATCH_LEASE_S="3")
    send_task(BATCH_REDIS_URL, "batches.run_batch", batch.id)
    wait_for(lambda: recorded(batch.id) >= 8, timeout=300, interval=0.01)
    worker.kill()
    before = set(BatchLine.objects.filter(batch=batch).exclude(state=LineState.PENDING).values_list("id", flat=True))
    assert 8 <= len(before) < 60  # killed in the middle

    start_worker(PANTHEON_BATCH_LEASE_S="3")  # no message is sent: the new worker finds the batch itself
    batch = wait_for(lambda: ended(batch.id), timeout=300)
    assert batch.status == BatchStatus.COMPLETED and (batch.completed_count, batch.failed_count) == (60, 0)
    attempts = dict(BatchLine.objects.filter(batch=batch).values_list("id", "attempts"))
    assert {attempts[line_id] for line_id in before} == {1}  # recorded before the kill: never sent again
    assert set(attempts.values()) <= {1, 2}  # a line in flight at the kill was sent once more, no line more often
    output, errors = files_of(server, batch)
    assert errors == [] and Counter(line["custom_id"] for line in output) == Counter(f"line-{i}" for i in range(60))


def test_cancel_lets_the_lines_in_flight_finish_and_starts_no_other(server, models, start_worker):
    batch = long_batch(server)
    start_worker(PANTHEON_BATCH_LINES_IN_FLIGHT="2")
    send_task(BATCH_REDIS_URL, "batches.run_batch", batch.id)
    wait_for(lambda: recorded(batch.id) >= 4, timeout=300, interval=0.01)
    do_cancel_batch(batch.id, None)
    started_before = BatchLine.objects.filter(batch=batch, attempts__gt=0).count()

    batch = wait_for(lambda: ended(batch.id), timeout=300)
    assert batch.status == BatchStatus.CANCELLED and batch.cancelled_at and batch.completed_at is None
    started = BatchLine.objects.filter(batch=batch, attempts__gt=0)
    # at most the lines whose start was decided as the cancel landed (the in-flight limit) started after it
    assert started.count() <= started_before + 2 and started.count() < 30
    assert not started.filter(state=LineState.PENDING).exists()  # every line that started finished and was recorded
    output, errors = files_of(server, batch)
    assert errors == [] and [line["custom_id"] for line in output] == list(
        started.order_by("number").values_list("custom_id", flat=True)
    )
    assert batch.completed_count == len(output)


def test_a_server_restart_mid_batch_makes_the_lines_wait_then_finish(server, models, start_worker):
    batch = long_batch(server)
    start_worker()
    send_task(BATCH_REDIS_URL, "batches.run_batch", batch.id)
    wait_for(lambda: recorded(batch.id) >= 4, timeout=300, interval=0.01)
    server.stop()
    wait_for(lambda: Batch.objects.get(pk=batch.id).waiting_reason == "server_unavailable", timeout=60)
    before = set(BatchLine.objects.filter(batch=batch).exclude(state=LineState.PENDING).values_list("id", flat=True))
    assert len(before) < 60

    time.sleep(2)  # a while with no server: the lines wait, none is recorded (as failed or otherwise)
    assert recorded(batch.id) == len(before)

    server.start()  # a new run (a new local credential in the run file) that loads its catalogued models again
    batch = wait_for(lambda: ended(batch.id), timeout=300)
    assert batch.status == BatchStatus.COMPLETED and (batch.completed_count, batch.failed_count) == (60, 0)
    assert batch.waiting_reason == ""
    output, errors = files_of(server, batch)
    assert errors == [] and Counter(line["custom_id"] for line in output) == Counter(f"line-{i}" for i in range(60))
    attempts = dict(BatchLine.objects.filter(batch=batch).values_list("id", "attempts"))
    assert {attempts[line_id] for line_id in before} == {1}
