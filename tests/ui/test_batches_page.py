"""The batches page without a browser: who may see it, what each row says, paging and filtering, when the list polls,
and a cancel that cannot stop anything. The browser's view and a cancel that does are in test_browser.py."""

import html
import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from openai.types import Batch as OpenAIBatch

from admin_ui.views.batches import PAGE_SIZE
from batches.models import Batch, BatchStatus, FilePurpose
from batches.wire import batch_object
from pantheon_site.models import AuditEvent
from pantheon_site.tokens import do_create_token
from tests.ui.batch_data import make_batch, stored_file

pytestmark = pytest.mark.django_db


def _rows(response) -> dict[str, str]:
    """Each listed batch's row (its HTML), by batch id, in the page's order."""
    assert response.status_code == 200
    found = re.findall(r'<tr data-batch="([^"]+)">(.*?)</tr>', response.content.decode(), re.S)
    return dict(found)


def _link(response, rel: str) -> str | None:
    found = re.search(rf'<a href="([^"]*)" rel="{rel}">', response.content.decode())
    return html.unescape(found[1]) if found else None


@pytest.mark.parametrize("url", ["/ui/batches/", "/ui/batches/live/", "/ui/batches/?status=in_progress"])
def test_anonymous_visitors_and_non_staff_users_are_sent_to_sign_in(url):
    make_batch(BatchStatus.IN_PROGRESS)
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/ui/login/?next=/ui/batches/")
    visitor = Client()
    visitor.force_login(get_user_model().objects.create_user("pat", password="x" * 12, is_staff=False))
    assert visitor.get(url)["Location"].startswith("/ui/login/")


def test_a_batch_file_is_served_to_staff_under_ui_whatever_the_token_settings(operator, settings, tmp_path):
    settings.PANTHEON_FILES_DIR, settings.PANTHEON_REQUIRE_CLIENT_TOKENS = tmp_path, True
    output = stored_file(FilePurpose.BATCH_OUTPUT)
    (tmp_path / output.id).write_bytes(b'{"custom_id": "a"}\n')
    url = reverse("ui:batch-file", args=[output.id])
    served = operator.get(url)
    assert served.status_code == 200 and b"".join(served.streaming_content) == b'{"custom_id": "a"}\n'
    assert served["Content-Type"] == "application/jsonl"
    assert operator.get(reverse("ui:batch-file", args=["file-missing"])).status_code == 404
    anonymous = Client().get(url)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/ui/login/")


def test_an_anonymous_cancel_is_sent_to_sign_in_and_changes_nothing():
    batch = make_batch(BatchStatus.IN_PROGRESS)
    response = Client().post(reverse("ui:batch-cancel"), {"batch_id": batch.id})
    assert response.status_code == 302 and response["Location"].startswith("/ui/login/")
    assert Batch.objects.get(pk=batch.id).status == BatchStatus.IN_PROGRESS
    assert not AuditEvent.objects.filter(operation="batch_cancel").exists()


def test_the_batch_object_is_the_one_the_openai_package_reads():
    token = do_create_token("client", "app")[0]
    output = stored_file(FilePurpose.BATCH_OUTPUT)
    batch = make_batch(
        BatchStatus.COMPLETED, total=4, completed=3, failed=1, owner=token, output_file=output,
        metadata={"run": "eval-7"}, completed_at=timezone.now(),
    )  # fmt: skip
    parsed = OpenAIBatch.model_validate(batch_object(batch))
    assert (parsed.id, parsed.status, parsed.output_file_id, parsed.error_file_id) == (
        batch.id, "completed", output.id, None
    )  # fmt: skip
    counts = parsed.request_counts
    assert (counts.total, counts.completed, counts.failed) == (4, 3, 1)
    assert parsed.created_at == int(batch.created_at.timestamp()) and parsed.completed_at is not None
    assert parsed.metadata == {"run": "eval-7"} and parsed.errors is None

    refused = make_batch(
        BatchStatus.FAILED,
        errors={"object": "list", "data": [{"code": "invalid_json_line", "message": "bad", "line": 3}]},
    )
    assert OpenAIBatch.model_validate(batch_object(refused)).errors.data[0].line == 3


