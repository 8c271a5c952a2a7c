"""The runner's steps on the real database, without a server: the lease, a line recorded once, the files written
once, expiry and a cancel before any line ran (batches/lease.py, line_records.py, batch_files.py, runner.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from batches.lease import release_lease, renew_lease, take_lease
from batches.line_records import answer_line, count_attempt, record_line
from batches.models import Batch, BatchLine, BatchStatus, LineState, StoredFile
from batches.runner import run_batch
from batches.sweep import held_batches, unrun_batches
from batches.tasks import expire_batches
from tests.batches.runner_batches import chat_line, make_batch, output_lines

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def files_dir():
    return settings.PANTHEON_FILES_DIR


def three_lines(files_dir, **kwargs) -> Batch:
    return make_batch(files_dir, [chat_line(f"c{i}") for i in range(3)], **kwargs)


def test_one_task_holds_a_batch_and_a_dead_ones_lease_is_taken_over(files_dir):
    batch = three_lines(files_dir)
    assert take_lease(batch.id, "first") and not take_lease(batch.id, "second")
    assert renew_lease(batch.id, "first")
    Batch.objects.filter(pk=batch.id).update(lease_until=timezone.now() - timedelta(seconds=1))  # first stopped
    assert take_lease(batch.id, "second")
    assert not renew_lease(batch.id, "first")  # the old task learns it lost the batch, and stops
    release_lease(batch.id, "first")  # changes nothing: not its lease any more
    assert Batch.objects.get(pk=batch.id).lease_owner == "second"
    assert not take_lease("batch_missing", "third")


def test_a_sweep_finds_every_active_batch_either_unrun_or_held(files_dir):
    """At a worker's start every active batch is resumed now (its lease is free) or once its lease runs out (held):
    a lease running out between the sweep's two questions must not leave a batch in neither."""
    now = timezone.now()
    leases = {"never": None, "ran out": now - timedelta(microseconds=1), "runs out now": now,
              "held": now + timedelta(seconds=30)}  # fmt: skip
    batches = {}
    for name, until in leases.items():
        batch = three_lines(files_dir)
        Batch.objects.filter(pk=batch.id).update(lease_owner="" if until is None else "a task", lease_until=until)
        batches[batch.id] = name
    unrun, held = unrun_batches(now), dict(held_batches(now))
    assert sorted(batches[b] for b in unrun) == ["never", "ran out"]
    assert sorted(batches[b] for b in held) == ["held", "runs out now"]
    assert [seconds for b, seconds in held.items() if batches[b] == "runs out now"] == [0.0]


def test_a_line_is_recorded_and_counted_once(files_dir):
    batch = three_lines(files_dir)
    line = batch.lines.get(number=2)
    assert count_attempt(line.id)
    answer = answer_line(line.custom_id, 200, "r1", '"stories"', {"object": "chat.completion"})
    assert record_line(batch.id, line.id, answer, True)
    assert not record_line(batch.id, line.id, answer_line(line.custom_id, 500, "r2", None, {}), False)
    assert not count_attempt(line.id)  # a recorded line is never sent again
    line.refresh_from_db()
    batch.refresh_from_db()
    assert (line.state, line.attempts, line.result["response"]["request_id"]) == (LineState.SUCCEEDED, 1, "r1")
    assert (batch.completed_count, batch.failed_count) == (1, 0)


def test_a_batch_past_its_window_expires_reporting_the_lines_not_run(files_dir):
    batch = three_lines(files_dir)
    first = batch.lines.get(number=1)
    record_line(batch.id, first.id, answer_line(first.custom_id, 200, "r1", None, {}), True)
    Batch.objects.filter(pk=batch.id).update(status=BatchStatus.IN_PROGRESS, expires_at=timezone.now())
    expire_batches()  # the periodic task: no server is needed, no line is sent
    batch.refresh_from_db()
    assert batch.status == BatchStatus.EXPIRED and batch.expired_at and batch.completed_at is None
    assert (batch.completed_count, batch.failed_count) == (1, 2)
    assert [line["custom_id"] for line in output_lines(files_dir, batch.output_file_id)] == ["c0"]
    errors = output_lines(files_dir, batch.error_file_id)
    assert [(e["custom_id"], e["response"], e["error"]["code"]) for e in errors] == [
        ("c1", None, "batch_expired"), ("c2", None, "batch_expired")]  # fmt: skip
    assert set(batch.lines.values_list("attempts", flat=True)) == {0}


def test_finalizing_again_after_a_kill_writes_no_second_file(files_dir):
    batch = three_lines(files_dir)
    for line in batch.lines.all():
        record_line(batch.id, line.id, answer_line(line.custom_id, 200, "r", None, {"n": line.number}), True)
    Batch.objects.filter(pk=batch.id).update(status=BatchStatus.FINALIZING, finalizing_at=timezone.now())
    run_batch(batch.id)
    first = Batch.objects.get(pk=batch.id)
    Batch.objects.filter(pk=batch.id).update(status=BatchStatus.FINALIZING)  # as if killed before the status
    run_batch(batch.id)
    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED and batch.output_file_id == first.output_file_id
    assert batch.error_file_id is None  # no failed line: no error file, as OpenAI's
    assert StoredFile.objects.filter(purpose="batch_output").count() == 1
    assert [line["response"]["body"]["n"] for line in output_lines(files_dir, batch.output_file_id)] == [1, 2, 3]
    run_batch(batch.id)  # an ended batch: a stale message is a no-op
    assert Batch.objects.get(pk=batch.id).completed_at == batch.completed_at


def test_a_batch_cancelled_before_it_ran_ends_cancelled_with_no_file(files_dir):
    batch = three_lines(files_dir)
    Batch.objects.filter(pk=batch.id).update(status=BatchStatus.CANCELLING, cancelling_at=timezone.now())
    run_batch(batch.id)
    batch.refresh_from_db()
    assert batch.status == BatchStatus.CANCELLED and batch.cancelled_at
    assert (batch.output_file_id, batch.error_file_id) == (None, None)
    assert not BatchLine.objects.filter(batch=batch, attempts__gt=0).exists()
