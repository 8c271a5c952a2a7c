"""The Files and Batch APIs on a running server (`manage.py serve`, Celery's broker a real Redis), through the
`openai` package: files uploaded, listed, read back and deleted; a batch created with one line row per request
and its Celery task sent to Redis (not run: no Celery worker consumes this test's queue); listed, retrieved and
cancelled. Also: an upload may exceed PANTHEON_MAX_BODY_BYTES up to PANTHEON_FILE_MAX_BYTES, and a broker that
cannot be reached does not fail a batch's creation."""

from __future__ import annotations

import base64
import json
import os

import httpx
import openai
import pytest
import redis

from batches.models import Batch, BatchLine
from tests.batches.conftest import jsonl, request_line
from tests.inference.conftest import serving_db, start_server  # noqa: F401  (the fixtures)
from tests.inference.serving import free_port, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_URL = os.environ.get("PANTHEON_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")
QUEUE = "celery"  # Celery's default queue, a Redis list of the messages sent
BODY_LIMIT = 64 * 1024
FILE_LIMIT = 256 * 1024
LINES = [request_line(f"req-{i}") for i in range(5)]


@pytest.fixture(scope="module")
def queue():
    """The Redis list the server's Celery tasks are sent to, empty at the start and end of each module."""
    store = redis.Redis.from_url(REDIS_URL)
    store.delete(QUEUE)
    yield store
    store.delete(QUEUE)


@pytest.fixture(scope="module")
def server(start_server, queue):  # noqa: F811
    return start_server(
        REDIS_URL=REDIS_URL, PANTHEON_MAX_BODY_BYTES=str(BODY_LIMIT), PANTHEON_FILE_MAX_BYTES=str(FILE_LIMIT)
    )


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0)


def sent_batches(queue) -> list[str]:
    """The batch ids of the run_batch tasks waiting in the queue."""
    ids = []
    for raw in queue.lrange(QUEUE, 0, -1):
        message = json.loads(raw)
        assert message["headers"]["task"] == "batches.run_batch"
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        ids.append(args[0])
    return ids


def test_files_through_the_openai_package(sdk):
    content = jsonl(*LINES)
    created = sdk.files.create(file=("requests.jsonl", content), purpose="batch")
    assert isinstance(created, openai.types.FileObject)
    assert (created.bytes, created.filename, created.purpose) == (len(content), "requests.jsonl", "batch")
    assert sdk.files.retrieve(created.id) == created
    assert created.id in [f.id for f in sdk.files.list(purpose="batch")]
    assert sdk.files.content(created.id).content == content
    deleted = sdk.files.delete(created.id)
    assert (deleted.id, deleted.deleted) == (created.id, True)
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(created.id)


def test_a_malformed_upload_is_a_bad_request_naming_the_line(sdk):
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.files.create(file=("bad.jsonl", jsonl(LINES[0], "{oops")), purpose="batch")
    assert refused.value.param == "file" and refused.value.code == "invalid_json_line"
    assert "line 2" in refused.value.message


def test_a_batch_through_the_openai_package_records_its_lines_and_sends_its_task(sdk, queue):
    content = jsonl(*LINES)
    input_file = sdk.files.create(file=("requests.jsonl", content), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=input_file.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"run": "1"}
    )
    assert isinstance(batch, openai.types.Batch)
    assert batch.status == "validating" and batch.input_file_id == input_file.id and batch.metadata == {"run": "1"}
    assert batch.request_counts.total == len(LINES) and batch.errors is None
    assert batch.model_extra["waiting_reason"] is None
    assert batch.expires_at == batch.created_at + 24 * 3600

    rows = list(BatchLine.objects.filter(batch_id=batch.id).order_by("number"))
    assert [(r.number, r.custom_id, r.state) for r in rows] == [
        (i + 1, line["custom_id"], "pending") for i, line in enumerate(LINES)
    ]
    assert [json.loads(content[r.offset : r.offset + r.length]) for r in rows] == LINES
    assert wait_for(lambda: batch.id in sent_batches(queue))

    assert sdk.batches.retrieve(batch.id) == batch
    assert batch.id in [b.id for b in sdk.batches.list()]
    cancelled = sdk.batches.cancel(batch.id)
    assert cancelled.status == "cancelling" and cancelled.cancelling_at is not None
    with pytest.raises(openai.BadRequestError) as in_use:
        sdk.files.delete(input_file.id)
    assert in_use.value.code == "file_in_use"


def test_a_bad_batch_through_the_openai_package(sdk, queue):
    input_file = sdk.files.create(file=("requests.jsonl", jsonl(*LINES, LINES[0])), purpose="batch")
    failed = sdk.batches.create(input_file_id=input_file.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert failed.status == "failed" and failed.failed_at is not None
    [error] = failed.errors.data
    assert (error.code, error.line, error.param) == ("duplicate_custom_id", len(LINES) + 1, "custom_id")
    assert failed.id not in sent_batches(queue)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.batches.create(input_file_id=input_file.id, endpoint="/v1/responses", completion_window="24h")
    assert refused.value.param == "endpoint"


def test_batches_page_through_the_openai_package(sdk):
    input_file = sdk.files.create(file=("requests.jsonl", jsonl(*LINES)), purpose="batch")
    made = [
        sdk.batches.create(input_file_id=input_file.id, endpoint="/v1/chat/completions", completion_window="24h").id
        for _ in range(3)
    ]
    first = sdk.batches.list(limit=2)
    assert [b.id for b in first.data] == made[::-1][:2] and first.has_more
    walked = [b.id for b in sdk.batches.list(limit=2)]  # the SDK follows `after` page by page
    assert walked[:3] == made[::-1] and len(walked) == Batch.objects.count()


def test_an_upload_may_pass_the_body_limit_up_to_the_file_limit(server):
    line = json.dumps(request_line("x", body={"prompt": "y" * 1000})).encode() + b"\n"
    within = line * (FILE_LIMIT // len(line))  # over PANTHEON_MAX_BODY_BYTES, within PANTHEON_FILE_MAX_BYTES
    assert BODY_LIMIT < len(within) <= FILE_LIMIT
    files = {"purpose": (None, "batch")}
    accepted = httpx.post(server.url + "/v1/files", files={**files, "file": ("f.jsonl", within)}, timeout=60)
    assert accepted.status_code == 200, accepted.text
    for over in (within + line * 2, within * 2):  # over the file limit: just (read and refused) and far (not read)
        refused = httpx.post(server.url + "/v1/files", files={**files, "file": ("f.jsonl", over)}, timeout=60)
        assert refused.status_code == 413 and "PANTHEON_FILE_MAX_BYTES" in refused.json()["error"]["message"]
    too_big_json = httpx.post(server.url + "/v1/batches", content=b" " * (BODY_LIMIT + 1), timeout=60)
    assert too_big_json.status_code == 413 and "PANTHEON_MAX_BODY_BYTES" in too_big_json.json()["error"]["message"]


def test_a_broker_that_cannot_be_reached_does_not_fail_the_creation(start_server):  # noqa: F811
    server = start_server(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0)
    input_file = sdk.files.create(file=("requests.jsonl", jsonl(*LINES)), purpose="batch")
    batch = sdk.batches.create(input_file_id=input_file.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "validating" and BatchLine.objects.filter(batch_id=batch.id).count() == len(LINES)
    assert sdk.batches.retrieve(batch.id).status == "validating"
    assert wait_for(lambda: "could not be sent" in server.log())