def test_each_row_shows_its_status_counts_progress_and_a_cancel_only_where_it_stops_something(operator):
    running = make_batch(BatchStatus.IN_PROGRESS, total=8, completed=3, failed=1, waiting_reason="weights_held")
    checking = make_batch(BatchStatus.VALIDATING, total=0)
    files = {"output_file": stored_file(FilePurpose.BATCH_OUTPUT), "error_file": stored_file(FilePurpose.BATCH_OUTPUT)}
    done = make_batch(BatchStatus.COMPLETED, total=5, completed=4, failed=1, **files)
    refused = make_batch(
        BatchStatus.FAILED,
        total=0,
        errors={"object": "list", "data": [{"code": "invalid_json_line", "message": "not JSON", "line": 2}]},
    )
    rows = _rows(operator.get(reverse("ui:batches")))
    assert list(rows) == [refused.id, done.id, checking.id, running.id]  # newest first

    assert "in_progress" in rows[running.id] and "waiting: weights_held" in rows[running.id]
    assert "3 / 1 / 8" in rows[running.id] and 'aria-valuenow="50"' in rows[running.id]
    assert 'aria-valuenow="0"' in rows[checking.id]
    assert "4 / 1 / 5" in rows[done.id] and 'aria-valuenow="100"' in rows[done.id]
    assert f'href="/ui/batches/files/{done.output_file_id}/"' in rows[done.id]
    assert f'href="/ui/batches/files/{done.error_file_id}/"' in rows[done.id]
    assert "line 2: not JSON" in rows[refused.id]
    cancellable = {batch_id for batch_id, row in rows.items() if ">Cancel</button>" in row}
    assert cancellable == {running.id, checking.id}


def test_the_list_polls_while_a_batch_is_at_work_and_stops_once_none_is(operator):
    batch = make_batch(BatchStatus.COMPLETED)
    assert 'hx-trigger="every' not in operator.get(reverse("ui:batches")).content.decode()
    Batch.objects.filter(pk=batch.pk).update(status=BatchStatus.FINALIZING)
    live = operator.get(reverse("ui:batches-live")).content.decode()
    assert f'hx-get="{reverse("ui:batches-live")}" hx-trigger="every 2s"' in live and '<nav class="top">' not in live
    Batch.objects.filter(pk=batch.pk).update(status=BatchStatus.CANCELLED)
    assert 'hx-trigger="every' not in operator.get(reverse("ui:batches-live")).content.decode()


def test_paging_walks_to_older_batches_without_repeats_and_keeps_the_status_filter(operator):
    # Ten share one creation time (the cursor breaks the tie by id); a full page and 5 more match the filter.
    same_time = timezone.now()
    running = [make_batch(BatchStatus.IN_PROGRESS, age_s=i) for i in range(PAGE_SIZE - 5)]
    running += [make_batch(BatchStatus.IN_PROGRESS, created_at=same_time) for _ in range(10)]
    for i in range(3):
        make_batch(BatchStatus.COMPLETED, age_s=i + 0.5)
    newest_first = Batch.objects.filter(status="in_progress").order_by("-created_at", "-id")
    expected = list(newest_first.values_list("id", flat=True))
    first = operator.get(reverse("ui:batches"), {"status": "in_progress"})
    assert list(_rows(first)) == expected[:PAGE_SIZE] and _link(first, "first") is None
    second = operator.get(_link(first, "next"))
    assert list(_rows(second)) == expected[PAGE_SIZE:] and _link(second, "next") is None
    assert list(_rows(operator.get(_link(second, "first")))) == expected[:PAGE_SIZE]
    assert len(set(expected)) == len(running) == PAGE_SIZE + 5


@pytest.mark.parametrize("query", [{"status": "running"}, {"after": "batch_nothing"}])
def test_a_status_or_cursor_it_cannot_read_shows_why_over_an_empty_list(operator, query):
    make_batch(BatchStatus.IN_PROGRESS)
    response = operator.get(reverse("ui:batches"), query)
    assert _rows(response) == {}
    assert 'class="notice error"' in response.content.decode() and "No batches" in response.content.decode()


def test_cancelling_a_batch_that_ended_is_refused_in_words_audited_and_changes_nothing(operator):
    batch = make_batch(BatchStatus.COMPLETED, total=2, completed=2)
    page = operator.post(reverse("ui:batch-cancel"), {"batch_id": batch.id}).content.decode()
    assert f"batch {batch.id} is completed and cannot be cancelled" in page and "notice error" in page
    assert Batch.objects.get(pk=batch.id).status == BatchStatus.COMPLETED
    event = AuditEvent.objects.get(operation="batch_cancel")
    assert (event.outcome, event.actor_kind, event.actor_label) == ("refused", "user", "olga")
    assert event.details["batch_id"] == batch.id and event.reason == "batch_ended"
